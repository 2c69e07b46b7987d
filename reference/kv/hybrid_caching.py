"""The hybrid coordinator with prefix caching: several KV groups, one block pool that
knows each group's cached blocks by (hash, group).

Mirrors ``KVCacheManager`` over ``HybridKVCacheCoordinator`` (and
``UnitaryKVCacheCoordinator`` for one group of another kind) with ``enable_caching``. The
requests' hashes are of the GCD of the groups' block sizes (``block_size``, vLLM's
``hash_block_size``), a group's block keyed by the last hash it spans (the chain makes it
name every token before); hits land on the scheduler block, the LCM, where every group's
blocks end (``scheduler_block_size``; ``hybrid_hits.py`` finds them). The groups differ
in block size only where each is full attention (MLA alike) or a sliding window, and
otherwise share one, the scheduler's and the hash's.

Each step asks every group's kind manager, never its kind: it frees what the group
skips (``remove_skipped_blocks``: unhashed blocks to the free queue's head, cached ones
to its tail), counts (``get_num_blocks_to_allocate``, the hit's free blocks as taken),
touches the hit group by group (``add_local_computed_blocks``, the skipped places left
null), takes the new blocks (``allocate_new_blocks``) and caches the full blocks of the
tokens up to the scheduler block (``cache_blocks``; ``get_num_cacheable_tokens``: a
group that drops its hit's last block one block of its own past it). A hit on a Mamba
state cached in the same step waits a step (``cached_blocks_this_step``), since that
state exists only once the step has run. When the request ends its blocks go back last
first, group after group.

What stays out is refused by ``coordinator.py`` before a manager is built: Mamba out of
``align`` mode, a chunked-local group whose hit would drop its last block (vLLM asserts
against it) and groups of different block sizes beside a chunked-local group (vLLM
asserts its block is the scheduler block) or a Mamba group (partial hash hits and their
copy-on-write tail).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..prefix_cache import BlockPool
from ..state import GroupBlocks, RequestState, SchedulerState
from ..violations import UnmirroredVllmCrash
from .blocks import NO_HIT, NULL_BLOCK, UNBOUNDED, cdiv
from .hybrid_hits import HybridCacheHits
from .single_type import SingleTypeKVCacheManager


@dataclass(frozen=True, slots=True)
class HybridPrefixCachingKVCacheManager(HybridCacheHits):
    """``HybridKVCacheManager`` with ``enable_caching``, its groups' blocks in
    ``state.block_pool`` by id (``GroupBlocks.block_ids``); ``state.free_blocks`` is the
    free queue's length and ``request.num_blocks`` the real blocks of every group."""

    cached_this_step: dict[str, int] = field(default_factory=dict)
    """A Mamba group's ``cached_blocks_this_step``, as the step (``state.num_steps``) each
    key was last cached in: vLLM clears the set when a step starts."""
    rekeys_cached_mamba_tail: bool = False
    """The release's ``rekeys_cached_mamba_tail``."""
    num_reprefillable_tokens: int = 0
    """The coordinator's ``num_reprefillable_tokens`` (multi-module MTP): a group that
    drops its hit's last block caches only the tokens computed before them."""
    tails_cached: dict[tuple[str, int], int] = field(default_factory=dict)
    """Per (request, group), the prompt tail boundary keyed in its block (``tail_key``)
    since the request last took blocks: keying it again changes nothing the scheduler
    sees (a lookahead's later hashes may move the boundary on)."""

    # -- allocation ----------------------------------------------------------------------
    def _num_blocks_to_allocate(
        self,
        pool: BlockPool,
        group: SingleTypeKVCacheManager,
        blocks: GroupBlocks,
        hit: tuple[int, ...],
        num_tokens: int,
        num_tokens_main_model: int,
        total_computed_tokens: int,
        admission: bool,
        prefill_end: int = 0,
    ) -> int:
        """``SingleTypeKVCacheManager.get_num_blocks_to_allocate``: a running request
        (in ``num_cached_block``) asks the blocks past its table; any other the blocks
        past its table, its hit and the skipped blocks, plus the hit blocks a touch
        takes off the free queue."""
        checkpoint = group.reserves_prefill_checkpoint and self._reserve_checkpoint(
            group,
            blocks,
            blocks.block_ids,
            total_computed_tokens,
            num_tokens_main_model,
            prefill_end,
            admission,
        )
        return group.num_blocks_to_allocate_cached(
            pool,
            blocks,
            hit,
            num_tokens,
            num_tokens_main_model,
            total_computed_tokens,
            admission,
            checkpoint,
        )

    def _hit_state_pending(self, state: SchedulerState, hits: list[tuple[int, ...]]) -> bool:
        """Whether a Mamba group's hit ends on a state block cached in this very step:
        vLLM then asks for more blocks than the pool has (``num_gpu_blocks + 1``), so the
        request waits a step, until the state exists."""
        pool = self.pool(state)
        for group, hit in zip(self.groups, hits, strict=True):
            if hit and group.holds_states:
                key = pool.block_hash[hit[-1]]
                if key is not None and self.cached_this_step.get(key) == state.num_steps:
                    return True
        return False

    def full_sequence_fits(
        self, state: SchedulerState, request: RequestState, hit: tuple[int, ...] = NO_HIT
    ) -> bool:
        """The ``full_sequence_must_fit`` gate: every group's blocks for the whole
        sequence (a recycling group's capped at its admission bound), its hit counted
        as held and its free blocks as taken, summed."""
        pool = self.pool(state)
        hits = self._split_hit(hit)
        if self._hit_state_pending(state, hits):
            return False
        hit_tokens = self._hit_tokens(hits)
        total_computed = min(request.num_computed_tokens + hit_tokens, self.max_model_len)
        full = min(request.num_tokens, self.max_model_len)
        prefill_end = self._prefill_end(request)
        wanted = sum(
            self._num_blocks_to_allocate(
                pool, group, blocks, group_hit, full, full, total_computed, True, prefill_end
            )
            for group, blocks, group_hit in zip(self.groups, request.kv_groups, hits, strict=True)
        )
        return wanted <= state.free_blocks

    def allocate_slots(
        self,
        state: SchedulerState,
        request: RequestState,
        num_new_tokens: int,
        hit: tuple[int, ...] = NO_HIT,
    ) -> bool:
        """``KVCacheManager.allocate_slots``: free what every group skips, count (the hit
        held, its free blocks taken); then touch the hit, hand out each group's new
        blocks and cache every group's full blocks of the tokens computed by the end of
        the step."""
        if not hit and self.without_mamba:
            for blocks in request.kv_groups:
                if blocks.num_cached_blocks < 0:
                    break
            else:
                # Every group counts the request in num_cached_block: a running request.
                return self._allocate_running(state, request, num_new_tokens)
        pool = self.pool(state)
        hits = self._split_hit(hit)
        if self._hit_state_pending(state, hits):
            # Only a new request has a hit, and it holds no blocks to free first.
            return False
        num_local_computed = request.num_computed_tokens + self._hit_tokens(hits)
        total_computed = min(num_local_computed, self.max_model_len)
        main = total_computed + num_new_tokens
        need_slot = self.slots_needed(total_computed, num_new_tokens)
        self.remove_skipped_blocks(
            state, request, max(0, total_computed - request.num_in_flight_tokens)
        )
        groups = list(zip(self.groups, request.kv_groups, hits, strict=True))
        prefill_end = self._prefill_end(request)
        wanted = sum(
            self._num_blocks_to_allocate(
                pool,
                group,
                blocks,
                group_hit,
                need_slot,
                main,
                num_local_computed,
                False,
                prefill_end,
            )
            for group, blocks, group_hit in groups
        )
        if wanted > state.free_blocks:
            return False
        if any(hits) and all(blocks.num_cached_blocks < 0 for _, blocks, _ in groups):
            # allocate_new_computed_blocks: every group's hit is touched before any
            # group takes new blocks, so no group evicts another's hit.
            for group, blocks, group_hit in groups:
                touched = group.add_local_computed_blocks(
                    pool, blocks, group_hit, num_local_computed
                )
                self.observed["hit_on_running_block"] += touched
        self._allocate_new_blocks(pool, request, need_slot, main, wanted)
        state.free_blocks = pool.num_free_blocks
        cut = self.pending_cuts.pop(request.request_id, 0)
        if cut:
            self.observed["hybrid_hit_cut"] += 1
        if hits[0] and not self.one_block_size:
            self.observed["hit_across_block_sizes"] += 1
        self._cache_blocks(state, request, min(total_computed + num_new_tokens, request.num_tokens))
        self._promise(request)
        return True

    def _allocate_new_blocks(
        self, pool: BlockPool, request: RequestState, need_slot: int, main: int, wanted: int
    ) -> None:
        """Each group's ``allocate_new_blocks`` for ``need_slot`` slots (``main`` the main
        model's tokens), its blocks off the pool; ``wanted`` is what the groups counted."""
        for group, blocks in zip(self.groups, request.kv_groups, strict=True):
            num_new = group.num_new_block_ids(pool, blocks, need_slot, main)
            if num_new > pool.num_free_blocks:
                raise UnmirroredVllmCrash(
                    "pool-short-of-counted-blocks",
                    f"vLLM's BlockPool.get_new_blocks fails: request {request.request_id!r}'s"
                    f" groups take more than the {pool.num_free_blocks} free blocks,"
                    f" counted {wanted}",
                )
            self._take_blocks(pool, blocks, num_new)
        # Real blocks: every place but the null block's (counted in C: every running
        # request of every step passes here).
        request.num_blocks = sum(
            len(blocks.block_ids) - blocks.block_ids.count(NULL_BLOCK)
            for blocks in request.kv_groups
        )

    def _take_blocks(self, pool: BlockPool, blocks: GroupBlocks, num_new: int) -> None:
        """``allocate_new_blocks``' take: ``num_new`` blocks off the free queue's head
        (evicting their hashes) join the group's table."""
        if num_new > 0:
            new_blocks, evicted = pool.get_new_blocks(num_new)
            self.observed["cached_block_evicted"] += evicted
            blocks.block_ids += new_blocks

    def _allocate_running(
        self, state: SchedulerState, request: RequestState, num_new_tokens: int
    ) -> bool:
        """``allocate_slots`` for a running request (every group counts it in
        ``num_cached_block``, no hit) without a Mamba group: each group asks the blocks
        past its table, of its block size; the count fitting the free blocks, no group
        can take more than the pool holds, and no hit cut is pending."""
        total_computed = min(request.num_computed_tokens, self.max_model_len)
        need_slot = self.slots_needed(total_computed, num_new_tokens)
        processed = total_computed - request.num_in_flight_tokens
        if processed >= request.kv_skip_horizon:  # below it, no group frees a block
            self.remove_skipped_blocks(state, request, processed)
        if self.one_block_size:
            required = cdiv(need_slot, self.block_size)
            lacking = [required - len(blocks.block_ids) for blocks in request.kv_groups]
        else:
            lacking = [
                cdiv(need_slot, group.block_size) - len(blocks.block_ids)
                for group, blocks in zip(self.groups, request.kv_groups, strict=True)
            ]
        wanted = sum(num_new for num_new in lacking if num_new > 0)
        if wanted > state.free_blocks:
            return False
        if wanted:
            pool = self.pool(state)
            for index, num_new in enumerate(lacking):
                self._take_blocks(pool, request.kv_groups[index], num_new)
            request.num_blocks += wanted
            state.free_blocks = pool.num_free_blocks
        self._cache_blocks(state, request, min(total_computed + num_new_tokens, request.num_tokens))
        self._promise(request)
        return True

    def _promise(self, request: RequestState) -> None:
        """Set ``kv_slots_covered`` where no group is Mamba: within it no group's table
        grows (the lookahead slots counted) or has a hashed block left to cache, so
        ``allocate_slots`` and ``cache_blocks`` would do nothing (with
        ``kv_skip_horizon``, which ``remove_skipped_blocks`` keeps). A Mamba group
        moves its state every step: no promise (0)."""
        if not self.without_mamba:
            return
        hashes = request.block_hashes
        num_hashes = len(hashes) if hashes is not None else 0
        lookahead = self.num_lookahead_tokens
        covered = UNBOUNDED
        # Every RUNNING step at a block boundary passes here: the mins are spelled out.
        for index, blocks in enumerate(request.kv_groups):
            num_cached = blocks.num_cached_blocks
            if num_cached < 0:
                covered = 0  # not yet allocated: the RUNNING loop asks
                break
            block_size = self.groups[index].block_size
            limit = len(blocks.block_ids) * block_size - lookahead
            # The group's next block to cache, where its hashes reach it (the tokens
            # cacheable are cut back to the scheduler block: this errs early).
            if num_hashes >= (num_cached + 1) * self.hashes_per_block[index]:
                next_cached = (num_cached + 1) * block_size - 1
                if self.num_reprefillable_tokens and self.drop_groups[index]:
                    next_cached += self.num_reprefillable_tokens
                if next_cached < limit:
                    limit = next_cached
            if not self.one_block_size:
                tail = self.tail_boundary(request, index)
                if 0 < tail <= limit:
                    limit = tail - 1
            if limit < covered:
                covered = limit
        request.kv_slots_covered = covered

    def remove_skipped_blocks(
        self, state: SchedulerState, request: RequestState, processed_computed_tokens: int
    ) -> None:
        """``remove_skipped_blocks``: each group frees, last first back to the first null
        place, the blocks attention no longer reads."""
        pool = self.pool(state)
        # One GroupBlocks per group (add_request), indexed as HybridKVCacheManager's are.
        for index, group in enumerate(self.groups):
            blocks = request.kv_groups[index]
            freed = group.free_skipped_block_ids(pool, blocks, processed_computed_tokens)
            request.num_blocks -= freed
            if freed and group.recycles_window:
                self.observed["window_blocks_freed"] += freed
        state.free_blocks = pool.num_free_blocks
        if self.without_mamba:
            request.kv_skip_horizon = self._skip_horizon(request)

    def cache_blocks(self, state: SchedulerState, request: RequestState, num_tokens: int) -> None:
        """``_cache_blocks``, the promise kept."""
        if self._cache_blocks(state, request, num_tokens):
            self._promise(request)

    def _cache_blocks(self, state: SchedulerState, request: RequestState, num_tokens: int) -> bool:
        """The coordinator's ``cache_blocks``: each group's ``cache_blocks`` of the first
        ``num_tokens`` tokens (as far as the request has hashes; a group that drops its
        hit's last block none of the re-prefillable ones). Returns whether it looked
        (False: every group caches that far already)."""
        hashes = request.block_hashes or ()
        num_hashed = len(hashes) * self.block_size
        if self.without_mamba and self.one_block_size:
            num_full = min(num_tokens, num_hashed) // self.block_size
            for blocks in request.kv_groups:
                if blocks.num_cached_blocks < num_full:
                    break
            else:
                return False
        elif self.without_mamba:
            for index, (group, blocks) in enumerate(
                zip(self.groups, request.kv_groups, strict=True)
            ):
                if blocks.num_cached_blocks < min(num_tokens, num_hashed) // group.block_size:
                    break
                if 0 < self.tail_boundary(request, index) <= num_tokens:
                    break
            else:
                return False
        pool = self.pool(state)
        # get_num_cacheable_tokens: a group that drops its hit's last block caches none of
        # the re-prefillable tokens (once a scheduler block is computed).
        scheduler_block_size = self.scheduler_block_size
        finalized = num_tokens
        if self.num_reprefillable_tokens and num_tokens >= scheduler_block_size:
            finalized = max(num_tokens - self.num_reprefillable_tokens, 0)
        step = state.num_steps
        for index, group in enumerate(self.groups):
            cacheable = num_tokens
            if finalized != num_tokens and self.drop_groups[index]:
                cacheable = finalized
            blocks = request.kv_groups[index]
            group.cache_blocks(self, pool, request, index, blocks, num_tokens, cacheable, step)
        return True

    def tail_boundary(self, request: RequestState, index: int) -> int:
        """Where group ``index`` keys the prompt's tail (0: nowhere, or keyed already):
        the last hash boundary a replay can match (the whole prompt where the group drops
        its hit's last block, else all but its last token), if inside a block."""
        if self.hashes_per_block[index] == 1:
            return 0
        hashes = request.block_hashes or ()
        limit = request.prompt_len if self.drop_groups[index] else request.prompt_len - 1
        boundary = min(limit // self.block_size, len(hashes)) * self.block_size
        if boundary % self.groups[index].block_size == 0:
            return 0
        return 0 if self.tails_cached.get((request.request_id, index)) == boundary else boundary

    def free(self, state: SchedulerState, request: RequestState) -> None:
        """``free``: group after group, its real blocks last first."""
        pool = self.pool(state)
        for blocks in request.kv_groups:
            pool.free_blocks(reversed([block for block in blocks.block_ids if block]))
        self.pending_cuts.pop(request.request_id, None)
        self.junctions.pop(request.request_id, None)
        for index in range(len(self.groups)):
            self.tails_cached.pop((request.request_id, index), None)
        request.num_blocks = 0
        request.kv_slots_covered, request.kv_skip_horizon = 0, UNBOUNDED
        request.kv_groups = [GroupBlocks() for _ in self.groups]
        state.free_blocks = pool.num_free_blocks
