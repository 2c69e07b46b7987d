"""One KV group's block rules: vLLM's ``SingleTypeKVCacheManager`` subclasses, by kind.

A group keeps, per request, its block table (``GroupBlocks``: which places hold a real
block and which a null block). Its rules are how many tokens the table must cover
(``num_tokens``: Mamba adds its speculative blocks), which leading tokens attention no
longer reads (``num_skipped_tokens``: their blocks go back to the pool and their places
become null blocks) and the admission cap of a recycling kind (``admission_cap``). The
hybrid coordinator (``kv_hybrid.py``) asks each group and sums; the budget policies never
see a group. With prefix caching on, the coordinator with caching
(``kv_hybrid_caching.py``) reads the same rules and keeps each group's blocks by id.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Final, TypeVar

from dualbudget.spec.config import EngineConfig, KVGroup

from .kv import cdiv
from .state import GroupBlocks

T = TypeVar("T")

UNBOUNDED: Final = sys.maxsize
"""A promise or horizon nothing reaches."""
"""A block table's entry: a bool (real or null) or a pool block id (0: the null block)."""


@dataclass(frozen=True, slots=True)
class FullAttentionManager:
    """``FullAttentionManager`` (``MLAAttentionSpec`` included: MLA is scheduled as full
    attention): every token's block is kept until the request is freed."""

    block_size: int
    recycles_window: bool = False
    """Whether blocks this group skips fell out of an attention window (the coverage
    event ``window_blocks_freed``), not behind a Mamba state."""
    admission_cap: int | None = None
    """``max_admission_blocks_per_request`` of a recycling kind (None: no cap)."""

    def num_tokens(self, num_tokens: int) -> int:
        """The tokens the group's table must cover for ``num_tokens`` slots."""
        return num_tokens

    @property
    def blocks_bound_slots(self) -> bool:
        """Whether the group's table holds one slot per token of its blocks (C9 judges
        those); a Mamba group's blocks hold states instead."""
        return True

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``get_num_skipped_tokens``: the default skips nothing."""
        return 0

    def num_processed_to_skip(self, num_blocks: int) -> int:
        """The fewest processed computed tokens whose skipped tokens fill ``num_blocks``
        blocks (``num_skipped_tokens`` inverted, block-wise): below it
        ``remove_skipped_blocks`` frees no block past the first ``num_blocks - 1``
        places. Skipping nothing, never."""
        return UNBOUNDED

    def skip_places(
        self, blocks: GroupBlocks, table: list[T], null: T, processed_computed_tokens: int
    ) -> list[T]:
        """``remove_skipped_blocks`` on any block table: the skipped places (as far as
        ``table`` goes), from the last back to the first null one
        (``_remove_blocks_in_range``), become ``null``. Returns what they held, last
        first."""
        skipped_tokens = self.num_skipped_tokens(processed_computed_tokens)
        if skipped_tokens <= 0:
            return []
        freed: list[T] = []
        num_skipped = min(skipped_tokens // self.block_size, len(table))
        # The coordinator's promise reads it: the places before it are null from here on.
        blocks.num_retired_blocks = num_skipped
        for index in range(num_skipped - 1, -1, -1):
            if not table[index]:
                break
            freed.append(table[index])
            table[index] = null
        return freed

    def remove_skipped_blocks(self, blocks: GroupBlocks, processed_computed_tokens: int) -> int:
        """``skip_places`` on the group's table. Returns how many went back to the pool."""
        return len(self.skip_places(blocks, blocks.table, False, processed_computed_tokens))

    def num_blocks_to_allocate(
        self,
        blocks: GroupBlocks,
        num_tokens: int,
        num_tokens_main_model: int,
        total_computed_tokens: int,
        admission: bool,
        checkpoint: bool = False,
    ) -> int:
        """``get_num_blocks_to_allocate`` for ``num_tokens`` slots: the blocks past the
        table or, where attention skips further, past the skipped blocks (``admission``:
        the recycling kinds' cap applies). Only a Mamba ``align`` group reserves a prefill
        ``checkpoint``."""
        required = cdiv(self.num_tokens(num_tokens), self.block_size)
        cap = self.admission_cap
        if admission and cap is not None and cap < required:
            required = cap
        skipped = self.num_skipped_tokens(total_computed_tokens) // self.block_size
        return max(required - max(skipped, len(blocks.table)), 0)

    def allocate_new_blocks(
        self, blocks: GroupBlocks, num_tokens: int, num_tokens_main_model: int
    ) -> int:
        """``allocate_new_blocks``: the table grows to cover ``num_tokens`` slots.
        Returns how many blocks it took from the pool."""
        num_new = cdiv(self.num_tokens(num_tokens), self.block_size) - len(blocks.table)
        if num_new <= 0:
            return 0
        blocks.table += [True] * num_new
        return num_new


@dataclass(frozen=True, slots=True)
class SlidingWindowManager(FullAttentionManager):
    """``SlidingWindowManager`` (``SlidingWindowMLASpec`` too): the next token attends to
    the last ``sliding_window`` tokens, itself included, so the ones before are skipped."""

    sliding_window: int = 1
    extra_retained_tokens: int = 0
    """``SlidingWindowSpec.extra_retained_tokens``: tokens kept below the window, never
    attended, that a multi-module MTP drafter may prefill again (vLLM sets the
    coordinator's ``num_reprefillable_tokens`` on every sliding-window spec)."""

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        retained = self.sliding_window - 1 + self.extra_retained_tokens
        return max(0, num_computed_tokens - retained)

    def num_processed_to_skip(self, num_blocks: int) -> int:
        return num_blocks * self.block_size + self.sliding_window - 1 + self.extra_retained_tokens


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionManager(FullAttentionManager):
    """``ChunkedLocalAttentionManager``: a token attends within its chunk of
    ``attention_chunk_size``, so every whole chunk before the next token's is skipped."""

    attention_chunk_size: int = 1

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def num_processed_to_skip(self, num_blocks: int) -> int:
        chunk = self.attention_chunk_size
        return cdiv(num_blocks * self.block_size, chunk) * chunk


@dataclass(frozen=True, slots=True)
class MambaManager(FullAttentionManager):
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


def max_in_flight_tokens(config: EngineConfig) -> int:
    """``VllmConfig.max_in_flight_tokens``: one batch per concurrent step (two with
    ``async_scheduling``, vLLM's batch queue)."""
    return (2 if config.async_scheduling else 1) * config.max_num_batched_tokens


def single_type_manager(group: KVGroup, config: EngineConfig) -> FullAttentionManager:
    """``get_manager_for_kv_cache_spec``: the rules of ``group``'s kind, with the
    admission cap a recycling kind's spec computes (``max_admission_blocks_per_request``)."""
    size, max_model_len = group.block_size, config.max_model_len
    in_flight = max_in_flight_tokens(config)
    if group.kind in ("sliding_window", "sliding_window_mla"):
        assert group.sliding_window is not None
        window = group.sliding_window
        extra = config.num_reprefillable_tokens
        # +1: the window need not start at a block's start (SlidingWindowSpec).
        cap = cdiv(min(window - 1 + extra + in_flight, max_model_len), size) + 1
        return SlidingWindowManager(size, True, cap, window, extra)
    if group.kind == "chunked_local_attention":
        assert group.attention_chunk_size is not None
        chunk = group.attention_chunk_size
        cap = cdiv(min(chunk + in_flight, max_model_len), size)
        return ChunkedLocalAttentionManager(size, True, cap, chunk)
    if group.kind == "mamba":
        mamba = MambaAlignManager if group.mamba_cache_mode == "align" else MambaManager
        return mamba(size, False, None, config.num_speculative_tokens)
    return FullAttentionManager(size)
