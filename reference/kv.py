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

from .state import RequestState, SchedulerState


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def usable_blocks(num_gpu_blocks: int) -> int:
    """Blocks the pool can lend: vLLM's ``BlockPool.__init__`` takes one as the null block."""
    return num_gpu_blocks - 1


def blocks_to_allocate(
    request: RequestState,
    num_new_tokens: int,
    *,
    num_lookahead_tokens: int,
    max_model_len: int,
    block_size: int,
) -> int:
    """New blocks ``allocate_slots`` would take (``get_num_blocks_to_allocate``)."""
    computed = min(request.num_computed_tokens, max_model_len)
    need_slot = min(computed + num_new_tokens + num_lookahead_tokens, max_model_len)
    return max(cdiv(need_slot, block_size) - request.num_blocks, 0)


def full_sequence_fits(
    state: SchedulerState, request: RequestState, *, max_model_len: int, block_size: int
) -> bool:
    """The ``full_sequence_must_fit`` gate of ``allocate_slots`` for a waiting request:
    ``cdiv(min(num_tokens, max_model_len), block_size)`` blocks (lookahead not counted)."""
    full = min(request.num_tokens, max_model_len)
    return max(cdiv(full, block_size) - request.num_blocks, 0) <= state.free_blocks


def try_allocate(state: SchedulerState, request: RequestState, num_blocks: int) -> bool:
    """Take ``num_blocks`` from the pool for ``request``; False (and no change) if short."""
    if num_blocks > state.free_blocks:
        return False
    state.free_blocks -= num_blocks
    request.num_blocks += num_blocks
    return True


def free(state: SchedulerState, request: RequestState) -> None:
    state.free_blocks += request.num_blocks
    request.num_blocks = 0
