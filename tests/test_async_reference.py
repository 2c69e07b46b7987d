"""Async scheduling in the reference: each rule of vLLM's ``AsyncScheduler`` pinned by a
hand-worked event stream (tests/test_async_live.py runs the same streams against vLLM).

Each case lists the events and, for every ``ScheduleStep``, the decision worked out by
hand from vLLM's code: the comments under each case give the arithmetic (``c`` computed
tokens, ``ph`` output placeholders, ``t`` num_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.driver import EventDriver, ScenarioRun, drive
from dualbudget.reference.events import (
    AddRequest,
    DraftProposals,
    Event,
    InvalidEvent,
    ModelOutput,
    ScheduleStep,
)
from dualbudget.reference.scenario import parse_scenario
from dualbudget.reference.scheduler import Scheduler
from dualbudget.reference.state import FINISHED_LENGTH, FINISHED_STOPPED
from dualbudget.spec.config import ConfigError, EngineConfig, SpeculativeConfig
from dualbudget.spec.profiles import profile_named

EAGLE = EngineConfig(
    max_num_batched_tokens=64,
    max_num_seqs=4,
    max_model_len=64,
    block_size=16,
    num_gpu_blocks=64,
    speculative_config=SpeculativeConfig("eagle3", 2),
    async_scheduling=True,
)
# Eight usable blocks of four tokens: two 12-token prompts fill them by their 16th token.
TIGHT = EngineConfig(
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=32,
    block_size=4,
    num_gpu_blocks=9,
    async_scheduling=True,
)


def decision(
    scheduled: dict[str, int],
    spec: dict[str, int] | None = None,
    preempted: list[str] | None = None,
    finished: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "num_scheduled_tokens": scheduled,
        "scheduled_spec_tokens": spec or {},
        "preempted": preempted or [],
        "finished": finished or [],
    }


S = ScheduleStep()


def out(step: int, sampled: dict[str, int], stopped: dict[str, int] | None = None) -> ModelOutput:
    return ModelOutput(sampled, stopped or {}, step)


@dataclass(frozen=True)
class Case:
    name: str
    config: EngineConfig
    events: tuple[Event, ...]
    expected: tuple[dict[str, Any], ...]
    """One decision per ScheduleStep, in order."""
    finished: dict[str, str]
    """The final status of each request."""


CASES = (
    Case(
        # The placeholders in the running loop's need, K placeholder drafts scheduled with
        # no DraftProposals, rejected drafts rolling back computed tokens and placeholders,
        # and the skip of a request whose in-flight output already reaches max_tokens.
        "placeholders-and-max-tokens-skip",
        EAGLE,
        (
            AddRequest("r", 4, 5),
            S,  # 0: q=4, the prompt; then c=4 ph=1, drafts 2 (placeholders)
            S,  # 1: need 4+2+1-4=3, spec 3+4-4-1=2; c=7 ph=4
            out(0, {"r": 1}),  # ph 3, t=5
            S,  # 2: need 5+2+3-7=3, spec 2; c=10 ph=6
            out(1, {"r": 1}),  # 2 rejected: c=8 ph=4; then ph=3, t=6
            S,  # 3: skip test 8+2-3=7 < 4+5; q=3; c=11 ph=6
            out(2, {"r": 1}),  # c=9 ph=3 t=7
            S,  # 4: 9+2-3=8 < 9; q=3; c=12 ph=6
            out(3, {"r": 1}),  # c=10 ph=3 t=8
            S,  # 5: 10+2-3=9 >= 9: skipped, nothing scheduled
            out(4, {"r": 1}),  # t=9: output 5 = max_tokens, finished
            S,  # 6: reports r finished
            out(5, {}),
            out(6, {}),
        ),
        (
            decision({"r": 4}),
            decision({"r": 3}, {"r": 2}),
            decision({"r": 3}, {"r": 2}),
            decision({"r": 3}, {"r": 2}),
            decision({"r": 3}, {"r": 2}),
            decision({}),
            decision({}, finished=["r"]),
        ),
        {"r": FINISHED_LENGTH},
    ),
    Case(
        # Preemption turns the victim's in-flight output stale: it still arrives and its
        # token is appended (b resumes with 16 tokens, not 15), but it rolls back nothing.
        "stale-output-delivered",
        TIGHT,
        (
            AddRequest("a", 12, 6),
            AddRequest("b", 12, 6, arrival_time=1.0),
            S,  # 0: a 12 (3 blocks), b a 4-token chunk (1 block); free 4
            S,  # 1: a 1 (4 blocks), b 8 (3 blocks); free 1
            out(0, {"a": 1, "b": 0}),
            S,  # 2: a 1, b 1 (4 blocks); free 0
            out(1, {"a": 1, "b": 1}),
            S,  # 3: a 1, b 1
            out(2, {"a": 1, "b": 1}),
            S,  # 4: a 1, b 1
            out(3, {"a": 1, "b": 1}),
            S,  # 5: a needs a 5th block: b preempted, its step-4 token in flight (stale 1)
            out(4, {"a": 1, "b": 1}),  # b's stale token appended: b t=16
            S,  # 6: a skipped (17+2-1 >= 18); b's 16 tokens need 4 blocks, 3 free
            out(5, {"a": 1}),  # a reaches max_tokens 6, finished
            S,  # 7: b resumes with all 16 tokens
            out(6, {}),
            S,  # 8: b 1
            out(7, {"b": 1}),
            S,  # 9: b skipped (17+2-1 >= 18)
            out(8, {"b": 1}),  # b finished
            S,  # 10
            out(9, {}),
            out(10, {}),
        ),
        (
            decision({"a": 12, "b": 4}),
            decision({"a": 1, "b": 8}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1}, preempted=["b"]),
            decision({}),
            decision({"b": 16}, finished=["a"]),
            decision({"b": 1}),
            decision({}),
            decision({}, finished=["b"]),
        ),
        {"a": FINISHED_LENGTH, "b": FINISHED_LENGTH},
    ),
    Case(
        # Outputs three steps behind (a deeper batch queue than the engine's 2): at step 6
        # b's stale output of step 4 is still to come, so the waiting loop skips b though
        # a's natural stop has freed the pool; b resumes once it has come.
        "waiting-loop-skips-stale",
        TIGHT,
        (
            AddRequest("a", 12, 10),
            AddRequest("b", 12, 6, arrival_time=1.0),
            S,  # 0: a 12, b 4
            S,  # 1: a 1, b 8
            S,  # 2: a 1, b 1; free 0
            out(0, {"a": 1, "b": 0}),
            S,  # 3: a 1, b 1
            out(1, {"a": 1, "b": 1}),
            S,  # 4: a 1, b 1
            out(2, {"a": 1, "b": 1}),
            S,  # 5: a needs a 5th block: b preempted with steps 3 and 4 in flight (stale 2)
            out(3, {"a": 1, "b": 1}, {"a": 1}),  # a stops (frees 5 blocks); b t=15, stale 1
            S,  # 6: b skipped while its step-4 output can still arrive
            out(4, {"a": 1, "b": 1}),  # b t=16, stale 0
            S,  # 7: b resumes with 16 tokens
            out(5, {"a": 1}),
            S,  # 8: b 1
            out(6, {}),
            S,  # 9: b 1 (16+2-... : 17+2-2 < 18)
            out(7, {"b": 1}),
            S,  # 10: b skipped (18+2-2 >= 18)
            out(8, {"b": 1}),  # b finished
            S,  # 11
            out(9, {"b": 1}),
            out(10, {}),
            out(11, {}),
        ),
        (
            decision({"a": 12, "b": 4}),
            decision({"a": 1, "b": 8}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1}, preempted=["b"]),
            decision({}, finished=["a"]),
            decision({"b": 16}),
            decision({"b": 1}),
            decision({"b": 1}),
            decision({}),
            decision({}, finished=["b"]),
        ),
        {"a": FINISHED_STOPPED, "b": FINISHED_LENGTH},
    ),
    Case(
        # A natural stop in an output while the next step is in flight: the request
        # finishes FINISHED_STOPPED at the stop token; the in-flight step's output for
        # it is ignored.
        "natural-stop-in-flight",
        EAGLE,
        (
            AddRequest("r", 4, 20),
            S,  # 0
            S,  # 1: 3 tokens, 2 spec
            out(0, {"r": 1}),
            S,  # 2: 3 tokens, 2 spec
            out(1, {"r": 3}, {"r": 2}),  # both drafts accepted; the 2nd token stops r
            S,  # 3: reports r finished
            out(2, {"r": 1}),
            out(3, {}),
        ),
        (
            decision({"r": 4}),
            decision({"r": 3}, {"r": 2}),
            decision({"r": 3}, {"r": 2}),
            decision({}, finished=["r"]),
        ),
        {"r": FINISHED_STOPPED},
    ),
)


def run_case(case: Case, profile: str) -> tuple[list[dict[str, Any]], Scheduler]:
    scheduler = make_scheduler(case.config, profile_named(profile))
    decisions = []
    for event in case.events:
        record = scheduler.handle(event)
        if record is not None:
            decisions.append(record.decision())
    return decisions, scheduler


@pytest.mark.parametrize("profile", ["vllm-0.32", "vllm-0.33"])
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
    from dualbudget.reference.scenario import ScenarioError

    bad = _scenario(True)
    bad["config"]["async_scheduling"] = "yes"
    with pytest.raises(ScenarioError, match=r"config\.async_scheduling"):
        parse_scenario(bad)
    ngram = _scenario(True)
    ngram["config"]["speculative_config"]["method"] = "ngram"
    with pytest.raises(ScenarioError, match=r"config\.async_scheduling: .* vLLM 0\.32 refuses"):
        parse_scenario(ngram)
