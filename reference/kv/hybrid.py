"""The hybrid coordinator: several KV groups on one block pool, prefix caching off.

Mirrors ``KVCacheManager.allocate_slots`` over vLLM's ``KVCacheCoordinator`` (with
``HybridKVCacheCoordinator`` where there are several groups): each group keeps its own
block table per request (its kind's manager says how long, and which of its leading
blocks attention no longer reads), and a request needs the sum over groups of the blocks
each group lacks. The blocks a group skips are freed first, on the processed-token basis
(computed tokens less those in flight), before the count, whether or not the count then
fits, as vLLM's ``remove_skipped_blocks`` runs before ``get_num_blocks_to_allocate``.

A request's table in each group is a ``GroupBlocks`` (``state.py``): real and null
blocks by place, as vLLM's ``req_to_blocks``. A Mamba group in ``align`` mode also splits
prefill chunks on its block boundaries (``block_aligned_split``, which the scheduler
calls between a grant and its charge), and with prefill checkpoint blocks reserves the
place of the state its layers save inside a chunk (``_reserve_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dualbudget.spec.config import EngineConfig

from ..events import AddRequest
from ..state import GroupBlocks, RequestState, SchedulerState
from ..violations import UnmirroredVllmCrash
from .blocks import NO_HIT, T, cdiv
from .counting import KVCacheManager
from .kinds import single_type_manager
from .single_type import SingleTypeKVCacheManager


@dataclass(frozen=True, slots=True)
class HybridKVCacheManager(KVCacheManager):
    """``KVCacheManager`` over ``groups`` sharing the state's pool (``free_blocks``);
    ``request.num_blocks`` is the sum of the real blocks it holds in every group."""

    groups: tuple[SingleTypeKVCacheManager, ...] = ()
    observed: dict[str, int] = field(default_factory=dict)
    """The scheduler's ``observed``: the coordinator's events are counted there."""
    split_block_size: int = 0
    """``cache_config.block_size``, where a Mamba group runs in ``align`` mode (0: no
    block-aligned split)."""
    max_prefill_tokens: int = 0
    """``max_num_scheduled_tokens``, capped by ``long_prefill_token_threshold`` when set:
    a block wider than this may end a chunk mid-block."""
    drop_eagle_block: bool = False
    """The scheduler's ``use_eagle_block_drop``: the drafter's last block is recomputed,
    so the last reusable state is one block earlier."""
    checkpoint_blocks: bool = False
    """``mamba_has_prefill_checkpoint_blocks``: the Mamba layers save the prompt's
    reusable state inside a chunk (their alignment the Mamba block)."""
    retention_interval: int | None = None
    """``KVCacheConfig.prefix_cache_retention_interval``: at 0 only the chunk that ends
    the prefill reserves a checkpoint (``_prefill_end``); with caching it also says which
    full blocks a sliding-window group caches."""
    checkpoint_recompute_tokens: int = 1
    """The tokens the last reusable state leaves to recompute where no block is dropped:
    one, or the tokens each hash covers past its block where that is more (0.33's
    ``num_hash_lookahead_tokens`` with caching: K for multi-module MTP)."""

    @property
    def enable_caching(self) -> bool:
        return False

    def add_request(self, request: RequestState, event: AddRequest) -> None:
        """An empty block table in every group; the first allocation looks for skips
        (``kv_skip_horizon`` 0)."""
        request.kv_groups = [GroupBlocks() for _ in self.groups]
        request.kv_skip_horizon = 0

    def remove_skipped_blocks(
        self, state: SchedulerState, request: RequestState, processed_computed_tokens: int
    ) -> None:
        """``remove_skipped_blocks``: each group frees what attention no longer reads;
        below ``kv_skip_horizon`` none would free more (a Mamba ``align`` group's
        states move every step: 0)."""
        # request.kv_groups holds one GroupBlocks per group (add_request), in group order.
        for index, group in enumerate(self.groups):
            blocks = request.kv_groups[index]
            freed = group.remove_skipped_blocks(blocks, processed_computed_tokens)
            if freed:
                state.free_blocks += freed
                request.num_blocks -= freed
                if group.recycles_window:
                    self.observed["window_blocks_freed"] += freed
        request.kv_skip_horizon = 0 if self.split_block_size else self._skip_horizon(request)

    def _skip_horizon(self, request: RequestState) -> int:
        """The fewest processed tokens at which a group skips a block past the places it
        let go: while the request runs the processed tokens only grow, so below it
        ``remove_skipped_blocks`` would free nothing."""
        blocks = request.kv_groups
        return min(
            group.num_processed_to_skip(blocks[index].num_retired_blocks + 1)
            for index, group in enumerate(self.groups)
        )

    def _promise(self, request: RequestState) -> None:
        """Set ``kv_slots_covered``: within it no group's table grows (a Mamba group's
        speculative blocks and the lookahead slots counted), so ``allocate_slots`` would
        take nothing. A Mamba ``align`` group places its state every step: no promise."""
        if self.split_block_size:
            return
        lookahead = self.num_lookahead_tokens
        blocks = request.kv_groups
        request.kv_slots_covered = min(
            len(blocks[index].table) * group.block_size - group.num_tokens(0) - lookahead
            for index, group in enumerate(self.groups)
        )

    def allocate_slots(
        self,
        state: SchedulerState,
        request: RequestState,
        num_new_tokens: int,
        hit: tuple[int, ...] = NO_HIT,
    ) -> bool:
        """Free what every group skips, then give each group the blocks it lacks for
        ``num_new_tokens`` more (and the lookahead, capped at ``max_model_len``); False,
        with only the skipped blocks freed, if the pool is short."""
        total_computed = min(request.num_computed_tokens, self.max_model_len)
        main = total_computed + num_new_tokens
        need_slot = self.slots_needed(total_computed, num_new_tokens)
        processed = max(0, total_computed - request.num_in_flight_tokens)
        if processed >= request.kv_skip_horizon:
            self.remove_skipped_blocks(state, request, processed)
        pairs = list(zip(self.groups, request.kv_groups, strict=True))
        prefill_end = self._prefill_end(request)
        wanted = sum(
            self._group_blocks_to_allocate(
                group, blocks, need_slot, main, total_computed, False, prefill_end
            )
            for group, blocks in pairs
        )
        if wanted > state.free_blocks:
            return False
        taken = sum(group.allocate_new_blocks(blocks, need_slot, main) for group, blocks in pairs)
        if taken > state.free_blocks:
            # The groups' counts fit the pool (a Mamba align group counts a table longer
            # than needed as negative), but the groups then take more.
            raise UnmirroredVllmCrash(
                "pool-short-of-counted-blocks",
                f"vLLM's BlockPool.get_new_blocks fails: request {request.request_id!r}'s"
                f" groups take {taken} blocks of {state.free_blocks} free, counted {wanted}",
            )
        state.free_blocks -= taken
        request.num_blocks += taken
        self._promise(request)
        return True

    def full_sequence_fits(
        self, state: SchedulerState, request: RequestState, hit: tuple[int, ...] = NO_HIT
    ) -> bool:
        """The ``full_sequence_must_fit`` gate: every group's blocks for the whole
        sequence, a recycling group's capped at its admission bound, summed."""
        total_computed = min(request.num_computed_tokens, self.max_model_len)
        full = min(request.num_tokens, self.max_model_len)
        prefill_end = self._prefill_end(request)
        wanted = sum(
            self._group_blocks_to_allocate(
                group, blocks, full, full, total_computed, True, prefill_end
            )
            for group, blocks in zip(self.groups, request.kv_groups, strict=True)
        )
        return wanted <= state.free_blocks

    def _group_blocks_to_allocate(
        self,
        group: SingleTypeKVCacheManager,
        blocks: GroupBlocks,
        num_tokens: int,
        num_tokens_main_model: int,
        total_computed_tokens: int,
        admission: bool,
        prefill_end: int,
    ) -> int:
        """A group's ``get_num_blocks_to_allocate``, a Mamba ``align`` group's with the
        prefill checkpoint it reserves (``_reserve_checkpoint``)."""
        checkpoint = group.reserves_prefill_checkpoint and self._reserve_checkpoint(
            group,
            blocks,
            blocks.table,
            total_computed_tokens,
            num_tokens_main_model,
            prefill_end,
            admission,
        )
        return group.num_blocks_to_allocate(
            blocks, num_tokens, num_tokens_main_model, total_computed_tokens, admission, checkpoint
        )

    def _reserve_checkpoint(
        self,
        group: SingleTypeKVCacheManager,
        blocks: GroupBlocks,
        table: list[T],
        query_start: int,
        query_end: int,
        prefill_end: int,
        admission: bool,
    ) -> bool:
        """``MambaManager``'s prefill checkpoint (``_needs_internal_checkpoint``): a chunk
        that reaches ``prefill_end`` (any chunk where it is 0, as it is but at retention 0)
        and can save the state at the last reusable boundary below its end, into a place of
        ``table`` just before the running state's that holds no block yet (or a
        speculative one); recorded for this step's allocation (and, with caching, its
        key) unless ``admission`` only counts."""
        position, place = 0, -1
        if self.checkpoint_blocks:
            position = self.prefill_checkpoint_position(query_end)
            place = cdiv(query_end, group.block_size) - 2
            if not (
                query_end >= prefill_end
                and self.internal_checkpoint(query_start, query_end, position)
                and place >= 0
                and group.checkpoint_place_free(blocks, table, place)
            ):
                position, place = 0, -1
        if not admission:
            blocks.checkpoint_position, blocks.checkpoint_place = position, place
        return position > 0

    def _prefill_end(self, request: RequestState) -> int:
        """The coordinator's ``prefill_end``: where the prefill ends at retention 0, where
        only the chunk reaching it keeps a checkpoint; 0 otherwise (every chunk)."""
        if self.retention_interval != 0:
            return 0
        return max(request.prompt_len, request.num_tokens - 1)

    def tables(self, request: RequestState) -> tuple[int, ...]:
        # A group's places, null blocks included, as vLLM's table holds them; the caching
        # coordinator keeps them as block ids.
        return tuple(max(len(blocks.table), len(blocks.block_ids)) for blocks in request.kv_groups)

    def slots(self, request: RequestState) -> tuple[int, ...] | None:
        if not all(group.blocks_bound_slots for group in self.groups):
            return None
        return tuple(
            places * group.block_size
            for places, group in zip(self.tables(request), self.groups, strict=True)
        )

    def free(self, state: SchedulerState, request: RequestState) -> None:
        """``free``: every group's real blocks go back to the pool."""
        state.free_blocks += request.num_blocks
        request.num_blocks = 0
        request.kv_slots_covered = request.kv_skip_horizon = 0
        request.kv_groups = [GroupBlocks() for _ in self.groups]

    def preempt(self, state: SchedulerState, request: RequestState) -> None:
        """A preemption frees every group's blocks (``hybrid_preempt`` when there are
        several)."""
        if len(self.groups) > 1:
            self.observed["hybrid_preempt"] += 1
        self.free(state, request)

    def block_aligned_split(self) -> Callable[[RequestState, int, int], int] | None:
        return self._mamba_block_aligned_split if self.split_block_size else None

    def junction(self, request: RequestState) -> int:
        """``Request.shared_prefix_boundary``: 0 without prefix caching."""
        return 0

    def _mamba_block_aligned_split(
        self, request: RequestState, start: int, num_new_tokens: int
    ) -> int:
        """``Scheduler._mamba_block_aligned_split`` of a chunk from token ``start`` (the
        computed tokens and the cache hit; no partial hash hits): a prefill chunk ends on
        a block boundary (unless it ends the prefill, or a block is wider than a chunk can
        be), never past a boundary it starts short of, nor past the last reusable state
        (unless the Mamba layers save it inside the chunk: ``internal_checkpoint``), nor
        past the block-floored shared-prefix junction (where a sibling's longer hit in
        another group ends: its state is cached there)."""
        num_tokens = request.prompt_len + request.num_output_tokens
        prefill_end = max(request.prompt_len, num_tokens - 1)
        if start >= prefill_end:
            return num_new_tokens
        block_size = self.split_block_size
        last_cache_position = self.prefill_checkpoint_position(num_tokens)
        end = start + num_new_tokens
        internal = (
            self.checkpoint_blocks
            and end >= prefill_end
            and self.internal_checkpoint(start, end, self.prefill_checkpoint_position(prefill_end))
        )
        if internal:
            last_cache_position = 0
        if end < prefill_end:
            aligned_end = end // block_size * block_size
            if aligned_end > start or block_size <= self.max_prefill_tokens:
                end = aligned_end
        next_block_boundary = 0
        if start % block_size and not internal:
            next_block_boundary = (start // block_size + 1) * block_size
        junction = self.junction(request)
        junction_stop = 0
        if start < junction < end:
            junction_stop = start + (junction - start) // block_size * block_size
        for stop in (next_block_boundary, last_cache_position, junction_stop):
            if start < stop < end:
                end = stop
        split = max(end - start, 0)
        if split != num_new_tokens:
            self.observed["mamba_aligned_split"] += 1
        return split

    def internal_checkpoint(self, start: int, end: int, checkpoint_position: int) -> bool:
        """``is_mamba_prefill_checkpoint_valid`` with the Mamba block as the hash block and
        the checkpoint alignment: the chunk ``start:end`` starts on a block boundary, at
        least a block before the checkpoint, which lies strictly inside it, in a later
        block column than its initial state's."""
        block_size = self.split_block_size
        return (
            start % block_size == 0
            and cdiv(end, block_size) - 2 > (start - 1) // block_size
            and start + block_size <= checkpoint_position < end
        )

    def prefill_checkpoint_position(self, num_tokens: int) -> int:
        """``get_mamba_prefill_checkpoint_position``: the last block boundary whose state a
        resend could reuse, ``checkpoint_recompute_tokens`` left to recompute, or a block
        less where the drafter's last block is dropped."""
        block_size = self.split_block_size
        if self.drop_eagle_block:
            return max(num_tokens // block_size * block_size - block_size, 0)
        return max(num_tokens - self.checkpoint_recompute_tokens, 0) // block_size * block_size


def group_managers(config: EngineConfig) -> tuple[SingleTypeKVCacheManager, ...]:
    """Each of ``config``'s groups' kind manager, in group order."""
    return tuple(single_type_manager(group, config) for group in config.groups)


def split_block_size(config: EngineConfig) -> int:
    """``cache_config.block_size`` where a Mamba group runs in ``align`` mode (the
    scheduler's block-aligned split), else 0."""
    align = any(group.mamba_cache_mode == "align" for group in config.groups)
    return config.block_size if align else 0


def max_prefill_tokens(config: EngineConfig) -> int:
    """``max_num_scheduled_tokens``, capped by ``long_prefill_token_threshold`` when set."""
    threshold = config.long_prefill_token_threshold
    cap = config.scheduled_tokens_cap
    return min(cap, threshold) if threshold > 0 else cap


def has_checkpoint_blocks(config: EngineConfig) -> bool:
    """``mamba_has_prefill_checkpoint_blocks``: checkpoint blocks on an ``align`` layout."""
    return split_block_size(config) > 0 and config.mamba_prefill_checkpoint_blocks > 0


def hybrid_manager(
    config: EngineConfig,
    num_lookahead_tokens: int,
    observed: dict[str, int],
    drop_eagle_block: bool,
) -> HybridKVCacheManager:
    """The coordinator over ``config``'s groups, in their order; ``drop_eagle_block`` is
    the scheduler's ``use_eagle_block_drop``."""
    return HybridKVCacheManager(
        block_size=config.block_size,
        max_model_len=config.max_model_len,
        num_lookahead_tokens=num_lookahead_tokens,
        groups=group_managers(config),
        observed=observed,
        split_block_size=split_block_size(config),
        max_prefill_tokens=max_prefill_tokens(config),
        drop_eagle_block=drop_eagle_block,
        checkpoint_blocks=has_checkpoint_blocks(config),
        retention_interval=config.prefix_cache_retention_interval,
    )
