"""The reference scheduler's mechanics, one vLLM behaviour per test, numbers by hand."""

from __future__ import annotations

from typing import Any

import pytest

from dualbudget.reference.events import (
    AddRequest,
    DraftProposals,
    Event,
    InvalidEvent,
    ModelOutput,
    ScheduleStep,
    StepRecord,
)
from dualbudget.reference.formats.scenario import RequestSpec, parse_scenario, scenario_to_json
from dualbudget.reference.runs.driver import EventDriver, ScenarioRun, drive
from dualbudget.reference.scheduler import Scheduler, UnmirroredVllmCrash
from dualbudget.spec.profiles import profile_named
from tests.reference_support import config, run, scenario


def cfg(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "max_num_batched_tokens": 20,
        "max_num_seqs": 4,
        "max_model_len": 64,
        "block_size": 16,
        "num_gpu_blocks": 100,
    }
    base.update(fields)
    return base


def eagle(k: int) -> dict[str, Any]:
    return {"method": "eagle", "num_speculative_tokens": k}


def req(rid: str, prompt_len: int, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"id": rid, "prompt_len": prompt_len, "max_tokens": max_tokens, **extra}


def scheduled(records: list[StepRecord]) -> list[dict[str, int]]:
    return [r.num_scheduled_tokens for r in records]


def test_chunked_prefill_off_stops_at_a_prompt_that_does_not_fit() -> None:
    # B = 20 = max_model_len. r0 takes 15; r1 needs 10 > room 5: chunked prefill on
    # gives it a 5-token chunk, off stops the waiting loop.
    requests = [req("0", 15), req("1", 10)]
    on = scenario("vllm-0.32", cfg(max_model_len=20), requests)
    off = scenario("vllm-0.32", cfg(max_model_len=20, enable_chunked_prefill=False), requests)
    assert scheduled(run(on)[1])[0] == {"0": 15, "1": 5}
    assert scheduled(run(off)[1])[0] == {"0": 15}


def test_long_prefill_threshold_only_when_more_than_one_request() -> None:
    # threshold 6: alone, the 15-token prompt takes 15; with a second request both get 6.
    alone = scenario("vllm-0.32", cfg(long_prefill_token_threshold=6), [req("0", 15)])
    pair = scenario("vllm-0.32", cfg(long_prefill_token_threshold=6), [req("0", 15), req("1", 15)])
    assert scheduled(run(alone)[1])[0] == {"0": 15}
    assert scheduled(run(pair)[1])[:3] == [{"0": 6, "1": 6}, {"0": 6, "1": 6}, {"0": 3, "1": 3}]


def test_max_model_len_caps_drafts_and_finishes_the_request() -> None:
    # max_model_len 16, prompt 12, eagle K = 4, nothing accepted.
    # step 0: prefill 12, sample 1 -> 13 tokens, computed 12.
    # step 1: need 1 + 4, cap 16 - 12 - 1 = 3 -> q 3, spec 3 + 12 - 13 = 2; computed 12 + 3 - 2.
    # step 2: cap 16 - 13 - 1 = 2 -> q 2, spec 1. step 3: cap 1 -> q 1, spec 0.
    # After step 3 the request holds 16 tokens = max_model_len: finished with 4 outputs.
    sc = scenario(
        "vllm-0.32",
        cfg(max_model_len=16, speculative_config=eagle(4)),
        [req("r", 12, max_tokens=10)],
    )
    scheduler_run, records = run(sc)
    assert scheduled(records) == [{"r": 12}, {"r": 3}, {"r": 2}, {"r": 1}, {}]
    assert [r.scheduled_spec_tokens for r in records[:4]] == [{}, {"r": 2}, {"r": 1}, {}]
    assert records[-1].finished == ["r"]
    assert scheduler_run.scheduler.state.requests["r"].num_output_tokens == 4


def test_new_one_token_decode_is_padded_to_one_plus_k() -> None:
    # vllm-0.33, eagle K = 3. r0 (prompt 4) decodes at step 1 with 1 + 3 tokens; r1 (prompt
    # 1) arrives then and is padded to 1 + 3 with 3 placeholder drafts, of which none is
    # accepted (acceptance 3 applies to real drafts only), so r1 samples one token.
    sc = scenario(
        "vllm-0.33",
        cfg(speculative_config=eagle(3)),
        [req("0", 4, max_tokens=6), req("1", 1, max_tokens=6, arrival_step=1)],
        acceptance={"fixed": 3},
    )
    scheduler_run, records = run(sc, max_steps=2)
    assert records[1].num_scheduled_tokens == {"0": 4, "1": 4}
    assert records[1].scheduled_spec_tokens == {"0": 3, "1": 3}
    r1 = scheduler_run.scheduler.state.requests["1"]
    assert (r1.num_output_tokens, r1.num_computed_tokens) == (1, 1)


def test_no_padding_when_the_running_loop_scheduled_a_prefill() -> None:
    # B = 24: r0's 30-token prompt takes 24 at step 0 and is still prefilling at step 1
    # (6 left), so r1 gets 1 token, unpadded.
    sc = scenario(
        "vllm-0.33",
        cfg(speculative_config=eagle(3), max_num_batched_tokens=24),
        [req("0", 30), req("1", 1, arrival_step=1)],
    )
    records = run(sc, max_steps=2)[1]
    assert records[1].num_scheduled_tokens == {"0": 6, "1": 1}
    assert records[1].scheduled_spec_tokens == {}


def test_padding_that_does_not_fit_stops_the_waiting_loop() -> None:
    # B = 6, vllm-0.33 eagle K = 3 (slots 0). Step 1: r0 decodes 1 + 3 = 4, room 2 < 1 + 3:
    # vLLM prefers not scheduling r1 to scheduling it unpadded.
    sc = scenario(
        "vllm-0.33",
        cfg(max_num_batched_tokens=6, speculative_config=eagle(3)),
        [req("0", 4, max_tokens=3), req("1", 1, arrival_step=1)],
    )
    records = run(sc, max_steps=2)[1]
    assert records[1].num_scheduled_tokens == {"0": 4}


def test_rejected_drafts_are_rolled_back() -> None:
    # eagle K = 4, one accepted per step: each decode step schedules 5, samples 2, and
    # leaves num_computed_tokens one behind num_tokens.
    sc = scenario(
        "dual",
        cfg(speculative_config=eagle(4)),
        [req("r", 5, max_tokens=9)],
        acceptance={"fixed": 1},
    )
    scheduler = Scheduler(sc.config, profile_named("dual"))
    outputs = []
    for _ in drive(EventDriver.of(sc), scheduler):
        r = scheduler.state.requests["r"]
        if not r.finished:
            assert r.num_computed_tokens == r.num_tokens - 1
        outputs.append(r.num_output_tokens)
    # prefill: 1 output; then +2 per step; the step reaching 9 trims the extra token.
    assert outputs == [1, 3, 5, 7, 9, 9]


def test_finish_on_max_tokens_trims_and_reports_in_the_next_record() -> None:
    # max_tokens 3, all 4 drafts accepted: prefill gives 1, the decode step samples 5 but
    # only 2 more are kept. The finish shows in the next record (an empty flush step).
    sc = scenario(
        "vllm-0.32",
        cfg(speculative_config=eagle(4)),
        [req("r", 5, max_tokens=3)],
        acceptance={"fixed": 4},
    )
    scheduler_run, records = run(sc)
    assert scheduled(records) == [{"r": 5}, {"r": 5}, {}]
    assert [r.finished for r in records] == [[], [], ["r"]]
    assert scheduler_run.scheduler.state.requests["r"].num_output_tokens == 3


def test_abort_frees_the_request() -> None:
    # b finishes with the output of step 1 (reported at step 2); a is aborted before step 3.
    sc = scenario(
        "vllm-0.32",
        cfg(),
        [req("a", 4, max_tokens=50, abort_step=3), req("b", 4, max_tokens=2)],
    )
    scheduler_run, records = run(sc)
    state = scheduler_run.scheduler.state
    assert records[2].finished == ["b"]
    assert records[3].finished == ["a"]
    assert "a" not in records[3].num_scheduled_tokens
    assert state.requests["a"].status == "finished_aborted"
    assert state.free_blocks == 99  # everything back, less the null block


def test_blocks_count_lookahead_capped_by_max_model_len_and_the_null_block() -> None:
    # block_size 2, eagle K = 4 (lookahead 4), max_model_len 9, prompt 8:
    # cdiv(min(8 + 4, 9), 2) = 5 blocks; the pool lends 10 - 1 = 9, so 4 stay free.
    cfg9 = config("eagle", max_model_len=9, block_size=2, num_gpu_blocks=10)
    scheduler = Scheduler(cfg9, profile_named("vllm-0.32"))
    scheduler.handle(AddRequest("r", 8, 1))
    scheduler.handle(ScheduleStep())
    assert scheduler.state.requests["r"].num_blocks == 5
    assert scheduler.state.free_blocks == 4


@pytest.mark.parametrize(("num_gpu_blocks", "admitted"), [(4, {"0": 8}), (5, {"0": 8, "1": 8})])
def test_the_null_block_is_not_lent(num_gpu_blocks: int, admitted: dict[str, int]) -> None:
    # Two 8-token prompts need 2 blocks of 4 each; 4 blocks lend 3, 5 lend 4.
    sc = scenario(
        "vllm-0.32",
        cfg(max_model_len=12, block_size=4, num_gpu_blocks=num_gpu_blocks),
        [req("0", 8), req("1", 8)],
    )
    assert scheduled(run(sc, max_steps=1)[1]) == [admitted]


def test_fcfs_preempts_the_last_running_request_and_admits_nobody() -> None:
    # block_size 4, 5 blocks (4 lent). Step 0: r0 (prompt 4) 1 block, r1 (prompt 8) 2.
    # Step 1: r0 decodes into a 2nd block (free 0); r1 needs a 3rd -> the last running
    # request, r1 itself, is preempted; r2 (arrived) is not admitted in a step that
    # preempted; r1 goes to the front of waiting.
    sc = scenario(
        "vllm-0.32",
        cfg(max_model_len=12, block_size=4, num_gpu_blocks=5),
        [req("0", 4, max_tokens=8), req("1", 8, max_tokens=2), req("2", 4, arrival_step=1)],
    )
    scheduler_run, records = run(sc, max_steps=2)
    assert records[1].num_scheduled_tokens == {"0": 1}
    assert records[1].preempted == ["1"]
    state = scheduler_run.scheduler.state
    assert state.waiting == ["1", "2"]
    assert state.requests["1"].num_computed_tokens == 0


def test_priority_victim_already_scheduled_is_refunded_its_charge() -> None:
    # Priority scheduling, block_size 4, 4 blocks (3 lent), no speculation.
    # Step 0: L (priority 5) prefills 4 -> 1 block. Step 1: L decodes into a 2nd block,
    # H (priority 0) arrives and prefills 4 -> 1 block; pool empty.
    # Step 2: L is scheduled (1 token, no new block), then H needs a 2nd block: the victim
    # is max (priority, arrival) = L, already scheduled: its charge (1, 1) comes back,
    # so the step ends with H alone and budgets 20 - 1.
    sc = scenario(
        "vllm-0.32",
        cfg(max_model_len=12, block_size=4, num_gpu_blocks=4, scheduling_policy="priority"),
        [req("L", 4, max_tokens=6, priority=5), req("H", 4, max_tokens=3, arrival_step=1)],
    )
    records = run(sc, max_steps=3)[1]
    assert records[2].num_scheduled_tokens == {"H": 1}
    assert records[2].preempted == ["L"]
    assert records[2].budgets_left == {"token_budget": 19, "input_budget": 19}


@pytest.mark.parametrize(
    ("profile", "step2"),
    [("vllm-0.32", {}), ("vllm-0.33", {"H": 1}), ("dual", {"H": 1})],
)
def test_priority_self_preemption_stops_in_0_32_and_goes_on_in_0_33(
    profile: str, step2: dict[str, int]
) -> None:
    # block_size 4, 3 blocks (2 lent). L (priority 5, prompt 3) then H (priority 0, prompt
    # 2, arrives at step 1): one block each. Step 2: L needs a 2nd block for position 5;
    # none is free and L is itself the lowest priority, so it preempts itself.
    # 0.32 stops the running loop there; 0.33 goes on to H (dual runs on 0.33).
    sc = scenario(
        profile,
        cfg(max_model_len=8, block_size=4, num_gpu_blocks=3, scheduling_policy="priority"),
        [req("L", 3, max_tokens=4, priority=5), req("H", 2, max_tokens=3, arrival_step=1)],
    )
    records = run(sc, max_steps=3)[1]
    assert records[1].num_scheduled_tokens == {"L": 1, "H": 2}
    assert records[2].preempted == ["L"]
    assert records[2].num_scheduled_tokens == step2


def test_waiting_queue_is_ordered_by_priority_then_arrival() -> None:
    # max_num_seqs 1: only the head of the priority queue is admitted.
    sc = scenario(
        "vllm-0.33",
        cfg(max_num_seqs=1, scheduling_policy="priority"),
        [
            req("a", 2, max_tokens=1, priority=2),
            req("b", 2, max_tokens=1, priority=1),
            req("c", 2, max_tokens=1, priority=1),
        ],
    )
    firsts = [next(iter(r.num_scheduled_tokens)) for r in run(sc)[1] if r.num_scheduled_tokens]
    assert firsts == ["b", "c", "a"]


class Kept:
    """A consumer that keeps the step records its scheduler answers."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.records: list[StepRecord] = []

    def handle(self, event: Event) -> StepRecord | None:
        record = self.scheduler.handle(event)
        if record is not None:
            self.records.append(record)
        return record


def test_a_forked_state_replays_the_same_decisions() -> None:
    # The lockstep pattern: one driver makes the events, two consumers take them.
    sc = scenario(
        "vllm-0.32",
        cfg(block_size=4, num_gpu_blocks=9, max_model_len=32, speculative_config=eagle(2)),
        [req(str(i), 6 + i, max_tokens=7, arrival_step=i) for i in range(4)],
        acceptance={"per_position": [0.8, 0.5], "seed": 3},
    )
    first = Scheduler(sc.config, profile_named(sc.profile))
    driver = EventDriver.of(sc, max_steps=3)
    assert len(list(drive(driver, first))) == 3
    # The same driver goes on, now feeding a fork of the first too.
    second = Kept(first.fork())
    driver.max_steps = None
    records = [step.record for step in drive(driver, first, second)]
    assert records and records == second.records
    assert records[0].step == 3
    assert second.scheduler.state == first.state


def test_bad_events_are_refused() -> None:
    scheduler = Scheduler(config("eagle", k=2), profile_named("dual"))
    scheduler.handle(AddRequest("r", 4, 2))
    with pytest.raises(InvalidEvent, match="duplicate"):
        scheduler.handle(AddRequest("r", 4, 2))
    scheduler.handle(ScheduleStep())
    with pytest.raises(InvalidEvent, match="at most 1"):
        scheduler.handle(ModelOutput({"r": 2}))
    with pytest.raises(InvalidEvent, match="K is 2"):
        scheduler.handle(DraftProposals({"r": 3}))


def test_waiting_request_is_admitted_only_if_its_whole_sequence_fits() -> None:
    # vLLM's scheduler_reserve_full_isl (on by default). block_size 4, 5 blocks (4 lent),
    # B = 10: r0 (prompt 8) takes 2 blocks; r1 (prompt 12) would get a 2-token chunk
    # needing 1 block, but its 12 tokens need 3 > 2 free blocks: not admitted.
    sc = scenario(
        "vllm-0.32",
        cfg(max_num_batched_tokens=10, max_model_len=16, block_size=4, num_gpu_blocks=5),
        [req("0", 8), req("1", 12)],
    )
    assert scheduled(run(sc, max_steps=1)[1]) == [{"0": 8}]


def test_threshold_cutting_a_padded_request_is_vllms_assertion() -> None:
    # long_prefill_token_threshold 2 < 1 + K = 4: the padded one-token request would be
    # cut to 2, where vLLM's schedule() fails an assertion. The reference refuses to guess.
    sc = scenario(
        "vllm-0.33",
        cfg(long_prefill_token_threshold=2, speculative_config=eagle(3)),
        [req("0", 2, max_tokens=6), req("1", 1, max_tokens=6, arrival_step=1)],
    )
    with pytest.raises(UnmirroredVllmCrash, match="1 \\+ K = 4"):
        run(sc)


def test_a_prompt_that_can_never_fit_is_reported_as_a_stall() -> None:
    # Chunked prefill off, vllm-0.32 P-EAGLE K = 4 (slots 3), B = max_model_len = 20: an
    # empty step's room is min(20, 20 - 3) = 17 < 18, so the prompt never schedules (C4).
    sc = scenario(
        "vllm-0.32",
        cfg(
            max_model_len=20,
            enable_chunked_prefill=False,
            speculative_config={
                "method": "eagle3",
                "num_speculative_tokens": 4,
                "parallel_drafting": True,
            },
        ),
        [req("r", 18)],
    )
    scenario_run, records = run(sc)
    assert scenario_run.stall is not None
    assert scenario_run.stall.unfinished == ("r",)
    assert records == [records[0]] and records[0].num_scheduled_tokens == {}


def test_transition_is_pure() -> None:
    from dualbudget.reference.async_scheduler import transition

    cfg2 = config("eagle", k=2)
    profile = profile_named("vllm-0.33")
    start = Scheduler.initial_state(cfg2)
    added, _ = transition(cfg2, profile, start, AddRequest("r", 4, 2))
    assert start.requests == {} and list(added.requests) == ["r"]
    after, record = transition(cfg2, profile, added, ScheduleStep())
    again, record_again = transition(cfg2, profile, added, ScheduleStep())
    assert record is not None and record == record_again and after == again
    assert added.requests["r"].num_computed_tokens == 0


def test_a_run_written_back_as_a_scenario_replays_event_for_event() -> None:
    # Seeded per-position acceptance, aborts, arrivals and a K of 3: the written-back
    # scenario holds explicit tables of what was drawn, and drives the same events.
    sc = scenario(
        "vllm-0.33",
        cfg(block_size=4, num_gpu_blocks=12, max_model_len=40, speculative_config=eagle(3)),
        [
            req("a", 9, max_tokens=8),
            req("b", 3, max_tokens=9, arrival_step=2, priority=1),
            req("c", 6, max_tokens=7, arrival_step=2, abort_step=5),
        ],
        acceptance={"per_position": [0.9, 0.6, 0.3], "seed": 4},
    )
    first = ScenarioRun(sc)
    steps = list(first.steps())
    written = first.driver.scenario()
    assert written.acceptance.explicit and written.drafts and written.drafts.explicit
    again = parse_scenario(scenario_to_json(written))
    assert again == written
    second = ScenarioRun(again)
    assert [s.events for s in second.steps()] == [s.events for s in steps]
    assert sum(s.rejected_drafts for s in steps) > 0


class _Caller:
    """A caller's draws, as the fuzz makes them: accept one draft, propose K."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.asked: list[tuple[str, int]] = []

    def accepted(self, step: int, request_id: str, real_drafts: int) -> int:
        self.asked.append((request_id, real_drafts))
        return 1

    def proposed(self, step: int, request_ids: list[str]) -> dict[str, int]:
        return dict.fromkeys(request_ids, self.k)


def test_an_open_run_fed_step_by_step_is_written_back_as_the_same_run() -> None:
    sc = scenario("dual", cfg(speculative_config=eagle(2)), [req("unused", 1, 1)])
    draws = _Caller(2)
    driver = EventDriver(sc.profile, sc.config, draws)
    reference = Scheduler(sc.config, profile_named(sc.profile))
    driver.add(RequestSpec("0", 5, 6))
    records = [driver.advance(reference).record for _ in range(2)]
    driver.add(RequestSpec("1", 4, 3, arrival_step=driver.step))
    driver.abort("0")
    records += [driver.advance(reference).record for _ in range(4)]
    assert draws.asked and all(real <= 2 for _, real in draws.asked)
    assert driver.proposed and max(max(row.values()) for row in driver.proposed.values()) == 2
    replayed = list(ScenarioRun(driver.scenario(driver.step - 1)).records())
    # The written run ends when every request is done; the open one stepped on idle.
    assert replayed == records[: len(replayed)]
    assert len(replayed) >= 4 and not any(r.num_scheduled_tokens for r in records[len(replayed) :])


def test_an_unknown_check_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="check must be one of raise, collect"):
        Scheduler(config("eagle", k=2), profile_named("dual"), check="record")  # type: ignore[arg-type]
