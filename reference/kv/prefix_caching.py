"""The one-group coordinator with prefix caching: one full-attention group's blocks by id
in the state's ``BlockPool``, its hit found by ``FullAttentionManager`` as every
full-attention group's is (vLLM's ``UnitaryKVCacheCoordinator``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import AddRequest, InvalidEvent, ModelOutput
from ..prefix_cache import BlockPool, HitRule, hash_blocks
from ..state import FINISHED, RequestState, SchedulerState
from .blocks import NO_HIT
from .counting import KVCacheManager
from .single_type import FullAttentionManager, HitLookup


@dataclass(frozen=True, slots=True)
class PrefixCachingKVCacheManager(KVCacheManager):
    """``KVCacheManager`` with ``enable_caching``: the blocks of ``state.block_pool``
    by id. A request's blocks are ``request.block_ids`` (``request.num_blocks`` their
    count) and ``state.free_blocks`` is the free queue's length, so the count decides
    every allocation as without caching, and the pool then carries it out."""

    rule: HitRule
    observed: dict[str, int]
    """The scheduler's ``observed``: the pool's events are counted there."""
    num_reprefillable_tokens: int = 0
    """The coordinator's ``num_reprefillable_tokens``: the last tokens computed that the
    multi-module MTP drafter may prefill again, cached only once the next chunk is
    (``EngineConfig.num_reprefillable_tokens``)."""
    group: FullAttentionManager = field(init=False)
    """The one group's manager, whose hit search is every full-attention group's."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "group", FullAttentionManager(self.block_size))

    @property
    def enable_caching(self) -> bool:
        return True

    def add_request(self, request: RequestState, event: AddRequest) -> None:
        """A request carries what its block hashes are made of: its prompt's ids
        (hashed here), or (a recorded trace) the hashes themselves."""
        rid, ids, hashes = event.request_id, event.prompt_token_ids, event.block_hashes
        if (ids is None) == (hashes is None):
            raise InvalidEvent(
                f"request {rid!r}: with enable_prefix_caching it must carry exactly one of"
                " prompt_token_ids and block_hashes"
            )
        if ids is not None:
            if len(ids) != event.prompt_len:
                raise InvalidEvent(
                    f"request {rid!r}: {len(ids)} prompt_token_ids for prompt_len"
                    f" {event.prompt_len}"
                )
            request.token_ids = list(ids)
            request.block_hashes = hash_blocks(
                None, ids, self.block_size, lookahead=self.rule.num_hash_lookahead_tokens
            )
        else:
            assert hashes is not None
            self._check_num_hashes(rid, len(hashes), event.prompt_len)
            request.block_hashes = list(hashes)

    def _check_num_hashes(self, rid: str, num_hashes: int, num_tokens: int) -> None:
        """A request's vLLM block hashes are one per full block of its tokens (with
        lookahead hashes: of its tokens but the last ``num_hash_lookahead_tokens``)."""
        expected = self.rule.num_hashes(num_tokens, self.block_size)
        if num_hashes != expected:
            raise InvalidEvent(
                f"request {rid!r}: {num_hashes} block hashes for {num_tokens} tokens;"
                f" block_size {self.block_size} makes {expected}"
            )

    def check_output(self, state: SchedulerState, event: ModelOutput) -> None:
        """Every request that sampled reports what it sampled in the form it was added
        with: ids, or the block hashes it gained."""
        requests, sampled = state.requests, event.num_sampled
        token_ids, block_hashes = event.token_ids, event.block_hashes
        for carried in (token_ids, block_hashes):
            for rid in carried:
                if not sampled.get(rid, 0):
                    raise InvalidEvent(
                        f"model output carries token ids or hashes for {rid!r}, which sampled none"
                    )
        for rid, num_sampled in sampled.items():
            if not num_sampled:
                continue
            request = requests[rid]
            if request.status in FINISHED:
                continue  # a finished request's output is dropped
            if request.token_ids is not None:
                ids = token_ids.get(rid)
                if ids is None or len(ids) != num_sampled:
                    raise InvalidEvent(
                        f"request {rid!r} sampled {num_sampled} tokens; its model output"
                        f" must carry as many token_ids, got {None if ids is None else len(ids)}"
                    )
            elif rid not in block_hashes:
                raise InvalidEvent(
                    f"request {rid!r} sampled {num_sampled} tokens; its model output must"
                    " carry the block_hashes it gained"
                )

    def append_output(self, request: RequestState, event: ModelOutput, appended: int) -> None:
        """The hashes of the full blocks the appended tokens complete (from their ids, or
        as the event reports them)."""
        hashes, rid = request.block_hashes, request.request_id
        assert hashes is not None
        ids = request.token_ids
        block_size = self.block_size
        if ids is not None:
            ids.extend(event.token_ids[rid][:appended])
            start = len(hashes) * block_size
            lookahead = self.rule.num_hash_lookahead_tokens
            if len(ids) - lookahead < start + block_size:
                return  # most outputs complete no block: no hash, the promise stands
            parent = hashes[-1] if hashes else None
            hashes += hash_blocks(parent, ids, block_size, start=start, lookahead=lookahead)
        else:
            hashes += event.block_hashes.get(rid, ())
            self._check_num_hashes(rid, len(hashes), request.num_tokens)
        self._promise(request)

    @staticmethod
    def pool(state: SchedulerState) -> BlockPool:
        pool = state.block_pool
        assert pool is not None, "prefix caching runs on a state with a block pool"
        return pool

    def get_computed_blocks(
        self, state: SchedulerState, request: RequestState
    ) -> tuple[tuple[int, ...], int]:
        """``UnitaryKVCacheCoordinator.find_longest_cache_hit``: the one group's
        ``FullAttentionManager.find_longest_cache_hit`` within ``num_tokens - 1`` (the last
        token is recomputed for its logits), keyed by the bare hashes; with
        ``drop_last_block`` the last block hit is recomputed too."""
        hashes = request.block_hashes or ()
        lookup = HitLookup(self.pool(state), hashes, (0,), keyed_by_group=False)
        (blocks,), length = self.group.find_longest_cache_hit(
            lookup, request.num_tokens - 1, self.rule.drop_last_block, self.block_size
        )
        return tuple(blocks), length

    def full_sequence_fits(
        self, state: SchedulerState, request: RequestState, hit: tuple[int, ...] = NO_HIT
    ) -> bool:
        """The count's gate, the hit's blocks held and its free ones taken (a touch
        takes them off the free queue): ``get_num_blocks_to_allocate``'s evictable."""
        evictable = self.pool(state).num_evictable(hit)
        return self._fits_full_sequence(
            request, request.num_blocks + len(hit), state.free_blocks - evictable
        )

    def allocate_slots(
        self,
        state: SchedulerState,
        request: RequestState,
        num_new_tokens: int,
        hit: tuple[int, ...] = NO_HIT,
    ) -> bool:
        """The count decides, the hit counted as computed and held and its free blocks
        as taken; then the pool touches the hit, hands out the new blocks (evicting
        their hashes), and caches every full block of the tokens computed by the end of
        the step (never a draft or lookahead slot: ``min(computed + new, num_tokens)``,
        within the hashes the request has)."""
        pool, block_ids, block_size = self.pool(state), request.block_ids, self.block_size
        # Every running request asks with no hit: spare it the count over nothing.
        evictable = pool.num_evictable(hit) if hit else 0
        held = len(block_ids) + len(hit)
        num_computed = request.num_computed_tokens + len(hit) * block_size
        wanted = self._num_blocks_wanted(num_computed, held, num_new_tokens)
        if wanted > 0 or hit:
            if wanted < 0:
                wanted = 0
            if evictable + wanted > state.free_blocks:
                return False
            state.free_blocks -= evictable + wanted
            request.num_blocks = held + wanted
            if hit:
                self.observed["hit_on_running_block"] += pool.touch(hit)
                block_ids.extend(hit)
                request.num_cached_blocks = len(block_ids)
            if wanted:
                new_blocks, evicted = pool.get_new_blocks(wanted)
                self.observed["cached_block_evicted"] += evicted
                block_ids.extend(new_blocks)
        # request.num_tokens, inlined: the RUNNING loop asks here past every block.
        num_tokens = request.prompt_len + request.num_output_tokens
        computed = num_computed + num_new_tokens
        self.cache_blocks(state, request, computed if computed < num_tokens else num_tokens)
        self._promise(request)
        return True

    def _promise(self, request: RequestState) -> None:
        """Set ``kv_slots_covered``: within it the blocks held cover the step (as without
        caching) and no hashed block past the cached ones is reached, so allocating
        would take and cache nothing. Kept wherever blocks, hashes or cached blocks
        change (``allocate_slots``, ``append_output``, ``cache_blocks``, ``free``).

        Not for a request of several KV groups, whose coordinator hashes through this
        manager but makes no promise (its RUNNING loop asks every step)."""
        if request.kv_groups:
            return
        block_size = self.block_size
        covered = request.num_blocks * block_size - self.num_lookahead_tokens
        hashes = request.block_hashes
        if hashes is not None and len(hashes) > request.num_cached_blocks:
            next_full = (request.num_cached_blocks + 1) * block_size - 1
            next_full += self.num_reprefillable_tokens
            if next_full < covered:
                covered = next_full
        request.kv_slots_covered = covered

    def cache_blocks(self, state: SchedulerState, request: RequestState, num_tokens: int) -> None:
        """``cache_blocks``: the full blocks of the first ``num_tokens`` tokens but the
        re-prefillable ones get the request's hashes (as far as it has them: lookahead
        hashes lag a token)."""
        num_full = (num_tokens - self.num_reprefillable_tokens) // self.block_size
        if num_full <= request.num_cached_blocks:
            return
        hashes = request.block_hashes or ()
        if num_full > len(hashes):
            num_full = len(hashes)
        if num_full > request.num_cached_blocks:
            self.pool(state).cache_full_blocks(
                request.block_ids, hashes, request.num_cached_blocks, num_full
            )
            request.num_cached_blocks = num_full
            self._promise(request)

    def free(self, state: SchedulerState, request: RequestState) -> None:
        """``free``: the blocks go back last first, so a request's tail is evicted
        before its head; a block another request holds stays held."""
        pool = self.pool(state)
        pool.free_blocks(reversed(request.block_ids))
        request.block_ids = []
        request.num_blocks = 0
        request.num_cached_blocks = 0
        request.kv_slots_covered = 0
        state.free_blocks = pool.num_free_blocks
