"""KV block accounting for the subset: one full-attention group, prefix caching off.

Mirrors ``KVCacheManager.allocate_slots`` with ``FullAttentionManager``: a request holds
``cdiv(min(num_computed + num_new + num_lookahead_tokens, max_model_len), block_size)``
blocks, never fewer than it already has (blocks for rejected drafts are kept), and the
pool lends ``num_gpu_blocks - 1`` of its blocks (``BlockPool`` keeps the first as the
null block). Watermark 0 (vLLM's default), so admissions get no extra headroom check.

A waiting request is admitted only if its whole current sequence would fit in the free
blocks (vLLM's ``scheduler_reserve_full_isl``, on by default: ``allocate_slots`` with
``full_sequence_must_fit``). That gate checks, it does not reserve: the request still
takes only the blocks of its first chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from .state import RequestState, SchedulerState


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def usable_blocks(num_gpu_blocks: int) -> int:
    """Blocks the pool can lend: vLLM's ``BlockPool.__init__`` takes one as the null block."""
    return num_gpu_blocks - 1


@dataclass(frozen=True, slots=True)
class KVCacheManager:
    """``KVCacheManager``'s block accounting for one config, on a state's pool."""

    block_size: int
    max_model_len: int
    num_lookahead_tokens: int

    def allocate_slots(
        self, state: SchedulerState, request: RequestState, num_new_tokens: int
    ) -> bool:
        """Give ``request`` the blocks it needs to compute ``num_new_tokens`` more
        (``get_num_blocks_to_allocate``: up to ``num_lookahead_tokens`` past them, capped
        at ``max_model_len``, none taken back); False, and no change, if the pool is short.

        Asked for every scheduled request of every step, so the arithmetic is written out
        here. (vLLM also caps ``num_computed_tokens`` at ``max_model_len`` first; with
        ``num_new_tokens, num_lookahead_tokens >= 0`` the outer cap makes that a no-op.)"""
        need_slot = request.num_computed_tokens + num_new_tokens + self.num_lookahead_tokens
        if need_slot > self.max_model_len:
            need_slot = self.max_model_len
        wanted = -(-need_slot // self.block_size) - request.num_blocks  # cdiv
        if wanted <= 0:
            return True
        if wanted > state.free_blocks:
            return False
        state.free_blocks -= wanted
        request.num_blocks += wanted
        return True

    def full_sequence_fits(self, state: SchedulerState, request: RequestState) -> bool:
        """The ``full_sequence_must_fit`` gate of ``allocate_slots`` for a waiting request:
        ``cdiv(min(num_tokens, max_model_len), block_size)`` blocks (lookahead not counted)."""
        full = min(request.num_tokens, self.max_model_len)
        return max(cdiv(full, self.block_size) - request.num_blocks, 0) <= state.free_blocks

    @staticmethod
    def free(state: SchedulerState, request: RequestState) -> None:
        """``free``: every block of ``request`` goes back to the pool."""
        state.free_blocks += request.num_blocks
        request.num_blocks = 0
