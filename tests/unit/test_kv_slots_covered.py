"""``RequestState.kv_slots_covered``, the promise the RUNNING loop leans on to skip
``allocate_slots``: within it an allocation changes nothing and succeeds; ``free``
withdraws it; the prefix-caching manager's promise also ends before the next block
it would cache."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dualbudget.reference.kv.counting import KVCacheManager
from dualbudget.reference.kv.prefix_caching import PrefixCachingKVCacheManager
from dualbudget.reference.prefix_cache import BlockPool, HitRule
from dualbudget.reference.state import RequestState, SchedulerState


@settings(max_examples=300, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    max_model_len=st.integers(8, 256),
    num_lookahead_tokens=st.integers(0, 8),
    free_blocks=st.integers(0, 64),
    steps=st.lists(st.integers(1, 48), min_size=1, max_size=24),
)
def test_within_the_promise_allocate_slots_is_a_no_op(
    block_size: int,
    max_model_len: int,
    num_lookahead_tokens: int,
    free_blocks: int,
    steps: list[int],
) -> None:
    manager = KVCacheManager(block_size, max_model_len, num_lookahead_tokens)
    state = SchedulerState(free_blocks=free_blocks)
    request = RequestState("r", prompt_len=1, max_tokens=1)
    for q in steps:
        computed = request.num_computed_tokens
        if computed + q > max_model_len - 1:
            break  # the RUNNING loop caps q below max_model_len
        covered = request.kv_slots_covered
        before = (state.free_blocks, request.num_blocks, covered)
        allocated = manager.allocate_slots(state, request, q)
        if computed + q <= covered:
            assert allocated
            assert (state.free_blocks, request.num_blocks, request.kv_slots_covered) == before
        if not allocated:
            break
        # The promise never outruns the blocks: what it covers, the blocks hold.
        assert request.kv_slots_covered + num_lookahead_tokens <= request.num_blocks * block_size
        request.num_computed_tokens = computed + q


def test_a_decode_within_its_blocks_is_covered_and_free_withdraws_it() -> None:
    manager = KVCacheManager(block_size=16, max_model_len=1024, num_lookahead_tokens=3)
    state = SchedulerState(free_blocks=10)
    request = RequestState("r", prompt_len=20, max_tokens=8)
    assert manager.allocate_slots(state, request, 20)  # 20 + 3 lookahead: two blocks
    assert (request.num_blocks, request.kv_slots_covered) == (2, 29)
    request.num_computed_tokens = 20
    assert request.num_computed_tokens + 4 <= request.kv_slots_covered  # a 1 + K = 4 decode
    manager.free(state, request)
    assert (state.free_blocks, request.num_blocks, request.kv_slots_covered) == (10, 0, 0)


def test_the_prefix_caching_promise_stops_before_the_next_hashed_block() -> None:
    observed = {"hit_on_running_block": 0, "cached_block_evicted": 0}
    manager = PrefixCachingKVCacheManager(16, 1024, 0, HitRule(), observed)
    state = SchedulerState(free_blocks=9, block_pool=BlockPool.create(10))
    request = RequestState("r", prompt_len=20, max_tokens=8, block_hashes=["h0"])
    assert manager.allocate_slots(state, request, 20)
    assert (request.num_blocks, request.num_cached_blocks) == (2, 1)
    # No hash beyond the cached block: the two blocks held cover the promise.
    assert request.kv_slots_covered == 32
    # A second hash arrives (block 1 complete): caching it is work the RUNNING loop
    # must ask for, so the promise ends before that block's last token.
    request.block_hashes = ["h0", "h1"]
    manager._promise(request)
    assert request.kv_slots_covered == 31
    manager.free(state, request)
    assert request.kv_slots_covered == 0
