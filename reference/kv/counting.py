"""The one-group coordinator without prefix caching (vLLM's
``KVCacheCoordinatorNoPrefixCache`` for one full-attention group): the KV manager's
interface, and block counts alone.

Mirrors ``KVCacheManager.allocate_slots`` with ``FullAttentionManager``: a request holds
``cdiv(min(num_computed + num_new + num_lookahead_tokens, max_model_len), block_size)``
blocks, never fewer than it already has (blocks for rejected drafts are kept), and the
pool lends ``num_gpu_blocks - 1`` of its blocks (``BlockPool`` keeps the first as the
null block). Watermark 0 (vLLM's default), so admissions get no extra headroom check.

A waiting request is admitted only if its whole current sequence would fit in the free
blocks (vLLM's ``scheduler_reserve_full_isl``, on by default: ``allocate_slots`` with
``full_sequence_must_fit``). That gate checks, it does not reserve: the request still
takes only the blocks of its first chunk.

One interface, four managers: ``KVCacheManager`` counts blocks (prefix caching off: no
block has an identity worth keeping), ``PrefixCachingKVCacheManager``
(``prefix_caching.py``) keeps the state's ``BlockPool`` (docs/design.md §6); the count
decides for both. The scheduler asks a manager about every block a request holds, finds
or caches, and hands it what a request's blocks are made of (its token ids or block
hashes) as they come: it never looks at prefix caching itself, so another kind of KV
group, or several, is another manager: the hybrid coordinator (``hybrid.py``, with
caching ``hybrid_caching.py``), picked by ``coordinator.manager_for``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..events import AddRequest, ModelOutput
from ..state import RequestState, SchedulerState
from .blocks import NO_HIT, cdiv, usable_blocks


@dataclass(frozen=True, slots=True)
class KVCacheManager:
    """``KVCacheManager``'s block accounting for one config, on a state's pool: the
    block counts alone (prefix caching off)."""

    block_size: int
    max_model_len: int
    num_lookahead_tokens: int

    @property
    def enable_caching(self) -> bool:
        """vLLM's ``KVCacheManager.enable_caching``: whether blocks are known by their
        hashes, so that requests carry what those are made of and outputs extend it."""
        return False

    def add_request(self, request: RequestState, event: AddRequest) -> None:
        """A new request's blocks-to-be: nothing to know without caching."""

    def check_output(self, state: SchedulerState, event: ModelOutput) -> None:
        """Refuse a model output that lacks what the manager needs of it: nothing here."""

    def append_output(self, request: RequestState, event: ModelOutput, appended: int) -> None:
        """``Request.append_output_token_ids``' share of the blocks: nothing here."""

    def get_computed_blocks(
        self, state: SchedulerState, request: RequestState
    ) -> tuple[tuple[int, ...], int]:
        """``get_computed_blocks``: a waiting request's cache hit (blocks, tokens)."""
        return NO_HIT, 0

    def allocate_slots(
        self,
        state: SchedulerState,
        request: RequestState,
        num_new_tokens: int,
        hit: tuple[int, ...] = NO_HIT,
    ) -> bool:
        """Give ``request`` the blocks it needs to compute ``num_new_tokens`` more
        (``get_num_blocks_to_allocate``: up to ``num_lookahead_tokens`` past them, capped
        at ``max_model_len``, none taken back); False, and no change, if the pool is short.

        The count is ``_num_blocks_wanted``, which the caching manager asks too. (vLLM
        also caps ``num_computed_tokens`` at ``max_model_len`` first; with
        ``num_new_tokens, num_lookahead_tokens >= 0`` the outer cap makes that a no-op.)"""
        wanted = self._num_blocks_wanted(
            request.num_computed_tokens, request.num_blocks, num_new_tokens
        )
        if wanted <= 0:
            return True
        if wanted > state.free_blocks:
            return False
        state.free_blocks -= wanted
        request.num_blocks += wanted
        # Within this many computed tokens the blocks held cover the lookahead too, so
        # the next call would find wanted <= 0 (past max_model_len's cap it may ask
        # needlessly, never wrongly): the RUNNING loop asks only past it.
        request.kv_slots_covered = request.num_blocks * self.block_size - self.num_lookahead_tokens
        return True

    def slots_needed(self, num_computed: int, num_new_tokens: int) -> int:
        """``allocate_slots``' ``num_tokens_need_slot``: the slots a table covers to
        compute ``num_new_tokens`` past ``num_computed``, the lookahead's included,
        capped at ``max_model_len``."""
        need_slot = num_computed + num_new_tokens + self.num_lookahead_tokens
        return need_slot if need_slot < self.max_model_len else self.max_model_len

    def _num_blocks_wanted(self, num_computed: int, num_held: int, num_new_tokens: int) -> int:
        """Blocks beyond the ``num_held`` a request needs to compute ``num_new_tokens``
        past ``num_computed`` (``<= 0``: none)."""
        return cdiv(self.slots_needed(num_computed, num_new_tokens), self.block_size) - num_held

    def full_sequence_fits(
        self, state: SchedulerState, request: RequestState, hit: tuple[int, ...] = NO_HIT
    ) -> bool:
        """The ``full_sequence_must_fit`` gate of ``allocate_slots`` for a waiting request:
        ``cdiv(min(num_tokens, max_model_len), block_size)`` blocks (lookahead not counted)."""
        return self._fits_full_sequence(request, request.num_blocks, state.free_blocks)

    def _fits_full_sequence(self, request: RequestState, num_held: int, num_free: int) -> bool:
        """Whether ``request``'s whole sequence fits in ``num_held`` blocks it holds and
        ``num_free`` more."""
        full = min(request.num_tokens, self.max_model_len)
        return max(cdiv(full, self.block_size) - num_held, 0) <= num_free

    def cache_blocks(self, state: SchedulerState, request: RequestState, num_tokens: int) -> None:
        """``cache_blocks``: nothing to cache without prefix caching."""

    def free(self, state: SchedulerState, request: RequestState) -> None:
        """``free``: every block of ``request`` goes back to the pool."""
        state.free_blocks += request.num_blocks
        request.num_blocks = 0
        request.kv_slots_covered = 0

    def preempt(self, state: SchedulerState, request: RequestState) -> None:
        """``free`` on a preemption (a manager may count it)."""
        self.free(state, request)

    def tables(self, request: RequestState) -> tuple[int, ...]:
        """The blocks in ``request``'s table in each KV group (vLLM's ``req_to_blocks``)."""
        return (request.num_blocks,)

    def slots(self, request: RequestState) -> tuple[int, ...] | None:
        """The token slots ``request``'s table holds in each KV group (blocks times the
        group's block size); None where a group's blocks do not bound its slots."""
        return (request.num_blocks * self.block_size,)

    def reset_prefix_cache(self, state: SchedulerState, num_gpu_blocks: int) -> bool:
        """``BlockPool.reset_prefix_cache``: a pool none of whose blocks is held forgets
        every hash (no later request hits a block cached before); with a block held it
        refuses and keeps them. Caching off, there is nothing to forget."""
        if state.free_blocks != usable_blocks(num_gpu_blocks):
            return False
        if state.block_pool is not None:
            state.block_pool.forget_hashes()
        return True

    def block_aligned_split(self) -> Callable[[RequestState, int, int], int] | None:
        """The scheduler's ``_mamba_block_aligned_split`` of a chunk (request, its first
        token, tokens granted -> tokens scheduled), where a Mamba group runs in ``align``
        mode; None elsewhere."""
        return None
