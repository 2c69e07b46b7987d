"""The hybrid coordinator with prefix caching: several KV groups, one block pool that
knows each group's cached blocks by (hash, group).

Mirrors ``HybridKVCacheCoordinator`` (and ``UnitaryKVCacheCoordinator`` for one group of
another kind: its own search alone) with ``enable_caching``. The requests' hashes are of
the GCD of the groups' block sizes (``block_size``, vLLM's ``hash_block_size``), a
group's block keyed by the last hash it spans (the chain makes it name every token
before); hits land on the scheduler block, the LCM, where every group's blocks end
(``scheduler_block_size``); the groups differ in block size only where each is full
attention (MLA alike) or a sliding window, and otherwise share one, the scheduler's and
the hash's:

- a hit is the fixed point across groups (``find_longest_cache_hit``): full attention
  (MLA alike) first, its longest run of cached blocks from the left, cut back to the
  scheduler block (after its drop); then a sliding
  window from the right, the ``cdiv(sliding_window - 1, block_size)`` contiguous blocks
  its window reads ending at the hit (a run starting only where the hit would end on a
  scheduler block, a shorter run cut back to one), the blocks before them null; chunked
  local
  attention the whole chunks before the one the hit ends in as null (outside the next
  token's attention, so counted as computed), then its run of cached blocks from the left
  (it never drops: vLLM asserts against EAGLE with it); each group the others' hit
  cuts (``hybrid_hit_cut`` where one group's own hit is longer than the final one),
  full attention trimmed to the final hit;
- a group drops its last hit block where the release's ``use_eagle`` flags it (the
  group's ``is_eagle_group``, or every group where none is flagged), matching one block
  more first;
- a hit's blocks are touched group by group, the blocks the window skips left null;
  each group caches its full blocks under its own key (a sliding-window group only those
  ``prefix_cache_retention_interval`` retains: ``retained``) of the tokens up to the
  scheduler block (``get_num_cacheable_tokens``: a group that drops its hit's last
  block one block of its own past it), frees what its window skips
  (unhashed blocks to the free queue's head, cached ones to its tail) and, when the
  request ends, its blocks last first, group after group.

A Mamba group (``align`` mode, ``MambaManager``) keeps one state per block boundary:

- its hit is the one cached state block nearest the candidate length, searched from the
  right, the places before it null; it never drops a block (drafters have no Mamba
  layers), so the coordinator gives it no margin either;
- it asks for the state blocks of the main model's tokens and its speculative blocks (no
  lookahead slots), at most one a step (one plus the speculative blocks the first time);
  running, it frees every real block before the last state's, then the state block of
  two steps ago, and moves the speculative blocks left behind to the table's end;
- it caches the state blocks it holds (as ``prefix_cache_retention_interval`` retains
  them), and the prompt's last reusable state (``_cache_partial_tail_block``); a hit on a
  state block cached in the same step waits a step (``cached_blocks_this_step``), since
  that state exists only once the step has run.

What stays out is refused by ``kv_coordinator`` before a manager is built: Mamba out of
``align`` mode, a chunked-local group whose hit would drop its last block (vLLM asserts
against it) and groups of different block sizes beside a chunked-local group (vLLM
asserts its block is the scheduler block) or a Mamba group (partial hash hits and their
copy-on-write tail). A full-attention group coarser than the hash keys its prompt's tail block under
the tail's hash too (``_cache_partial_tail_block``): only a partial-hash search would read
that key, but it makes the block a cached one, freed to the free queue's tail and
evicted when taken again (``tail_key``).

Groups of one spec (vLLM splits a model's layers into groups of
equal size: several Mamba or chunked-local groups beside one full-attention group) are
looked up together, as vLLM's coordinator does: a place is hit only where each of them
has its block cached. The live adapter builds Mamba specs
with prefill checkpoint blocks where the config has them (``mamba_prefill_checkpoint_blocks``):
the chunk ending the prefill then saves the prompt's reusable state inside it, in a place
the group reserves just before the running state's, keyed there (``_cache_checkpoint``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import AddRequest, ModelOutput
from .kv import NO_HIT, PrefixCachingKVCacheManager, cdiv
from .kv_hybrid import HybridKVCacheManager
from .kv_single_type import (
    UNBOUNDED,
    ChunkedLocalAttentionManager,
    FullAttentionManager,
    MambaAlignManager,
    MambaManager,
    SlidingWindowManager,
)
from .prefix_cache import BlockPool
from .state import GroupBlocks, RequestState, SchedulerState
from .violations import UnmirroredVllmCrash

NULL_BLOCK = 0
"""``BlockPool.null_block``'s id: the place of a freed or skipped block."""


def group_key(block_hash: str, group: int) -> str:
    """``make_block_hash_with_group_id``: one pool keeps every group's cached blocks."""
    return f"{block_hash}@{group}"


TAIL = "/tail"
"""What ends a prompt tail's key (``tail_key``), and no full block's."""


def tail_key(block_hash: str, group: int) -> str:
    """``cache_partial_block``'s key of a prompt tail inside a block: never a full block's
    key (a lookup reads only those), but a hash all the same to the free queue."""
    return group_key(block_hash, group) + TAIL


def is_tail_key(key: str) -> bool:
    """Whether ``key`` is a prompt tail's (``tail_key``)."""
    return key.endswith(TAIL)


def _cached_blocks(
    pool: BlockPool,
    hashes: list[str] | tuple[()],
    group_ids: tuple[int, ...],
    place: int,
    span: int = 1,
) -> list[int] | None:
    """The cached block of each of ``group_ids`` at ``place`` (None: one has none), their
    blocks ``span`` hashes long."""
    blocks = []
    for group in group_ids:
        block = pool.get_cached_block(group_key(hashes[(place + 1) * span - 1], group))
        if block is None:
            return None
        blocks.append(block)
    return blocks


@dataclass(frozen=True, slots=True)
class HybridPrefixCachingKVCacheManager(HybridKVCacheManager):
    """``HybridKVCacheManager`` with ``enable_caching``, its groups' blocks in
    ``state.block_pool`` by id (``GroupBlocks.block_ids``); ``state.free_blocks`` is the
    free queue's length and ``request.num_blocks`` the real blocks of every group."""

    hashing: PrefixCachingKVCacheManager | None = None
    """The requests' block hashes (one chain: every group's block size is the hash's)."""
    drop_groups: tuple[bool, ...] = ()
    """Per group, whether its hit drops the last block (the coordinator's
    ``drop_eagle_group_ids`` in 0.33, ``eagle_group_ids`` in 0.32)."""
    lookup_types: tuple[tuple[int, ...], ...] = ()
    """The coordinator's ``attention_groups``: the groups of one spec, looked up together
    (a block is hit only where every one of them has it cached), in
    ``verify_and_split_kv_cache_groups``' order, full attention first."""
    pending_cuts: dict[str, int] = field(default_factory=dict)
    """Tokens the other groups cut off a request's longest single-group hit, from its
    last lookup, counted as ``hybrid_hit_cut`` once the request is admitted."""
    retains_block_below_junction: bool = False
    """The release's ``retains_block_below_junction``."""
    junctions: dict[str, int] = field(default_factory=dict)
    """``Request.shared_prefix_boundary``, from each request's last lookup: the longest
    single-group hit where another group cut it (0 where none did)."""
    cached_this_step: dict[str, int] = field(default_factory=dict)
    """A Mamba group's ``cached_blocks_this_step``, as the step (``state.num_steps``) each
    key was last cached in: vLLM clears the set when a step starts."""
    rekeys_cached_mamba_tail: bool = False
    """The release's ``rekeys_cached_mamba_tail``."""
    num_reprefillable_tokens: int = 0
    """The coordinator's ``num_reprefillable_tokens`` (multi-module MTP): a group that
    drops its hit's last block caches only the tokens computed before them."""
    scheduler_block_size: int = 0
    """``resolve_kv_cache_block_sizes``' scheduler block: the LCM of the groups' block
    sizes, where every hit and every group's cacheable tokens are cut back to."""
    hashes_per_block: tuple[int, ...] = field(init=False)
    """Per group, the hashes one of its blocks spans (its block size over the hash's)."""
    one_block_size: bool = field(init=False)
    """Every group's block is the hash's and the scheduler's: no alignment, no prompt
    tail to key, one count of full blocks for every group (the fast paths rest on it).
    Read off ``groups``."""
    tails_cached: dict[tuple[str, int], int] = field(default_factory=dict)
    """Per (request, group), the prompt tail boundary keyed in its block (``tail_key``)
    since the request last took blocks: keying it again changes nothing the scheduler
    sees (a lookahead's later hashes may move the boundary on)."""
    without_mamba: bool = field(init=False)
    """No group is Mamba: every group counts a running request's blocks past its table
    alike, and caches nothing once its full blocks are cached (the fast paths of
    ``allocate_slots`` and ``cache_blocks``, and the ``kv_slots_covered`` promise, rest
    on it). Read off ``groups``."""

    @property
    def enable_caching(self) -> bool:
        return True

    def __post_init__(self) -> None:
        without_mamba = not any(isinstance(group, MambaManager) for group in self.groups)
        object.__setattr__(self, "without_mamba", without_mamba)
        spans = tuple(group.block_size // self.block_size for group in self.groups)
        assert self.scheduler_block_size > 0 and all(
            self.scheduler_block_size % group.block_size == 0 for group in self.groups
        ), f"scheduler block {self.scheduler_block_size} is no common multiple of the groups'"
        object.__setattr__(self, "hashes_per_block", spans)
        object.__setattr__(self, "one_block_size", self.scheduler_block_size == self.block_size)

    # -- hashes ------------------------------------------------------------------------
    def _hashing(self) -> PrefixCachingKVCacheManager:
        assert self.hashing is not None
        return self.hashing

    def add_request(self, request: RequestState, event: AddRequest) -> None:
        """An empty block table in every group, and the request's block hashes."""
        request.kv_groups = [GroupBlocks() for _ in self.groups]
        self._hashing().add_request(request, event)

    def junction(self, request: RequestState) -> int:
        return self.junctions.get(request.request_id, 0)

    def check_output(self, state: SchedulerState, event: ModelOutput) -> None:
        self._hashing().check_output(state, event)

    def append_output(self, request: RequestState, event: ModelOutput, appended: int) -> None:
        hashes = request.block_hashes
        num_hashes = len(hashes) if hashes is not None else 0
        self._hashing().append_output(request, event, appended)
        if hashes is not None and len(hashes) != num_hashes:
            self._promise(request)  # a new hash: a block to cache

    @staticmethod
    def pool(state: SchedulerState) -> BlockPool:
        """The one shared pool, reached as the single-group caching manager reaches it."""
        return PrefixCachingKVCacheManager.pool(state)

    # -- hits --------------------------------------------------------------------------
    def get_computed_blocks(
        self, state: SchedulerState, request: RequestState
    ) -> tuple[tuple[int, ...], int]:
        """``find_longest_cache_hit`` within ``num_tokens - 1``: every group's hit blocks,
        group after group (each ``tokens // group.block_size`` long), and the tokens hit."""
        pool, hash_block_size = self.pool(state), self.block_size
        hashes = request.block_hashes or ()
        num_groups = len(self.groups)
        hit_length = request.num_tokens - 1
        if num_groups == 1:
            # UnitaryKVCacheCoordinator: the group's own search, no margin for the drop;
            # no other group lags it, so no junction.
            self.junctions[request.request_id] = 0
            (found,), length = self._find(pool, hashes, (0,), hit_length, self.drop_groups[0])
            return (tuple(found), length) if length > 0 else (NO_HIT, 0)
        longest = 0
        blocks_by_group: list[list[int] | None] = [None] * num_groups
        length_by_type = [0] * len(self.lookup_types)
        types = self.lookup_types
        simple = len(types) == 2 and self._is_full(types[0][0])
        eagle_verified: set[int] = set()
        while True:
            current = hit_length
            for index, group_ids in enumerate(types):
                first = group_ids[0]
                if self._is_full(first) and blocks_by_group[first] is not None:
                    # Full attention is downward-closed: its hit only shrinks.
                    current = min(current, length_by_type[index])
                    continue
                drop = self.drop_groups[first] and index not in eagle_verified
                max_length = current
                if drop and not isinstance(self.groups[first], MambaManager):
                    # Match one block more, then drop it: back at the candidate length
                    # (a Mamba search never drops, so it gets no margin either).
                    max_length = min(
                        current + self.groups[first].block_size, len(hashes) * hash_block_size
                    )
                found_by_group, length = self._find(pool, hashes, group_ids, max_length, drop)
                if drop:
                    eagle_verified.add(index)
                elif length < current:
                    eagle_verified.clear()
                current = length
                for group, found in zip(group_ids, found_by_group, strict=True):
                    blocks_by_group[group] = found
                length_by_type[index] = length
                longest = max(longest, current)
            if current >= hit_length:
                break
            hit_length = current
            if simple:
                break
        hit: list[int] = []
        for group, group_hit in enumerate(blocks_by_group):
            found = group_hit or []
            if self._is_full(group):
                del found[cdiv(hit_length, self.groups[group].block_size) :]
            hit += found
        if longest > hit_length:
            self.pending_cuts[request.request_id] = longest - hit_length
        else:
            self.pending_cuts.pop(request.request_id, None)
        # get_computed_blocks' shared_prefix_boundary: where the lagging group would
        # reach once it caches the shared prefix, kept retained for the next sibling.
        self.junctions[request.request_id] = longest if longest > hit_length else 0
        if hit_length <= 0:
            return NO_HIT, 0
        return tuple(hit), hit_length

    def _is_full(self, group: int) -> bool:
        return type(self.groups[group]) is FullAttentionManager

    def _find(
        self,
        pool: BlockPool,
        hashes: list[str] | tuple[()],
        group_ids: tuple[int, ...],
        max_length: int,
        drop: bool,
    ) -> tuple[list[list[int]], int]:
        """The ``find_longest_cache_hit`` of the groups of one spec (their blocks, group by
        group, and the tokens hit) within ``max_length`` tokens: a place is hit only where
        every one of them has its block cached (``BlockPool.get_cached_block``)."""
        manager = self.groups[group_ids[0]]
        block_size, span = manager.block_size, self.hashes_per_block[group_ids[0]]
        max_blocks = max_length // block_size
        num_blocks_hashed = len(hashes) // span
        if max_blocks > num_blocks_hashed and isinstance(
            manager, MambaManager | SlidingWindowManager
        ):
            # These searches start from the right, at the block max_length ends in; only a
            # first lookup (no full-attention group bounded it) of hashes lagging more
            # than a token (0.33's multi-module MTP lookahead) starts past them.
            raise UnmirroredVllmCrash(
                "lookup-past-lookahead-hashes",
                f"vLLM's {type(manager).__name__}.find_longest_cache_hit indexes block"
                f" {max_blocks - 1} of a request's {num_blocks_hashed} block hashes"
                " (IndexError)",
            )

        if isinstance(manager, MambaManager):
            # From the right: the one state block ending at the hit, the places before it
            # null; no drop, as drafters have no Mamba layers.
            for place in range(max_blocks - 1, -1, -1):
                found = _cached_blocks(pool, hashes, group_ids, place)
                if found is not None:
                    return [[NULL_BLOCK] * place + [block] for block in found], (
                        place + 1
                    ) * block_size
            return [[] for _ in group_ids], 0
        if isinstance(manager, SlidingWindowManager):
            # From the right: the window's contiguous blocks (one more where the last
            # is dropped) ending at the hit; those before it are never read.
            need = cdiv(manager.sliding_window - 1, block_size) + (1 if drop else 0)
            # Where the group's block is finer than the scheduler block, a run starts
            # only where the hit (after the drop) would end on a scheduler block.
            per_hit = self.scheduler_block_size // block_size
            hits = [[NULL_BLOCK] * max_blocks for _ in group_ids]
            run = 0
            end = None
            for place in range(max_blocks - 1, -1, -1):
                found = _cached_blocks(pool, hashes, group_ids, place, span)
                if found is None:
                    run = 0
                    continue
                if run == 0 and (place if drop else place + 1) % per_hit:
                    continue
                for hit, block in zip(hits, found, strict=True):
                    hit[place] = block
                run += 1
                if run >= need:
                    end = place + run
                    break
            # A run short of the window counts from the first place on, back to a
            # scheduler block; the drop, again back to one.
            kept = run if end is None else end
            if end is None:
                kept -= kept % per_hit
            if drop and kept:
                kept -= 1
                kept -= kept % per_hit
            for hit in hits:
                del hit[kept:]
            return hits, kept * block_size
        skipped = 0
        if isinstance(manager, ChunkedLocalAttentionManager):
            # The whole chunks before the one holding the hit's end are outside the next
            # token's attention: computed, null, whether cached or not.
            assert not drop, "vLLM asserts against a chunked-local hit that drops a block"
            chunk = manager.attention_chunk_size
            skipped = max(max_length, 0) // chunk * chunk // block_size
        hits = [[NULL_BLOCK] * skipped for _ in group_ids]
        # As far as the hashes go (vLLM's islice): a lookahead of K hashes lags K tokens.
        for place in range(skipped, min(max_blocks, len(hashes) // span)):
            found = _cached_blocks(pool, hashes, group_ids, place, span)
            if found is None:
                break
            for hit, block in zip(hits, found, strict=True):
                hit.append(block)
        if drop and hits[0]:
            for hit in hits:
                hit.pop()
        # Back to the scheduler block, where every group's blocks end (with one block
        # size, every block ends on one).
        num_blocks = len(hits[0]) * block_size // self.scheduler_block_size
        num_blocks = num_blocks * self.scheduler_block_size // block_size
        for hit in hits:
            del hit[num_blocks:]
        return hits, num_blocks * block_size

    def _split_hit(self, hit: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The flat hit of ``get_computed_blocks``, per group: a hit ends on a scheduler
        block, of which each group holds its share of blocks."""
        if not hit:
            return [() for _ in self.groups]
        shares = [self.scheduler_block_size // group.block_size for group in self.groups]
        num_scheduler_blocks = len(hit) // sum(shares)
        split, start = [], 0
        for share in shares:
            end = start + share * num_scheduler_blocks
            split.append(hit[start:end])
            start = end
        return split

    def _hit_tokens(self, hits: list[tuple[int, ...]]) -> int:
        """The tokens a split hit covers: every group's blocks reach the same token."""
        return len(hits[0]) * self.groups[0].block_size

    # -- allocation ----------------------------------------------------------------------
    def _num_blocks_to_allocate(
        self,
        pool: BlockPool,
        group: FullAttentionManager,
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
        if isinstance(group, MambaAlignManager):
            checkpoint = self._reserve_checkpoint(
                group,
                blocks,
                blocks.block_ids,
                total_computed_tokens,
                num_tokens_main_model,
                prefill_end,
                admission,
            )
            # Plus the hit blocks a touch takes off the free queue.
            num_new = group.num_new_states(
                blocks, len(hit) + len(blocks.block_ids), num_tokens_main_model, checkpoint
            )
            return num_new + sum(1 for block in hit if block and pool.ref_cnt[block] == 0)
        required = cdiv(num_tokens, group.block_size)
        cap = group.admission_cap
        if admission and cap is not None and cap < required:
            required = cap
        held = len(blocks.block_ids)
        if blocks.num_cached_blocks >= 0:
            return max(required - held, 0)
        skipped = group.num_skipped_tokens(total_computed_tokens) // group.block_size
        num_new = max(required - max(skipped, len(hit) + held), 0)
        touched = hit[max(0, skipped - held) :]
        return num_new + sum(1 for block in touched if block and pool.ref_cnt[block] == 0)

    def _hit_state_pending(self, state: SchedulerState, hits: list[tuple[int, ...]]) -> bool:
        """Whether a Mamba group's hit ends on a state block cached in this very step:
        vLLM then asks for more blocks than the pool has (``num_gpu_blocks + 1``), so the
        request waits a step, until the state exists."""
        pool = self.pool(state)
        for group, hit in zip(self.groups, hits, strict=True):
            if hit and isinstance(group, MambaManager):
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
                self._add_hit(pool, group, blocks, group_hit, num_local_computed)
        for group, blocks, _ in groups:
            if isinstance(group, MambaAlignManager):
                num_new = self._place_mamba_blocks(pool, group, blocks, main)
            else:
                num_new = cdiv(need_slot, group.block_size) - len(blocks.block_ids)
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
        state.free_blocks = pool.num_free_blocks
        cut = self.pending_cuts.pop(request.request_id, 0)
        if cut:
            self.observed["hybrid_hit_cut"] += 1
        if hits[0] and not self.one_block_size:
            self.observed["hit_across_block_sizes"] += 1
        self._cache_blocks(state, request, min(total_computed + num_new_tokens, request.num_tokens))
        self._promise(request)
        return True

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
                tail = self._tail_boundary(request, index)
                if 0 < tail <= limit:
                    limit = tail - 1
            if limit < covered:
                covered = limit
        request.kv_slots_covered = covered

    @staticmethod
    def _place_mamba_blocks(
        pool: BlockPool, group: MambaAlignManager, blocks: GroupBlocks, num_tokens_main_model: int
    ) -> int:
        """``MambaManager.allocate_new_blocks`` up to taking blocks (``place_states``) on
        the group's block ids, with vLLM's assertions on what it moves and takes."""
        allocated, checkpoint = blocks.allocated, blocks.checkpoint_position > 0
        num_new, moved = group.place_states(
            blocks, blocks.block_ids, NULL_BLOCK, num_tokens_main_model, checkpoint
        )
        for block in moved:
            if not block or pool.ref_cnt[block] != 1 or pool.block_hash[block] is not None:
                raise UnmirroredVllmCrash(
                    "mamba-moves-a-shared-block",
                    "vLLM's MambaManager asserts a speculative block it moves is its own"
                    f" and uncached, but block {block} is shared or cached",
                )
        if num_new > (1 if allocated else 1 + group.num_speculative_blocks) + checkpoint:
            raise UnmirroredVllmCrash(
                "mamba-takes-several-state-blocks",
                "vLLM's MambaManager asserts it takes at most one state block a step,"
                f" not {num_new}",
            )
        return num_new

    def _add_hit(
        self,
        pool: BlockPool,
        group: FullAttentionManager,
        blocks: GroupBlocks,
        hit: tuple[int, ...],
        num_local_computed: int,
    ) -> None:
        """``add_local_computed_blocks``: the blocks the window skips stay null, the rest
        are touched; every place is cached already."""
        skipped = group.num_skipped_tokens(num_local_computed) // group.block_size
        kept = [block for block in hit[skipped:] if block]
        self.observed["hit_on_running_block"] += pool.touch(kept)
        blocks.block_ids = [NULL_BLOCK] * skipped + list(hit[skipped:])
        blocks.num_cached_blocks = len(blocks.block_ids)

    def remove_skipped_blocks(
        self, state: SchedulerState, request: RequestState, processed_computed_tokens: int
    ) -> None:
        """``remove_skipped_blocks``: each group frees, last first back to the first null
        place, the blocks attention no longer reads."""
        pool = self.pool(state)
        # One GroupBlocks per group (add_request), indexed as HybridKVCacheManager's are.
        for index, group in enumerate(self.groups):
            blocks = request.kv_groups[index]
            if isinstance(group, MambaAlignManager):
                request.num_blocks -= self._retire_mamba_blocks(
                    pool, group, blocks, processed_computed_tokens
                )
                continue
            freed = group.skip_places(
                blocks, blocks.block_ids, NULL_BLOCK, processed_computed_tokens
            )
            if freed:
                pool.free_blocks(freed)
                request.num_blocks -= len(freed)
                if group.recycles_window:
                    self.observed["window_blocks_freed"] += len(freed)
        state.free_blocks = pool.num_free_blocks
        if self.without_mamba:
            request.kv_skip_horizon = self._skip_horizon(request)

    @staticmethod
    def _retire_mamba_blocks(
        pool: BlockPool,
        group: MambaAlignManager,
        blocks: GroupBlocks,
        processed_computed_tokens: int,
    ) -> int:
        """``MambaManager.remove_skipped_blocks`` (``retire_states``) on the group's block
        ids: the blocks before the last state's go back to the pool in one call, the
        state block of two steps ago in another (the free queue's order depends on it).
        Returns how many went back."""
        retired, state = group.retire_states(
            blocks, blocks.block_ids, NULL_BLOCK, processed_computed_tokens
        )
        for freed in (retired, state):
            if freed:
                pool.free_blocks(freed)
        return len(retired) + len(state)

    def cache_blocks(self, state: SchedulerState, request: RequestState, num_tokens: int) -> None:
        """``_cache_blocks``, the promise kept."""
        if self._cache_blocks(state, request, num_tokens):
            self._promise(request)

    def _cache_blocks(self, state: SchedulerState, request: RequestState, num_tokens: int) -> bool:
        """The coordinator's ``cache_blocks``: each group's full blocks of the first
        ``num_tokens`` tokens (as far as the request has hashes) get its key, but null
        places and the sliding-window blocks retention drops (``retained``); a Mamba
        group keys its state blocks instead (``_cache_mamba_blocks``). Returns whether
        it looked (False: every group caches that far already)."""
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
                if 0 < self._tail_boundary(request, index) <= num_tokens:
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
        for index, group in enumerate(self.groups):
            blocks = request.kv_groups[index]
            cacheable = num_tokens
            if finalized != num_tokens and self.drop_groups[index]:
                cacheable = finalized
            if isinstance(group, MambaAlignManager):
                self._cache_mamba_blocks(state, request, index, blocks, cacheable)
                continue
            if not self.one_block_size:
                # Cut back to the scheduler block, where hits land; a dropping group keeps
                # one block of its own past it, the one its hit matches and drops (with one
                # block size, the full blocks counted come out the same either way).
                aligned = cacheable // scheduler_block_size * scheduler_block_size
                if self.drop_groups[index] and num_tokens >= scheduler_block_size:
                    cacheable = min(cacheable, aligned + group.block_size)
                else:
                    cacheable = aligned
            self._cache_full_blocks(pool, request, index, group, blocks, cacheable)
            if self.hashes_per_block[index] > 1 and type(group) is FullAttentionManager:
                self._cache_prompt_tail(pool, request, index, blocks, cacheable)
        return True

    def _cache_full_blocks(
        self,
        pool: BlockPool,
        request: RequestState,
        index: int,
        group: FullAttentionManager,
        blocks: GroupBlocks,
        cacheable: int,
    ) -> None:
        """``SingleTypeKVCacheManager.cache_blocks`` of group ``index``: its full blocks of
        the ``cacheable`` tokens, as far as the hashes go, keyed by the last hash each
        spans; a key of fewer tokens (a prompt tail's) gives way."""
        hashes = request.block_hashes or ()
        num_cached = max(blocks.num_cached_blocks, 0)
        num_full = min(cacheable, len(hashes) * self.block_size) // group.block_size
        if num_cached < num_full:
            mask = None
            if isinstance(group, SlidingWindowManager):
                mask = self.retained(request, index, group, num_cached, num_full)
            span = self.hashes_per_block[index]
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

    def _tail_boundary(self, request: RequestState, index: int) -> int:
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

    def _cache_prompt_tail(
        self,
        pool: BlockPool,
        request: RequestState,
        index: int,
        blocks: GroupBlocks,
        cacheable: int,
    ) -> None:
        """``FullAttentionManager._cache_partial_tail_block``: once the ``cacheable`` tokens
        reach the tail boundary, the block holding it takes the tail's key if it has no
        key yet (one already keyed keeps its own: the tail's joins it, unseen here)."""
        boundary = self._tail_boundary(request, index)
        place = boundary // self.groups[index].block_size
        if boundary == 0 or boundary > cacheable or place >= len(blocks.block_ids):
            return
        block = blocks.block_ids[place]
        hashes = request.block_hashes or ()
        if block and pool.block_hash[block] is None:
            pool.cache(block, tail_key(hashes[boundary // self.block_size - 1], index))
        self.tails_cached[request.request_id, index] = boundary

    def _cache_mamba_blocks(
        self,
        state: SchedulerState,
        request: RequestState,
        index: int,
        blocks: GroupBlocks,
        num_tokens: int,
    ) -> None:
        """``MambaManager.cache_blocks`` in ``align`` mode: the state blocks up to the
        cacheable tokens get their key where retention keeps them (``mamba_retained``),
        then the prompt's last reusable state (``_cache_partial_tail_block``); each key
        cached joins ``cached_this_step``."""
        pool, block_size = self.pool(state), self.block_size
        hashes = request.block_hashes or ()
        ids, step = blocks.block_ids, state.num_steps
        # get_num_cacheable_tokens: a group that does not drop its last hit block caches up
        # to a block boundary.
        cacheable = num_tokens if self.drop_groups[index] else num_tokens // block_size * block_size
        num_cached = max(blocks.num_cached_blocks, 0)
        num_full = min(cacheable, len(hashes) * block_size) // block_size
        if num_cached < num_full:
            mask = self.mamba_retained(request, index, num_cached, num_full)
            for place in range(num_cached, min(num_full, len(ids))):
                block = ids[place]
                if not block or (mask is not None and not mask[place - num_cached]):
                    continue
                key = pool.block_hash[block]
                if key is None:
                    key = group_key(hashes[place], index)
                    pool.cache(block, key)
                self.cached_this_step[key] = step
            blocks.num_cached_blocks = num_full
        if blocks.checkpoint_position:
            self._cache_checkpoint(pool, request, index, blocks, step)
            return
        if (
            cacheable <= 0
            or cacheable % block_size
            or cacheable != self._checkpoint_position(request.prompt_len)
        ):
            return
        place = cacheable // block_size - 1
        if place >= len(ids) or not ids[place]:
            return
        block, key = ids[place], group_key(hashes[place], index)
        if pool.block_hash[block] == key:
            # 0.33 leaves a state keyed at this boundary already alone; 0.32 marks it
            # cached this step again, so a sibling's hit on it waits another step.
            if self.rekeys_cached_mamba_tail:
                self.cached_this_step[key] = step
            return
        # A state block only ever holds its own place's state: keyed here or not at all.
        assert pool.block_hash[block] is None, f"Mamba block {block} keyed at another place"
        pool.cache(block, key)
        self.cached_this_step[key] = step

    def _cache_checkpoint(
        self, pool: BlockPool, request: RequestState, index: int, blocks: GroupBlocks, step: int
    ) -> None:
        """``_cache_partial_tail_block`` with this step's prefill checkpoint: its block
        is keyed at the checkpoint (replacing any key it had) where a later request can
        resume there (the prompt's last reusable state, a retained boundary or the
        junction); else the state there is transient and the block loses its key."""
        position, block_size = blocks.checkpoint_position, self.block_size
        block = blocks.block_ids[blocks.checkpoint_place]
        at = position // block_size - 1
        mask = self.mamba_retained(request, index, at, at + 1, reachable=False)
        if (
            position != self._checkpoint_position(request.prompt_len)
            and mask is not None
            and not mask[0]
            and position != self.junction(request)
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
        self.cached_this_step[key] = step

    def mamba_retained(
        self, request: RequestState, index: int, start: int, end: int, reachable: bool = True
    ) -> list[bool] | None:
        """``MambaManager.reachable_block_mask`` for blocks ``start:end`` of group
        ``index`` (None: every block). A hit needs only the one state block ending at it:
        at ``retention_interval`` None every block, at N > 0 the last of each N-token
        segment (every block where N is a block or less), and from 0 on also those ending
        at the places a later request resumes (``reachable_boundaries``; a checkpoint's
        check passes none: ``reachable`` False)."""
        block_size, interval = self.block_size, self.retention_interval
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
        for boundary in self.reachable_boundaries(request, index) if reachable else ():
            place = boundary // block_size - 1
            if start <= place < end:
                mask[place - start] = True
        return mask

    def reachable_boundaries(self, request: RequestState, index: int) -> list[int]:
        """The base ``cache_blocks``' reachable boundaries of group ``index``: where a
        replay resumes (``replay_boundaries``) and the shared-prefix junction, with, in a
        dropping group where the release keeps it, the block below the junction (a
        sibling diverging right after the junction cannot peek the block past it, so its
        hit lands one block lower)."""
        boundaries = list(self.replay_boundaries(request.prompt_len))
        junction = self.junctions.get(request.request_id, 0)
        if junction:
            boundaries.append(junction)
            if self.drop_groups[index] and self.retains_block_below_junction:
                boundaries.append(junction - self.groups[index].block_size)
        return boundaries

    def retained(
        self,
        request: RequestState,
        index: int,
        group: SlidingWindowManager,
        start: int,
        end: int,
    ) -> list[bool] | None:
        """``SlidingWindowManager.reachable_block_mask`` for blocks ``start:end`` of group
        ``index`` (None: every block). A hit needs the window's contiguous blocks (one
        more where the group drops its last) ending at a hit boundary, so only those
        tails are worth caching: at ``retention_interval`` None one at every scheduler
        block, at N > 0 one per N-token segment, and from 0 on also the ones ending at
        the scheduler block at or below each place a later request resumes
        (``replay_boundaries``, the junction)."""
        block_size, interval = group.block_size, self.retention_interval
        scheduler_block_size = self.scheduler_block_size
        eagle = self.drop_groups[index]
        need = cdiv(group.sliding_window - 1, block_size) + int(eagle)
        # A dropping group's run ends one block past the boundary it lands back on.
        shift = int(eagle)
        mask = [False] * (end - start)
        segment = scheduler_block_size if interval is None else interval
        if segment:
            per_segment = segment // block_size
            if need >= per_segment:
                return None
            for place in range(max(start, shift), end):
                if (place - shift) % per_segment >= per_segment - need:
                    mask[place - start] = True
        if interval is None:
            return mask
        for boundary in self.reachable_boundaries(request, index):
            aligned = boundary // scheduler_block_size * scheduler_block_size
            tail_end = aligned // block_size + shift
            for place in range(max(start, tail_end - need), min(end, tail_end)):
                mask[place - start] = True
        return mask

    def replay_boundaries(self, prompt_len: int) -> tuple[int, ...]:
        """``replay_boundaries``: where a later request replaying the prompt resumes: a
        resend of it at ``prompt_len - 1`` (its last token is recomputed); where a group
        drops its last hit block, the scheduler block below a resend's and a longer
        sibling's hit, both on scheduler blocks."""
        if not any(self.drop_groups):
            return (prompt_len - 1,)
        block_size = self.scheduler_block_size
        resend = (prompt_len - 1) // block_size * block_size
        extension = prompt_len // block_size * block_size
        return tuple(sorted({max(resend - block_size, 0), max(extension - block_size, 0)}))

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
