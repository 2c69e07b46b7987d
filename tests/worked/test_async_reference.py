"""Async scheduling in the reference: the hand-worked streams of tests/async_cases.py
(tests/live/test_async_live.py runs the same streams against vLLM), and the driver's and the
scenario format's async rules."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import (
    AddRequest,
    DraftProposals,
    InvalidEvent,
    ModelOutput,
    ScheduleStep,
)
from dualbudget.reference.formats.scenario import parse_scenario
from dualbudget.reference.runs.driver import EventDriver, ScenarioRun, drive
from dualbudget.reference.state import FINISHED_STOPPED
from dualbudget.spec.config import ConfigError, SpeculativeConfig
from dualbudget.spec.profiles import profile_named
from tests.async_cases import CASES, EAGLE, S, out
from tests.releases import every_release
from tests.worked_cases import Case, run_case


@every_release
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hand_worked_case(case: Case, profile: str) -> None:
    decisions, scheduler = run_case(case, profile)
    assert decisions == list(case.expected)
    state = scheduler.state
    assert {rid: r.status for rid, r in state.requests.items()} == case.finished
    assert not state.in_flight
    for request in state.requests.values():
        assert request.num_in_flight_tokens == 0
        assert request.num_stale_output_tokens == 0


def test_stale_output_counts_and_the_skip_are_observed() -> None:
    stale = next(c for c in CASES if c.name == "waiting-loop-skips-stale")
    _, scheduler = run_case(stale, "vllm-0.32")
    assert scheduler.observed["stale_output"] == 2
    assert scheduler.observed["natural_stop"] == 1
    assert scheduler.observed["in_flight_max_tokens_skip"] == 1
    assert scheduler.observed["async_in_flight"] == 11  # every step but the first


def test_without_the_stale_skip_b_resumes_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """The skip is what the expected records pin: a reference that forgets it admits b at
    step 6 with 15 tokens."""
    stale = next(c for c in CASES if c.name == "waiting-loop-skips-stale")
    scheduler = make_scheduler(stale.config, profile_named("vllm-0.33"))
    decisions: list[dict[str, Any]] = []
    for event in stale.events[:13]:
        if isinstance(event, ScheduleStep) and len(decisions) == 6:
            for request in scheduler.state.requests.values():
                request.num_stale_output_tokens = 0  # the rule forgotten
        record = scheduler.handle(event)
        if record is not None:
            decisions.append(record.decision())
    assert decisions[6]["num_scheduled_tokens"] == {"b": 15}


def test_placeholders_resolved_at_a_stop_differ_by_release() -> None:
    """0.32 resolves the placeholders of the tokens kept after trimming at a stop, 0.33
    of every token returned: a request stopped at its 1st of 3 tokens keeps 2 (0.32) or
    0 (0.33) placeholders of that step."""
    events = (AddRequest("r", 4, 20), S, S, out(0, {"r": 1}), S, out(1, {"r": 3}, {"r": 1}))
    left = {}
    for profile in ("vllm-0.32", "vllm-0.33"):
        scheduler = make_scheduler(EAGLE, profile_named(profile))
        for event in events:
            scheduler.handle(event)
        left[profile] = scheduler.state.requests["r"].num_output_placeholders
    # Before the output of step 1: ph = 3 (step 1) + 3 (step 2) = 6.
    assert left == {"vllm-0.32": 6 - 1, "vllm-0.33": 6 - 3}


def test_stale_output_rolls_nothing_back() -> None:
    stale = next(c for c in CASES if c.name == "stale-output-delivered")
    scheduler = make_scheduler(stale.config, profile_named("vllm-0.32"))
    for event in stale.events[:13]:  # through the output of step 4
        scheduler.handle(event)
    b = scheduler.state.requests["b"]
    assert (b.num_computed_tokens, b.num_output_placeholders, b.num_output_tokens) == (0, 0, 4)


def test_output_for_a_step_not_in_flight_is_refused() -> None:
    scheduler = make_scheduler(EAGLE, profile_named("vllm-0.33"))
    scheduler.handle(AddRequest("r", 4, 5))
    scheduler.handle(S)
    scheduler.handle(out(0, {"r": 1}))
    with pytest.raises(InvalidEvent, match="not scheduled in step 0"):
        scheduler.handle(out(0, {"r": 1}))


def test_async_ngram_is_refused_by_0_32_and_accepted_by_0_33() -> None:
    # 0.32 refuses async ngram under any model runner; 0.33 runs it under model runner V2,
    # which refuses parallel drafting (so ngram-parallel stays refused).
    config = replace(EAGLE, speculative_config=SpeculativeConfig("ngram", 2))
    with pytest.raises(ConfigError) as caught:
        make_scheduler(config, profile_named("vllm-0.32"))
    assert caught.value.field == "async_scheduling"
    assert "vLLM 0.32 refuses async scheduling with 'ngram'" in caught.value.message
    assert make_scheduler(config, profile_named("vllm-0.33")).config.async_scheduling
    parallel = replace(config, speculative_config=SpeculativeConfig("ngram", 2, True))
    with pytest.raises(ConfigError, match=r"vLLM 0\.33 refuses async scheduling with 'ngram'"):
        make_scheduler(parallel, profile_named("vllm-0.33"))


def _scenario(async_scheduling: bool) -> dict[str, Any]:
    return {
        "profile": "vllm-0.32",
        "config": {
            "max_num_batched_tokens": 16,
            "max_num_seqs": 4,
            "max_model_len": 32,
            "block_size": 4,
            "num_gpu_blocks": 12,
            "async_scheduling": async_scheduling,
            "speculative_config": {"method": "eagle3", "num_speculative_tokens": 2},
        },
        "requests": [
            {"id": str(i), "prompt_len": 6 + 2 * i, "max_tokens": 4 + i, "arrival_step": i}
            for i in range(4)
        ],
        "acceptance": {"per_position": [0.8, 0.5], "seed": 1},
        "stops": {"6": {"2": 2}},
    }


def test_driver_feeds_the_batch_queue_order() -> None:
    scenario = parse_scenario(_scenario(True))
    run = ScenarioRun(scenario)
    steps = list(run.steps())
    assert steps[0].after == ()
    for n, step in enumerate(steps[1:], 1):
        assert [type(e) for e in step.after] == [ModelOutput]
        output = step.after[0]
        assert isinstance(output, ModelOutput) and output.step == n - 1
        assert all(not isinstance(e, DraftProposals) for e in step.events)
    # Drained at the end: nothing left in flight.
    assert not run.scheduler.state.in_flight
    assert run.driver.pending is None


def test_driver_writes_back_an_async_run_that_replays_it() -> None:
    scenario = parse_scenario(_scenario(True))
    driver = EventDriver.of(scenario)
    reference = make_scheduler(scenario.config, profile_named(scenario.profile))
    records = [step.record for step in drive(driver, reference)]
    again = driver.scenario()
    assert again.config.async_scheduling and again.stops == {6: {"2": 2}}
    replayed = [step.record for step in ScenarioRun(parse_scenario(again.to_json())).steps()]
    assert replayed == records
    finished = {rid: r.status for rid, r in reference.state.requests.items()}
    assert finished["2"] == FINISHED_STOPPED


def test_sync_scenario_json_is_unchanged_by_the_new_keys() -> None:
    sync = parse_scenario({k: v for k, v in _scenario(False).items() if k != "stops"})
    written = sync.to_json()
    assert "async_scheduling" not in written["config"] and "stops" not in written


def test_scenario_async_scheduling_is_checked() -> None:
    from dualbudget.reference.formats.scenario import ScenarioError

    bad = _scenario(True)
    bad["config"]["async_scheduling"] = "yes"
    with pytest.raises(ScenarioError, match=r"config\.async_scheduling"):
        parse_scenario(bad)
    ngram = _scenario(True)
    ngram["config"]["speculative_config"]["method"] = "ngram"
    with pytest.raises(ScenarioError, match=r"config\.async_scheduling: .* vLLM 0\.32 refuses"):
        parse_scenario(ngram)
