"""The hybrid coordinator's cache hit with prefix caching: vLLM's
``HybridKVCacheCoordinator.find_longest_cache_hit`` (``UnitaryKVCacheCoordinator``'s for
one group), over its groups' kind managers, and the boundaries a later hit resumes at.

A hit is the fixed point across the lookups of the groups of one spec (looked up
together: a place is hit only where each of them has its block cached): full attention
(MLA alike) first, whose hit only shrinks, then every other kind, each cutting the
candidate length (``hybrid_hit_cut`` where one group's own hit is longer than the final
one), full attention trimmed to the final hit. A group drops its last hit block where
the release's ``use_eagle`` flags it, matching its kind's ``drop_margin`` more first.
Every kind searches its own way (``find_longest_cache_hit`` of its manager).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import AddRequest, ModelOutput
from ..prefix_cache import BlockPool
from ..state import GroupBlocks, RequestState, SchedulerState
from .blocks import NO_HIT, cdiv
from .hybrid import HybridKVCacheManager
from .prefix_caching import PrefixCachingKVCacheManager
from .single_type import HitLookup, Hits


@dataclass(frozen=True, slots=True)
class HybridCacheHits(HybridKVCacheManager):
    """The hybrid coordinator's requests' hashes and cache hits, with caching on (the
    allocation and caching are ``HybridPrefixCachingKVCacheManager``'s)."""

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
    scheduler_block_size: int = 0
    """``resolve_kv_cache_block_sizes``' scheduler block: the LCM of the groups' block
    sizes, where every hit and every group's cacheable tokens are cut back to."""
    hashes_per_block: tuple[int, ...] = field(init=False)
    """Per group, the hashes one of its blocks spans (its block size over the hash's)."""
    one_block_size: bool = field(init=False)
    """Every group's block is the hash's and the scheduler's: no alignment, no prompt
    tail to key, one count of full blocks for every group (the fast paths rest on it).
    Read off ``groups``."""
    without_mamba: bool = field(init=False)
    """No group is Mamba: every group counts a running request's blocks past its table
    alike, and caches nothing once its full blocks are cached (the fast paths of
    ``allocate_slots`` and ``cache_blocks``, and the ``kv_slots_covered`` promise, rest
    on it). Read off ``groups``."""

    @property
    def enable_caching(self) -> bool:
        return True

    def __post_init__(self) -> None:
        without_mamba = not any(group.holds_states for group in self.groups)
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
        """The one shared pool, reached as the one-group caching manager reaches it."""
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
        simple = len(types) == 2 and self.groups[types[0][0]].hit_only_shrinks
        eagle_verified: set[int] = set()
        while True:
            current = hit_length
            for index, group_ids in enumerate(types):
                first = group_ids[0]
                if self.groups[first].hit_only_shrinks and blocks_by_group[first] is not None:
                    # Full attention is downward-closed: its hit only shrinks.
                    current = min(current, length_by_type[index])
                    continue
                drop = self.drop_groups[first] and index not in eagle_verified
                max_length = current
                margin = self.groups[first].drop_margin()
                if drop and margin:
                    # Match one block more, then drop it: back at the candidate length.
                    max_length = min(current + margin, len(hashes) * hash_block_size)
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
            if self.groups[group].hit_only_shrinks:
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

    def _find(
        self,
        pool: BlockPool,
        hashes: list[str] | tuple[()],
        group_ids: tuple[int, ...],
        max_length: int,
        drop: bool,
    ) -> Hits:
        """The ``find_longest_cache_hit`` of the groups of one spec (their blocks, group by
        group, and the tokens hit) within ``max_length`` tokens, by their kind's manager."""
        first = group_ids[0]
        lookup = HitLookup(pool, hashes, group_ids, self.hashes_per_block[first])
        manager = self.groups[first]
        return manager.find_longest_cache_hit(lookup, max_length, drop, self.scheduler_block_size)

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
