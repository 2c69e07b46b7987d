"""The scheduler's books C7-C13 (``spec.books``), each on a hand-worked step (C12: engine
call; C13: the pool after a step) that keeps it and one that breaks it, and the monitor
naming the item it finds broken."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dualbudget.integration.monitor import BOOKS_MONITORED, Monitor, StepSeen
from dualbudget.spec.books import (
    CallBooks,
    PoolBooks,
    RequestBooks,
    block_held,
    drafts_within_rows,
    engine_call_kept,
    placeholders_kept,
    preemption_released,
    slots_ahead,
    within_length,
)
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.contract import BOOKS_IDS, CONTRACT_IDS, books_markdown, contract_item
from dualbudget.spec.methods import layout_named

K = 3
MAX_MODEL_LEN = 64
DECODE = RequestBooks(
    scheduled=1 + K,
    drafts=K,
    tokens=20,
    placeholders_before=0,
    placeholders_after=0,
    stale_after=0,
    computed_after=20 + K,
    slots_after=(32,),
    preempted=False,
    waiting_after=False,
    drafts_after=K,
    blocks_after=2,
)
"""A request of 20 known tokens (19 computed) decoding 1 + K tokens, K of them drafts,
under a synchronous scheduler: blocks of 16, no lookahead."""
ASYNC_DECODE = replace(DECODE, placeholders_before=4, placeholders_after=8, computed_after=27)
"""The same request under async scheduling with its last step's 1 + K tokens in flight:
it found 23 computed (20 known and 4 placeholders less the one to verify) and gains 4."""
PREEMPTED = replace(
    DECODE,
    scheduled=0,
    drafts=0,
    computed_after=0,
    slots_after=(0,),
    preempted=True,
    waiting_after=True,
    drafts_after=0,
    blocks_after=0,
)


def test_the_books_are_items_of_their_own_stated_once() -> None:
    assert BOOKS_IDS == ("C7", "C8", "C9", "C10", "C11", "C12", "C13")
    assert not set(BOOKS_IDS) & set(CONTRACT_IDS)
    assert BOOKS_MONITORED == BOOKS_IDS
    for item in BOOKS_IDS:
        assert contract_item(item).source, item
        assert f"**{item} " in books_markdown()


def test_c7_placeholders_gained_by_a_step_that_reaches_the_end() -> None:
    assert placeholders_kept(ASYNC_DECODE, async_scheduling=True, sampled=1)
    # The drafts' placeholders forgotten: 1 gained, not 1 + K.
    forgot = replace(ASYNC_DECODE, placeholders_after=5)
    assert not placeholders_kept(forgot, async_scheduling=True, sampled=1)


def test_c7_a_prefill_chunk_and_a_request_not_scheduled_keep_their_placeholders() -> None:
    chunk = replace(DECODE, tokens=100, drafts=0, computed_after=40)
    assert placeholders_kept(chunk, async_scheduling=True, sampled=1)
    assert not placeholders_kept(
        replace(chunk, placeholders_after=1), async_scheduling=True, sampled=1
    )
    idle = replace(ASYNC_DECODE, scheduled=0, drafts=0, placeholders_after=4)
    assert placeholders_kept(idle, async_scheduling=True, sampled=1)
    assert not placeholders_kept(
        replace(idle, placeholders_after=3), async_scheduling=True, sampled=1
    )


def test_c7_never_negative_and_none_without_async_scheduling() -> None:
    assert placeholders_kept(DECODE, async_scheduling=False, sampled=1)
    assert not placeholders_kept(
        replace(DECODE, placeholders_after=4), async_scheduling=False, sampled=1
    )
    underflow = replace(ASYNC_DECODE, scheduled=0, placeholders_before=-1, placeholders_after=-1)
    assert not placeholders_kept(underflow, async_scheduling=True, sampled=1)
    stale = replace(ASYNC_DECODE, stale_after=-2)
    assert not placeholders_kept(stale, async_scheduling=True, sampled=1)
    assert placeholders_kept(PREEMPTED, async_scheduling=True, sampled=1)
    assert not placeholders_kept(
        replace(PREEMPTED, placeholders_after=2), async_scheduling=True, sampled=1
    )


def test_c8_drafts_fit_the_rows_scheduled_for_them() -> None:
    assert drafts_within_rows(DECODE, num_speculative_tokens=K)
    # Cut to 2 rows: one draft at most.
    assert drafts_within_rows(replace(DECODE, scheduled=2, drafts=1), num_speculative_tokens=K)
    assert not drafts_within_rows(replace(DECODE, scheduled=2, drafts=2), num_speculative_tokens=K)
    assert not drafts_within_rows(
        replace(DECODE, scheduled=9, drafts=K + 1), num_speculative_tokens=K
    )
    assert not drafts_within_rows(replace(DECODE, scheduled=0, drafts=1), num_speculative_tokens=K)


def test_c9_slots_for_the_computed_tokens_and_the_lookahead() -> None:
    # 23 computed after the step, lookahead K: 26 slots, 32 held.
    assert slots_ahead(DECODE, num_lookahead_tokens=K, max_model_len=MAX_MODEL_LEN)
    # One block of 16 per group cannot hold them; the second group is short.
    assert not slots_ahead(
        replace(DECODE, slots_after=(32, 16)), num_lookahead_tokens=K, max_model_len=MAX_MODEL_LEN
    )
    # At 30 computed, lookahead 3 passes 32 slots; capped at max_model_len 32 it does not.
    near = replace(DECODE, computed_after=30)
    assert not slots_ahead(near, num_lookahead_tokens=K, max_model_len=MAX_MODEL_LEN)
    assert slots_ahead(near, num_lookahead_tokens=K, max_model_len=32)
    # A prefill chunk short of the prompt's end samples nothing and drafts nothing: its
    # computed tokens alone need slots (vLLM 0.20-0.22 reserve no lookahead for it).
    chunk = replace(DECODE, tokens=40, computed_after=16, slots_after=(16,))
    assert slots_ahead(chunk, num_lookahead_tokens=K, max_model_len=MAX_MODEL_LEN)
    assert not slots_ahead(replace(chunk, tokens=16), num_lookahead_tokens=K, max_model_len=64)
    # Blocks that do not bound slots (Mamba's state) are not judged.
    assert slots_ahead(
        replace(near, slots_after=None), num_lookahead_tokens=K, max_model_len=MAX_MODEL_LEN
    )


def test_c10_no_position_past_max_model_len_and_room_for_the_sampled_token() -> None:
    assert within_length(DECODE, max_model_len=24, sampled=1)
    assert not within_length(DECODE, max_model_len=23, sampled=1)
    # A last prefill chunk may fill max_model_len: no draft needs a row past it.
    prefill = replace(DECODE, drafts=0, computed_after=23)
    assert within_length(prefill, max_model_len=23, sampled=1)
    assert not within_length(prefill, max_model_len=22, sampled=1)


def test_c11_a_preempted_request_keeps_nothing() -> None:
    assert preemption_released(PREEMPTED)
    assert preemption_released(DECODE)
    for kept in (
        {"computed_after": 23},
        {"blocks_after": 1},
        {"drafts_after": K},
        {"placeholders_after": 4},
        {"waiting_after": False},
        {"scheduled": 4},
    ):
        assert not preemption_released(replace(PREEMPTED, **kept)), kept


@pytest.mark.parametrize(
    ("books", "item"),
    [
        (replace(DECODE, placeholders_after=4), "C7"),
        (replace(DECODE, scheduled=2, drafts=2), "C8"),
        (replace(DECODE, slots_after=(16,)), "C9"),
        (replace(DECODE, computed_after=70, slots_after=(80,)), "C10"),
        (replace(PREEMPTED, computed_after=5), "C11"),
    ],
)
def test_the_monitor_names_the_item_a_step_breaks(books: RequestBooks, item: str) -> None:
    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=8,
        max_model_len=MAX_MODEL_LEN,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig.for_layout(layout_named("eagle"), K),
    )
    monitor = Monitor(config)
    seen = StepSeen(
        step=3,
        scheduled={"r": books.scheduled} if books.scheduled else {},
        preempted=("r",) if books.preempted else (),
        wanted={},
        free_blocks=None,
        num_running=1,
        block_sizes=None,
        books={"r": books},
    )
    found = monitor.judge(seen)
    assert [v.contract for v in found] == [item]
    assert found[0].step == 3 and "request r:" in found[0].message
    # The same step, kept: nothing found.
    assert not Monitor(config).judge(
        replace(seen, books={"r": DECODE}, scheduled={"r": 4}, preempted=())
    )


def test_the_monitor_counts_the_request_steps_each_item_stands_on() -> None:
    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=8,
        max_model_len=MAX_MODEL_LEN,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig.for_layout(layout_named("eagle"), K),
    )
    monitor = Monitor(config)
    unbounded = replace(DECODE, slots_after=None)
    seen = StepSeen(
        step=0,
        scheduled={"a": 4, "b": 4},
        preempted=(),
        wanted={},
        free_blocks=None,
        num_running=2,
        block_sizes=None,
        books={"a": DECODE, "b": unbounded},
    )
    assert not monitor.judge(seen)
    # C9 is not judged where a group's slots are not bounded by its blocks; C13 is
    # judged on the pool, which this step did not read.
    judged = {"C7": 2, "C8": 2, "C9": 1, "C10": 2, "C11": 2, "C12": 0, "C13": 0}
    assert monitor.books_judged == judged
    # A step whose books were not read (a stand-in scheduler) adds nothing.
    monitor.judge(replace(seen, books=None))
    assert monitor.books_judged == judged
    assert set(monitor.books_judged) == set(BOOKS_MONITORED)
    # C12 counts each request an engine call leaves, whatever the call.
    monitor.judge_call(1, "pause", {"a": UNTOUCHED, "b": UNTOUCHED}, resets_running=False)
    assert monitor.books_judged["C12"] == 2


RESET_VICTIM = CallBooks(
    running_before=True,
    tokens_before=20,
    tokens_after=20,
    in_flight_before=4,
    waiting_after=True,
    computed_after=0,
    blocks_after=0,
    drafts_after=0,
    placeholders_after=0,
    stale_after=4,
    drops_stale_after=True,
    unchanged=False,
)
"""A request of 20 known tokens running at a reset of the running requests, one step of
1 + K = 4 tokens in flight: it waits with nothing computed or held, the 4 stale."""
UNTOUCHED = replace(
    RESET_VICTIM,
    running_before=False,
    in_flight_before=0,
    stale_after=0,
    drops_stale_after=False,
    unchanged=True,
)
"""A request the call leaves as it was (waiting at the reset, or any request at a pause)."""


def test_c12_a_reset_victim_waits_with_all_its_tokens_and_its_output_dropped() -> None:
    assert engine_call_kept(RESET_VICTIM, resets_running=True)
    # Its output in flight delivered, not dropped: tokens for positions it may
    # schedule again in the next step.
    assert not engine_call_kept(replace(RESET_VICTIM, drops_stale_after=False), resets_running=True)
    # Nothing in flight: nothing to drop, the flag is moot.
    idle = replace(RESET_VICTIM, in_flight_before=0, stale_after=0, drops_stale_after=False)
    assert engine_call_kept(idle, resets_running=True)
    # An accepted token lost, or blocks kept, or not waiting.
    assert not engine_call_kept(replace(RESET_VICTIM, tokens_after=19), resets_running=True)
    assert not engine_call_kept(replace(RESET_VICTIM, blocks_after=2), resets_running=True)
    assert not engine_call_kept(replace(RESET_VICTIM, waiting_after=False), resets_running=True)


def test_c12_any_other_call_leaves_every_request_as_it_was() -> None:
    assert engine_call_kept(UNTOUCHED, resets_running=True)
    assert engine_call_kept(UNTOUCHED, resets_running=False)
    # A pause (or a reset that keeps the running requests) that touches a request.
    assert not engine_call_kept(replace(UNTOUCHED, unchanged=False), resets_running=False)
    assert not engine_call_kept(RESET_VICTIM, resets_running=False)


def test_the_monitor_names_a_broken_engine_call() -> None:
    config = EngineConfig(
        max_num_batched_tokens=64, max_num_seqs=8, max_model_len=MAX_MODEL_LEN, block_size=16,
        num_gpu_blocks=64, async_scheduling=True,
    )  # fmt: skip
    monitor = Monitor(config)
    broken = replace(RESET_VICTIM, drops_stale_after=False)
    found = monitor.judge_call(
        3, "ResetPrefixCache", {"a": RESET_VICTIM, "b": broken}, resets_running=True
    )
    assert [(v.contract, v.step) for v in found] == [("C12", 3)]
    assert "request b" in found[0].message and monitor.violations == found


SHARED = PoolBooks(holders={1: 2, 2: 1, 3: 1}, ref_counts={1: 2, 2: 1, 3: 1}, hashed=frozenset({1}))
"""Two requests of one prefix: block 1 is their shared cached prefix block, blocks 2 and
3 each one's own."""


def test_c13_every_held_block_counts_its_holders() -> None:
    assert all(block_held(SHARED, block) for block in SHARED.holders)
    # A table left holding a block the pool freed (count 0: in the free queue).
    freed = replace(SHARED, ref_counts={**SHARED.ref_counts, 3: 0})
    assert not block_held(freed, 3)
    # A shared prefix block whose second holder was never counted.
    undercounted = replace(SHARED, ref_counts={**SHARED.ref_counts, 1: 1})
    assert not block_held(undercounted, 1)
    # A count above the holders (a pinned block) keeps it.
    assert block_held(replace(SHARED, ref_counts={**SHARED.ref_counts, 2: 2}), 2)


def test_c13_a_block_two_tables_hold_is_a_cached_block() -> None:
    # Block 2 handed to a second table, counted, but no prefix hit made it shared.
    reused = replace(SHARED, holders={**SHARED.holders, 2: 2}, ref_counts={1: 2, 2: 2, 3: 1})
    assert not block_held(reused, 2)
    assert block_held(replace(reused, hashed=frozenset({1, 2})), 2)


def test_the_monitor_names_a_block_held_while_free_and_counts_the_blocks() -> None:
    monitor = Monitor(
        EngineConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=MAX_MODEL_LEN,
                     block_size=16, num_gpu_blocks=64)
    )  # fmt: skip
    seen = StepSeen(
        step=5,
        scheduled={"a": 1},
        preempted=(),
        wanted={},
        free_blocks=None,
        num_running=1,
        block_sizes=None,
        pool=SHARED,
    )
    assert not monitor.judge(seen)
    assert monitor.books_judged["C13"] == 3
    freed = replace(SHARED, ref_counts={**SHARED.ref_counts, 3: 0})
    (violation,) = monitor.judge(replace(seen, step=6, pool=freed))
    assert (violation.contract, violation.step) == ("C13", 6)
    assert violation.message == "block 3 held by 1 tables, ref_cnt 0"
    assert monitor.books_judged["C13"] == 6
