"""The engine's calls on the scheduler in the reference: ``reset_prefix_cache`` and
``set_pause_state``, by the hand-worked streams of tests/engine_call_cases.py and by what
each leaves in the state and the pool."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import (
    AddRequest,
    InvalidEvent,
    ModelOutput,
    ResetPrefixCache,
    ScheduleStep,
    SetPauseState,
)
from dualbudget.reference.formats.scenario import (
    RequestSpec,
    Scenario,
    ScenarioError,
    parse_scenario,
)
from dualbudget.reference.runs.driver import EventDriver, ScenarioRun, drive
from dualbudget.reference.scheduler import Scheduler
from dualbudget.reference.state import PREEMPTED
from dualbudget.spec.profiles import profile_named
from tests.engine_call_cases import ASYNC, CASES, SYNC
from tests.releases import every_release
from tests.worked_cases import Case, run_case


@every_release
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hand_worked_case(case: Case, profile: str) -> None:
    decisions, scheduler = run_case(case, profile)
    assert decisions == list(case.expected)
    assert {rid: r.status for rid, r in scheduler.state.requests.items()} == case.finished
    assert not scheduler.state.in_flight


def _until_reset(case_name: str) -> Scheduler:
    case = next(c for c in CASES if c.name == case_name)
    scheduler = make_scheduler(case.config, profile_named("vllm-0.34"))
    for event in case.events:
        scheduler.handle(event)
        if isinstance(event, ResetPrefixCache):
            return scheduler
    raise AssertionError("the case has no reset")


def test_a_reset_keeps_every_accepted_token_and_takes_back_the_rest() -> None:
    scheduler = _until_reset("reset-preempts-running-in-order")
    state = scheduler.state
    assert state.running == [] and state.waiting == ["a", "b"]
    assert state.preempted_since_step == ["b", "a"]  # popped from the last
    for request in state.requests.values():
        assert request.status == PREEMPTED
        assert request.num_output_tokens == 2  # the two outputs it had
        assert (request.num_computed_tokens, request.num_blocks, request.num_drafts) == (0, 0, 0)
    assert state.free_blocks == SYNC.num_gpu_blocks - 1
    assert scheduler.observed["reset_preempted"] == 1


def test_a_reset_under_async_marks_the_output_in_flight_dropped() -> None:
    scheduler = _until_reset("reset-drops-the-output-in-flight")
    a = scheduler.state.requests["a"]
    assert (a.num_stale_output_tokens, a.drop_stale_output) == (1, True)
    assert (a.num_output_placeholders, a.num_output_tokens) == (0, 1)
    case = next(c for c in CASES if c.name == "reset-drops-the-output-in-flight")
    _, done = run_case(case, "vllm-0.34")
    assert done.observed["stale_output_dropped"] == 1
    assert done.observed["stale_output"] == 1


def test_a_request_with_output_to_deliver_waits_but_one_dropped_does_not() -> None:
    """The same stream with the preemption made without ``drop_stale_output`` (as KV
    pressure makes it): a waits for its stale output before it resumes."""
    case = next(c for c in CASES if c.name == "reset-drops-the-output-in-flight")
    scheduler = make_scheduler(case.config, profile_named("vllm-0.34"))
    for event in case.events[:4]:
        scheduler.handle(event)
    state = scheduler.state
    state.running.remove("a")
    scheduler._preempt(state.requests["a"])
    record = scheduler.handle(ScheduleStep())
    assert record is not None and record.num_scheduled_tokens == {}


def test_the_pool_forgets_its_hashes_only_with_no_block_held() -> None:
    config = replace(SYNC, enable_prefix_caching=True)
    scheduler = make_scheduler(config, profile_named("vllm-0.34"))
    ids = tuple(range(100, 108))
    scheduler.handle(AddRequest("a", 8, 1, prompt_token_ids=ids))
    scheduler.handle(ScheduleStep())
    pool = scheduler.state.block_pool
    assert pool is not None and len(pool.cached) == 2
    scheduler.handle(ResetPrefixCache())  # a holds its blocks: refused, hashes kept
    assert len(pool.cached) == 2
    scheduler.handle(ModelOutput({"a": 1}, token_ids={"a": (7,)}))  # a finishes
    scheduler.handle(ResetPrefixCache())
    assert not pool.cached and set(pool.block_hash) == {None}
    scheduler.handle(AddRequest("b", 8, 1, prompt_token_ids=ids))
    record = scheduler.handle(ScheduleStep())
    assert record is not None and record.num_scheduled_tokens == {"b": 8}  # no hit
    assert scheduler.observed["prefix_hit"] == 0


def test_a_reset_with_running_requests_in_a_pool_that_keeps_blocks_is_refused() -> None:
    scheduler = make_scheduler(SYNC, profile_named("vllm-0.34"))
    scheduler.state.free_blocks -= 1  # a block held by nothing the reference knows
    with pytest.raises(InvalidEvent, match="blocks still held"):
        scheduler.handle(ResetPrefixCache(reset_running_requests=True))


def test_an_unknown_pause_state_is_refused() -> None:
    with pytest.raises(InvalidEvent, match="paused_new"):
        SetPauseState("paused")


def test_a_driven_run_with_engine_calls_is_written_back_and_replays() -> None:
    scenario = Scenario(
        "vllm-0.34",
        ASYNC,
        (RequestSpec("a", 6, 8), RequestSpec("b", 5, 8, 1)),
        resets={3: True},
        pauses={4: "paused_all", 6: "unpaused"},
    )
    driver = EventDriver.of(scenario)
    reference = make_scheduler(scenario.config, profile_named(scenario.profile))
    records = [step.record for step in drive(driver, reference)]
    assert records[3].preempted and records[4].num_scheduled_tokens == {}
    written = driver.scenario().to_json()
    assert written["resets"] == {"3": True}
    assert written["pauses"] == {"4": "paused_all", "6": "unpaused"}
    replayed = [step.record for step in ScenarioRun(parse_scenario(written)).steps()]
    assert replayed == records


def test_a_scenario_names_a_bad_pause_state() -> None:
    written = Scenario("vllm-0.34", SYNC, (RequestSpec("a", 4, 2),)).to_json()
    written["pauses"] = {"1": "paused"}
    with pytest.raises(ScenarioError, match="pauses"):
        parse_scenario(written)
