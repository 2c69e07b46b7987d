"""A Mamba group's rules: vLLM's ``MambaManager``, in ``mamba_cache_mode`` ``none`` and
``align``.

In ``align`` mode a group keeps one state per block boundary. Its hit is the one cached
state block nearest the candidate length, searched from the right, the places before it
null; it never drops a block (drafters have no Mamba layers), so it gets no margin
either. It asks for the state blocks of the main model's tokens and its speculative
blocks (no lookahead slots), at most one a step (one plus the speculative blocks the
first time); running, it frees every real block before the last state's, then the state
block of two steps ago, and moves the speculative blocks left behind to the table's
end. It caches the state blocks it holds (as ``prefix_cache_retention_interval`` retains
them) and the prompt's last reusable state (``_cache_partial_tail_block``). With prefill
checkpoint blocks (``mamba_prefill_checkpoint_blocks``) the chunk ending the prefill
saves the prompt's reusable state inside it, in a place the group reserves just before
the running state's, keyed there (``_cache_checkpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..prefix_cache import BlockPool
from ..state import GroupBlocks, RequestState
from ..violations import UnmirroredVllmCrash
from .blocks import NULL_BLOCK, T, cdiv, group_key
from .single_type import CachingCoordinator, HitLookup, Hits, SingleTypeKVCacheManager


@dataclass(frozen=True, slots=True)
class MambaManager(SingleTypeKVCacheManager):
    """``MambaManager`` with ``mamba_cache_mode`` ``none``: only the last
    computed token's state is kept, and ``num_speculative_blocks`` (vLLM sets it to
    ``K``) more blocks hold the drafts' states."""

    num_speculative_blocks: int = 0

    def num_tokens(self, num_tokens: int) -> int:
        return num_tokens + self.block_size * self.num_speculative_blocks

    @property
    def blocks_bound_slots(self) -> bool:
        return False

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    def num_processed_to_skip(self, num_blocks: int) -> int:
        return num_blocks * self.block_size + 1

    @property
    def holds_states(self) -> bool:
        return True

    def drop_margin(self) -> int:
        """None: drafters have no Mamba layers, so a Mamba hit never drops a block."""
        return 0

    def find_longest_cache_hit(
        self, lookup: HitLookup, max_length: int, drop: bool, scheduler_block_size: int
    ) -> Hits:
        """``MambaManager.find_longest_cache_hit``, from the right: the one cached state
        block nearest ``max_length``, the places before it null; never a drop."""
        self._check_hashes_reach(lookup, max_length)
        block_size = self.block_size
        for place in range(max_length // block_size - 1, -1, -1):
            found = lookup.cached_at(place)
            if found is not None:
                return [[NULL_BLOCK] * place + [block] for block in found], (place + 1) * block_size
        return [[] for _ in lookup.group_ids], 0


@dataclass(frozen=True, slots=True)
class MambaAlignManager(MambaManager):
    """``MambaManager`` with ``mamba_cache_mode`` ``align``: a state per block boundary,
    written where a chunk ends (the scheduler splits chunks there), the table padded
    with null blocks up to the running state's block; lookahead slots are not counted,
    and a request takes at most one block a step (plus its speculative blocks at
    first). Whether a step reserves a prefill checkpoint's place
    (``mamba_prefill_checkpoint_blocks``) is the coordinator's to say
    (``_reserve_checkpoint``): a ``checkpoint`` here, ``GroupBlocks.checkpoint_position``
    in ``allocate_new_blocks``.

    Its rules act on any block table whose null places are falsy: ``GroupBlocks.table``
    here, the pool's block ids (``GroupBlocks.block_ids``) in the coordinator with
    caching."""

    def num_new_states(
        self,
        blocks: GroupBlocks,
        num_places: int,
        num_tokens_main_model: int,
        checkpoint: bool = False,
    ) -> int:
        """``get_num_blocks_to_allocate``'s count past ``num_places`` (the table and a
        hit): the state blocks of the main model's tokens and the speculative blocks, at
        most one a step (one plus the speculative blocks the first time, one more with a
        prefill ``checkpoint``). vLLM returns a negative count as it is (the coordinator
        sums it): a table longer than needed lowers what the other groups are asked."""
        num_new = (
            cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks - num_places
        )
        if num_new > 0:
            cap = (1 if blocks.allocated else 1 + self.num_speculative_blocks) + checkpoint
            num_new = min(num_new, cap)
        return num_new

    def place_states(
        self,
        blocks: GroupBlocks,
        table: list[T],
        null: T,
        num_tokens_main_model: int,
        checkpoint: bool = False,
    ) -> tuple[int, list[T]]:
        """``allocate_new_blocks`` up to taking blocks: the previous state's place is
        remembered (a hit's block, the first time), ``table`` is padded with ``null`` up
        to the new running state's place (short of the place a prefill ``checkpoint``
        writes, just before it), and the speculative blocks the running state leaves
        behind move to its end (``_relocate_speculative_block``), but one at the
        checkpoint's place. Returns how many blocks to take and the blocks moved."""
        num_spec = self.num_speculative_blocks
        required = cdiv(num_tokens_main_model, self.block_size) + num_spec
        allocated = blocks.allocated
        blocks.allocated = True
        if required <= len(table) and not checkpoint:
            return 0, []
        prev = len(table)
        if allocated:
            blocks.last_state_block_idx = prev - 1 - num_spec
        elif prev > 0:
            blocks.last_state_block_idx = prev - 1
        # The running state's place; a checkpoint's is the one before it.
        num_skipped = required - num_spec - 1 - checkpoint
        if prev < num_skipped:
            table += [null] * (num_skipped - prev)
        moved: list[T] = []
        if allocated:
            for index in range(prev - num_spec, min(prev, num_skipped)):
                moved.append(table[index])
                table.append(table[index])
                table[index] = null
        return max(required - len(table), 0), moved

    def retire_states(
        self, blocks: GroupBlocks, table: list[T], null: T, processed_computed_tokens: int
    ) -> tuple[list[T], list[T]]:
        """``remove_skipped_blocks``: every real block before the last state's
        (``_remove_blocks_in_range`` skips the null gaps and remembers how far it
        retired), last first, then the state block of two steps ago once the processed
        tokens are past it; their places become ``null``. Returns the two apart: vLLM
        frees them in two calls."""
        retired: list[T] = []
        skipped_tokens = processed_computed_tokens - 1
        if skipped_tokens > 0:
            first = blocks.num_retired_blocks
            last = min(skipped_tokens // self.block_size, len(table))
            if first < last:
                retired = [table[index] for index in range(last - 1, first - 1, -1) if table[index]]
                table[first:last] = [null] * (last - first)
                blocks.num_retired_blocks = last
        last_state = blocks.last_state_block_idx
        state: list[T] = []
        if (
            0 <= last_state < cdiv(processed_computed_tokens, self.block_size) - 1
            and table[last_state]
        ):
            state.append(table[last_state])
            table[last_state] = null
        return retired, state

    def remove_skipped_blocks(self, blocks: GroupBlocks, processed_computed_tokens: int) -> int:
        retired, state = self.retire_states(blocks, blocks.table, False, processed_computed_tokens)
        return len(retired) + len(state)

    def num_blocks_to_allocate(
        self,
        blocks: GroupBlocks,
        num_tokens: int,
        num_tokens_main_model: int,
        total_computed_tokens: int,
        admission: bool,
        checkpoint: bool = False,
    ) -> int:
        return self.num_new_states(blocks, len(blocks.table), num_tokens_main_model, checkpoint)

    def allocate_new_blocks(
        self, blocks: GroupBlocks, num_tokens: int, num_tokens_main_model: int
    ) -> int:
        checkpoint = blocks.checkpoint_position > 0
        num_new, _ = self.place_states(
            blocks, blocks.table, False, num_tokens_main_model, checkpoint
        )
        blocks.table += [True] * num_new
        return num_new

    @property
    def reserves_prefill_checkpoint(self) -> bool:
        return True

    def checkpoint_place_free(self, blocks: GroupBlocks, table: list[T], place: int) -> bool:
        """A checkpoint's place holds no block yet, or one of the speculative blocks the
        running state leaves behind (``place_states`` moves them)."""
        return (
            place >= len(table)
            or not table[place]
            or (blocks.allocated and place >= len(table) - self.num_speculative_blocks)
        )

    def num_blocks_to_allocate_cached(
        self,
        pool: BlockPool,
        blocks: GroupBlocks,
        hit: tuple[int, ...],
        num_tokens: int,
        num_tokens_main_model: int,
        total_computed_tokens: int,
        admission: bool,
        checkpoint: bool = False,
    ) -> int:
        """``MambaManager.get_num_blocks_to_allocate`` on block ids: the new states past
        the table and the hit (``num_new_states``), plus the hit blocks a touch takes off
        the free queue."""
        num_new = self.num_new_states(
            blocks, len(hit) + len(blocks.block_ids), num_tokens_main_model, checkpoint
        )
        return num_new + sum(1 for block in hit if block and pool.ref_cnt[block] == 0)

    def num_new_block_ids(
        self, pool: BlockPool, blocks: GroupBlocks, num_tokens: int, num_tokens_main_model: int
    ) -> int:
        """``MambaManager.allocate_new_blocks`` up to taking blocks (``place_states``) on
        the block ids, with vLLM's assertions on what it moves and takes."""
        allocated, checkpoint = blocks.allocated, blocks.checkpoint_position > 0
        num_new, moved = self.place_states(
            blocks, blocks.block_ids, NULL_BLOCK, num_tokens_main_model, checkpoint
        )
        for block in moved:
            if not block or pool.ref_cnt[block] != 1 or pool.block_hash[block] is not None:
                raise UnmirroredVllmCrash(
                    "mamba-moves-a-shared-block",
                    "vLLM's MambaManager asserts a speculative block it moves is its own"
                    f" and uncached, but block {block} is shared or cached",
                )
        if num_new > (1 if allocated else 1 + self.num_speculative_blocks) + checkpoint:
            raise UnmirroredVllmCrash(
                "mamba-takes-several-state-blocks",
                "vLLM's MambaManager asserts it takes at most one state block a step,"
                f" not {num_new}",
            )
        return num_new

    def free_skipped_block_ids(
        self, pool: BlockPool, blocks: GroupBlocks, processed_computed_tokens: int
    ) -> int:
        """``MambaManager.remove_skipped_blocks`` (``retire_states``) on the block ids: the
        blocks before the last state's go back to the pool in one call, the state block of
        two steps ago in another (the free queue's order depends on it)."""
        retired, state = self.retire_states(
            blocks, blocks.block_ids, NULL_BLOCK, processed_computed_tokens
        )
        for freed in (retired, state):
            if freed:
                pool.free_blocks(freed)
        return len(retired) + len(state)

    def cache_blocks(
        self,
        coordinator: CachingCoordinator,
        pool: BlockPool,
        request: RequestState,
        index: int,
        blocks: GroupBlocks,
        num_tokens: int,
        cacheable: int,
        step: int,
    ) -> None:
        """``MambaManager.cache_blocks`` in ``align`` mode: the state blocks up to the
        ``cacheable`` tokens get their key where retention keeps them
        (``reachable_block_mask``), then the prompt's last reusable state
        (``_cache_partial_tail_block``); each key cached joins ``cached_this_step``."""
        block_size = coordinator.block_size
        hashes = request.block_hashes or ()
        ids = blocks.block_ids
        # get_num_cacheable_tokens: a group that does not drop its last hit block caches up
        # to a block boundary.
        if not coordinator.drop_groups[index]:
            cacheable = cacheable // block_size * block_size
        num_cached = max(blocks.num_cached_blocks, 0)
        num_full = min(cacheable, len(hashes) * block_size) // block_size
        if num_cached < num_full:
            mask = self.reachable_block_mask(coordinator, request, index, num_cached, num_full)
            for place in range(num_cached, min(num_full, len(ids))):
                block = ids[place]
                if not block or (mask is not None and not mask[place - num_cached]):
                    continue
                key = pool.block_hash[block]
                if key is None:
                    key = group_key(hashes[place], index)
                    pool.cache(block, key)
                coordinator.cached_this_step[key] = step
            blocks.num_cached_blocks = num_full
        if blocks.checkpoint_position:
            self._cache_checkpoint(coordinator, pool, request, index, blocks, step)
        else:
            self._cache_last_reusable_state(coordinator, pool, request, index, ids, cacheable, step)

    def _cache_last_reusable_state(
        self,
        coordinator: CachingCoordinator,
        pool: BlockPool,
        request: RequestState,
        index: int,
        ids: list[int],
        cacheable: int,
        step: int,
    ) -> None:
        """``_cache_partial_tail_block`` without a checkpoint: the state block at the
        prompt's last reusable boundary, once the ``cacheable`` tokens end there."""
        block_size = coordinator.block_size
        if (
            cacheable <= 0
            or cacheable % block_size
            or cacheable != coordinator.prefill_checkpoint_position(request.prompt_len)
        ):
            return
        place = cacheable // block_size - 1
        if place >= len(ids) or not ids[place]:
            return
        hashes = request.block_hashes or ()
        block, key = ids[place], group_key(hashes[place], index)
        if pool.block_hash[block] == key:
            # 0.33 leaves a state keyed at this boundary already alone; 0.32 marks it
            # cached this step again, so a sibling's hit on it waits another step.
            if coordinator.rekeys_cached_mamba_tail:
                coordinator.cached_this_step[key] = step
            return
        # A state block only ever holds its own place's state: keyed here or not at all.
        assert pool.block_hash[block] is None, f"Mamba block {block} keyed at another place"
        pool.cache(block, key)
        coordinator.cached_this_step[key] = step

    def _cache_checkpoint(
        self,
        coordinator: CachingCoordinator,
        pool: BlockPool,
        request: RequestState,
        index: int,
        blocks: GroupBlocks,
        step: int,
    ) -> None:
        """``_cache_partial_tail_block`` with this step's prefill checkpoint: its block
        is keyed at the checkpoint (replacing any key it had) where a later request can
        resume there (the prompt's last reusable state, a retained boundary or the
        junction); else the state there is transient and the block loses its key."""
        position, block_size = blocks.checkpoint_position, coordinator.block_size
        block = blocks.block_ids[blocks.checkpoint_place]
        at = position // block_size - 1
        mask = self.reachable_block_mask(coordinator, request, index, at, at + 1, False)
        if (
            position != coordinator.prefill_checkpoint_position(request.prompt_len)
            and mask is not None
            and not mask[0]
            and position != coordinator.junction(request)
        ):
            pool.uncache(block)
            return
        if block == NULL_BLOCK:
            # vLLM's cache_partial_block keys nothing on a null place (a padded decode's
            # checkpoint on a place the group has skipped), before it looks for a hash.
            return
        hashes = request.block_hashes or ()
        if at >= len(hashes):
            # A padded decode's rows past the prompt put the checkpoint beyond the tokens.
            raise UnmirroredVllmCrash(
                "mamba-checkpoint-past-block-hashes",
                "vLLM's BlockPool asserts a checkpoint's prefix has its hashes, but request"
                f" {request.request_id!r}'s checkpoint at {position} tokens is past its"
                f" {len(hashes)} block hashes",
            )
        key = group_key(hashes[at], index)
        if pool.block_hash[block] == key:
            return
        pool.uncache(block)
        pool.cache(block, key)
        coordinator.cached_this_step[key] = step

    def reachable_block_mask(
        self,
        coordinator: CachingCoordinator,
        request: RequestState,
        index: int,
        start: int,
        end: int,
        reachable: bool = True,
    ) -> list[bool] | None:
        """``MambaManager.reachable_block_mask`` for blocks ``start:end`` of group
        ``index`` (None: every block). A hit needs only the one state block ending at it:
        at ``retention_interval`` None every block, at N > 0 the last of each N-token
        segment (every block where N is a block or less), and from 0 on also those ending
        at the places a later request resumes (``reachable_boundaries``; a checkpoint's
        check passes none: ``reachable`` False)."""
        block_size, interval = coordinator.block_size, coordinator.retention_interval
        if interval is None:
            return None
        mask = [False] * (end - start)
        if interval:
            per_segment = interval // block_size
            if per_segment <= 1:
                return None
            first = (start + per_segment) // per_segment * per_segment - 1
            for offset in range(first - start, end - start, per_segment):
                mask[offset] = True
        boundaries = coordinator.reachable_boundaries(request, index) if reachable else []
        for boundary in boundaries:
            place = boundary // block_size - 1
            if start <= place < end:
                mask[place - start] = True
        return mask
