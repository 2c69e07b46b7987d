"""One KV group's block rules: vLLM's ``SingleTypeKVCacheManager``, and
``FullAttentionManager`` (``MLAAttentionSpec`` included: MLA is scheduled as full
attention).

A group keeps, per request, its block table (``GroupBlocks``: which places hold a real
block and which a null block; with prefix caching the pool's block ids). Its rules are
how many tokens the table must cover (``num_tokens``), which leading tokens attention no
longer reads (``num_skipped_tokens``: their blocks go back to the pool and their places
become null blocks), how many blocks a step takes (``num_blocks_to_allocate``, with a
hit ``num_blocks_to_allocate_cached``), where its cache hit ends
(``find_longest_cache_hit``) and which of its blocks it keys (``cache_blocks``). Each
other kind overrides these in its own module (``kinds.py`` maps a kind to its
manager); the coordinators ask each group and sum, and never ask what kind it is.

Full attention's hit is its longest run of cached blocks from the left, cut back to the
scheduler block after its drop (a group drops its last hit block where the release's
``use_eagle`` flags it, matching one block more first). A full-attention group coarser
than the hash keys its prompt's tail block under the tail's hash too
(``_cache_partial_tail_block``): only a partial-hash search would read that key, but it
makes the block a cached one, freed to the free queue's tail and evicted when taken
again (``tail_key``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..prefix_cache import BlockPool
from ..state import GroupBlocks, RequestState
from ..violations import UnmirroredVllmCrash
from .blocks import NULL_BLOCK, UNBOUNDED, T, cdiv, group_key, is_tail_key, tail_key


@dataclass(frozen=True, slots=True)
class HitLookup:
    """The pool's cached blocks of the groups of one spec, place by place: a place is hit
    only where every one of them has its block cached (vLLM's coordinator looks the
    groups of one spec up together). Keys are a group's (``group_key``), or the bare
    hashes where one group's blocks are the only ones the pool keeps."""

    pool: BlockPool
    hashes: Sequence[str]
    group_ids: tuple[int, ...]
    span: int = 1
    """The hashes one block spans (the group's block size over the hash's)."""
    keyed_by_group: bool = True

    @property
    def num_places(self) -> int:
        """The places the hashes reach (vLLM's ``islice`` over them)."""
        return len(self.hashes) // self.span

    def cached_at(self, place: int) -> list[int] | None:
        """The cached block of each group at ``place`` (None: one has none)."""
        block_hash = self.hashes[(place + 1) * self.span - 1]
        if not self.keyed_by_group:
            block = self.pool.get_cached_block(block_hash)
            return None if block is None else [block]
        blocks = []
        for group in self.group_ids:
            block = self.pool.get_cached_block(group_key(block_hash, group))
            if block is None:
                return None
            blocks.append(block)
        return blocks


Hits = tuple[list[list[int]], int]
"""A lookup's blocks, group by group, and the tokens they hit."""


class CachingCoordinator(Protocol):
    """What a group's ``cache_blocks`` reads of the coordinator with caching
    (``hybrid_caching.py``): the request-wide facts every group shares."""

    @property
    def block_size(self) -> int:
        """The hash's block size (the GCD of the groups')."""

    @property
    def scheduler_block_size(self) -> int: ...

    @property
    def hashes_per_block(self) -> tuple[int, ...]: ...

    @property
    def drop_groups(self) -> tuple[bool, ...]: ...

    @property
    def one_block_size(self) -> bool: ...

    @property
    def retention_interval(self) -> int | None: ...

    @property
    def rekeys_cached_mamba_tail(self) -> bool: ...

    @property
    def tails_cached(self) -> dict[tuple[str, int], int]: ...

    @property
    def cached_this_step(self) -> dict[str, int]: ...

    def junction(self, request: RequestState) -> int: ...

    def tail_boundary(self, request: RequestState, index: int) -> int: ...

    def reachable_boundaries(self, request: RequestState, index: int) -> list[int]: ...

    def prefill_checkpoint_position(self, num_tokens: int) -> int: ...


@dataclass(frozen=True, slots=True)
class SingleTypeKVCacheManager:
    """vLLM's ``SingleTypeKVCacheManager``: one group's block rules, by default those of a
    group that keeps every token's block until the request is freed. Each kind's
    subclass overrides what its attention changes (its module says which vLLM method
    each override mirrors)."""

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
        """``get_num_skipped_tokens``: the base skips nothing."""
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

    # -- prefix caching: the same rules on the pool's block ids ------------------------
    @property
    def hit_only_shrinks(self) -> bool:
        """Whether a shorter lookup's hit is a prefix of a longer one's (full attention:
        the coordinator's fixed point never searches it again)."""
        return False

    @property
    def holds_states(self) -> bool:
        """Whether the group's blocks hold recurrent states (Mamba), which move every step:
        the coordinator then makes no promise and a hit on a state cached this step waits."""
        return False

    @property
    def reserves_prefill_checkpoint(self) -> bool:
        """Whether the group can reserve a prefill checkpoint's place (a Mamba ``align``
        group: the coordinator's ``_reserve_checkpoint``)."""
        return False

    def checkpoint_place_free(self, blocks: GroupBlocks, table: list[T], place: int) -> bool:
        """Whether a prefill checkpoint may take ``place`` of ``table``: never where the
        group reserves none (``reserves_prefill_checkpoint``)."""
        return False

    def drop_margin(self) -> int:
        """The tokens a lookup that drops its last block matches past the candidate
        length, so that the drop lands back on it: one block (a kind that never drops
        none)."""
        return self.block_size

    def find_longest_cache_hit(
        self, lookup: HitLookup, max_length: int, drop: bool, scheduler_block_size: int
    ) -> Hits:
        """``find_longest_cache_hit`` within ``max_length`` tokens (``drop``: the last
        block is recomputed), ending on a scheduler block. Each kind searches its own
        way."""
        raise NotImplementedError

    def _check_hashes_reach(self, lookup: HitLookup, max_length: int) -> None:
        """A search from the right starts at the block ``max_length`` ends in; only a first
        lookup (no full-attention group bounded it) of hashes lagging more than a token
        (0.33's multi-module MTP lookahead) starts past them, where vLLM fails."""
        max_blocks = max_length // self.block_size
        if max_blocks > lookup.num_places:
            raise UnmirroredVllmCrash(
                "lookup-past-lookahead-hashes",
                f"vLLM's {type(self).__name__}.find_longest_cache_hit indexes block"
                f" {max_blocks - 1} of a request's {lookup.num_places} block hashes"
                " (IndexError)",
            )

    def _hit_from_left(
        self,
        lookup: HitLookup,
        max_length: int,
        drop: bool,
        scheduler_block_size: int,
        num_skipped: int = 0,
    ) -> Hits:
        """The run of cached blocks from the first place past ``num_skipped`` null ones,
        as far as the hashes go (a lookahead of K hashes lags K tokens), less the dropped
        block, cut back to the scheduler block where every group's blocks end (with one
        block size, every block ends on one)."""
        block_size = self.block_size
        hits: list[list[int]] = [[NULL_BLOCK] * num_skipped for _ in lookup.group_ids]
        for place in range(num_skipped, min(max_length // block_size, lookup.num_places)):
            found = lookup.cached_at(place)
            if found is None:
                break
            for hit, block in zip(hits, found, strict=True):
                hit.append(block)
        if drop and hits[0]:
            for hit in hits:
                hit.pop()
        num_blocks = len(hits[0]) * block_size // scheduler_block_size
        num_blocks = num_blocks * scheduler_block_size // block_size
        for hit in hits:
            del hit[num_blocks:]
        return hits, num_blocks * block_size

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
        """``get_num_blocks_to_allocate`` on block ids: a running request (in
        ``num_cached_block``) asks the blocks past its table; any other the blocks past
        its table, its hit and the skipped blocks, plus the hit blocks a touch takes off
        the free queue."""
        required = cdiv(num_tokens, self.block_size)
        cap = self.admission_cap
        if admission and cap is not None and cap < required:
            required = cap
        held = len(blocks.block_ids)
        if blocks.num_cached_blocks >= 0:
            return max(required - held, 0)
        skipped = self.num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(required - max(skipped, len(hit) + held), 0)
        touched = hit[max(0, skipped - held) :]
        return num_new + sum(1 for block in touched if block and pool.ref_cnt[block] == 0)

    def add_local_computed_blocks(
        self, pool: BlockPool, blocks: GroupBlocks, hit: tuple[int, ...], num_computed_tokens: int
    ) -> int:
        """``add_local_computed_blocks``: the hit becomes the group's table, the places
        attention skips at ``num_computed_tokens`` null, the rest touched (every place is
        cached already). Returns how many of the touched blocks a running request held."""
        skipped = self.num_skipped_tokens(num_computed_tokens) // self.block_size
        touched = pool.touch([block for block in hit[skipped:] if block])
        blocks.block_ids = [NULL_BLOCK] * skipped + list(hit[skipped:])
        blocks.num_cached_blocks = len(blocks.block_ids)
        return touched

    def num_new_block_ids(
        self, pool: BlockPool, blocks: GroupBlocks, num_tokens: int, num_tokens_main_model: int
    ) -> int:
        """``allocate_new_blocks`` on block ids up to taking blocks: how many the table
        lacks for ``num_tokens`` slots."""
        return cdiv(num_tokens, self.block_size) - len(blocks.block_ids)

    def free_skipped_block_ids(
        self, pool: BlockPool, blocks: GroupBlocks, processed_computed_tokens: int
    ) -> int:
        """``remove_skipped_blocks`` on block ids: the skipped blocks go back to the pool,
        last first. Returns how many."""
        freed = self.skip_places(blocks, blocks.block_ids, NULL_BLOCK, processed_computed_tokens)
        if freed:
            pool.free_blocks(freed)
        return len(freed)

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
        """``cache_blocks`` of group ``index`` once ``num_tokens`` are computed: its full
        blocks of the ``cacheable`` tokens (``_cache_full_blocks``), cut back to the
        scheduler block, where hits land, then its prompt tail
        (``cache_partial_tail_block``)."""
        scheduler_block_size = coordinator.scheduler_block_size
        if not coordinator.one_block_size:
            # A dropping group keeps one block of its own past the scheduler block, the one
            # its hit matches and drops (with one block size, the full blocks counted come
            # out the same either way).
            aligned = cacheable // scheduler_block_size * scheduler_block_size
            if coordinator.drop_groups[index] and num_tokens >= scheduler_block_size:
                cacheable = min(cacheable, aligned + self.block_size)
            else:
                cacheable = aligned
        self._cache_full_blocks(coordinator, pool, request, index, blocks, cacheable)
        self.cache_partial_tail_block(coordinator, pool, request, index, blocks, cacheable)

    def _cache_full_blocks(
        self,
        coordinator: CachingCoordinator,
        pool: BlockPool,
        request: RequestState,
        index: int,
        blocks: GroupBlocks,
        cacheable: int,
    ) -> None:
        """``SingleTypeKVCacheManager.cache_blocks``: the group's full blocks of the
        ``cacheable`` tokens, as far as the hashes go, keyed by the last hash each spans,
        but null places and those ``reachable_block_mask`` leaves out; a key of fewer
        tokens (a prompt tail's) gives way."""
        hashes = request.block_hashes or ()
        num_cached = max(blocks.num_cached_blocks, 0)
        num_full = min(cacheable, len(hashes) * coordinator.block_size) // self.block_size
        if num_cached >= num_full:
            return
        mask = self.reachable_block_mask(coordinator, request, index, num_cached, num_full)
        span = coordinator.hashes_per_block[index]
        # A table shorter than the full blocks caches what it has (vLLM's slice).
        for place in range(num_cached, min(num_full, len(blocks.block_ids))):
            if mask is not None and not mask[place - num_cached]:
                continue
            block = blocks.block_ids[place]
            if not block:
                continue
            key = pool.block_hash[block]
            if key is not None and is_tail_key(key):
                pool.uncache(block)
                key = None
            if key is None:
                pool.cache(block, group_key(hashes[(place + 1) * span - 1], index))
        blocks.num_cached_blocks = num_full

    def reachable_block_mask(
        self,
        coordinator: CachingCoordinator,
        request: RequestState,
        index: int,
        start: int,
        end: int,
        reachable: bool = True,
    ) -> list[bool] | None:
        """``reachable_block_mask``: which of blocks ``start:end`` a later hit can need
        (None: every block, as here: a kind that retention does not thin)."""
        return None

    def cache_partial_tail_block(
        self,
        coordinator: CachingCoordinator,
        pool: BlockPool,
        request: RequestState,
        index: int,
        blocks: GroupBlocks,
        cacheable: int,
    ) -> None:
        """``_cache_partial_tail_block``: a kind that keys no prompt tail keys nothing."""


@dataclass(frozen=True, slots=True)
class FullAttentionManager(SingleTypeKVCacheManager):
    """vLLM's ``FullAttentionManager``: the base rules (every block kept), and a hit that
    is the run of cached blocks from the first (``find_longest_cache_hit``)."""

    @property
    def hit_only_shrinks(self) -> bool:
        return True

    def find_longest_cache_hit(
        self, lookup: HitLookup, max_length: int, drop: bool, scheduler_block_size: int
    ) -> Hits:
        """``FullAttentionManager.find_longest_cache_hit``: the run from the left."""
        return self._hit_from_left(lookup, max_length, drop, scheduler_block_size)

    def cache_partial_tail_block(
        self,
        coordinator: CachingCoordinator,
        pool: BlockPool,
        request: RequestState,
        index: int,
        blocks: GroupBlocks,
        cacheable: int,
    ) -> None:
        """``FullAttentionManager._cache_partial_tail_block``, where the group is coarser
        than the hash: once the ``cacheable`` tokens reach the tail boundary, the block
        holding it takes the tail's key if it has no key yet (one already keyed keeps its
        own: the tail's joins it, unseen here)."""
        if coordinator.hashes_per_block[index] == 1:
            return
        boundary = coordinator.tail_boundary(request, index)
        place = boundary // self.block_size
        if boundary == 0 or boundary > cacheable or place >= len(blocks.block_ids):
            return
        block = blocks.block_ids[place]
        hashes = request.block_hashes or ()
        if block and pool.block_hash[block] is None:
            pool.cache(block, tail_key(hashes[boundary // coordinator.block_size - 1], index))
        coordinator.tails_cached[request.request_id, index] = boundary
