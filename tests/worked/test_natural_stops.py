"""Natural stops (``ModelOutput.stopped``): a request finishes FINISHED_STOPPED at its
stop token, as vLLM's ``check_stop`` does on EOS or a stop token, the stop token checked
before the length rule. The ``live`` tests feed vLLM the stop token itself and read back
the finish reason vLLM reports."""

from __future__ import annotations

from typing import Any

import pytest

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import (
    AddRequest,
    DraftProposals,
    Event,
    InvalidEvent,
    ModelOutput,
    ScheduleStep,
)
from dualbudget.reference.formats.scenario import ScenarioError, parse_scenario
from dualbudget.reference.runs.driver import ScenarioRun
from dualbudget.reference.state import FINISHED_LENGTH, FINISHED_STOPPED
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.profiles import profile_named
from tests.releases import every_release

EAGLE = EngineConfig(
    max_num_batched_tokens=64,
    max_num_seqs=4,
    max_model_len=64,
    block_size=16,
    num_gpu_blocks=64,
    speculative_config=SpeculativeConfig("eagle3", 2),
)
S = ScheduleStep()


def _stream(max_tokens: int, stopped_at: int) -> list[Event]:
    """r decodes once, then verifies 2 drafts, both accepted (3 tokens sampled), and
    the ``stopped_at``-th of them is its stop token."""
    return [
        AddRequest("r", 4, max_tokens),
        S,
        ModelOutput({"r": 1}),
        DraftProposals({"r": 2}),
        S,
        ModelOutput({"r": 3}, {"r": stopped_at}),
        DraftProposals({"r": 2}),
        S,
    ]


# (max_tokens, stop token at, status, output tokens kept)
STOP_CASES = [
    (20, 2, FINISHED_STOPPED, 1 + 2),  # the stop token ends it, the 3rd token is trimmed
    (2, 1, FINISHED_STOPPED, 2),  # stop token and max_tokens on one token: stop first
    (2, 3, FINISHED_LENGTH, 2),  # max_tokens comes before the stop token
]


@every_release
@pytest.mark.parametrize(("max_tokens", "at", "status", "kept"), STOP_CASES)
def test_natural_stop_finishes_the_request(
    profile: str, max_tokens: int, at: int, status: str, kept: int
) -> None:
    scheduler = make_scheduler(EAGLE, profile_named(profile))
    records = [r for r in (scheduler.handle(e) for e in _stream(max_tokens, at)) if r]
    request = scheduler.state.requests["r"]
    assert (request.status, request.num_output_tokens) == (status, kept)
    assert records[1].num_scheduled_tokens == {"r": 3}
    assert records[2].finished == ["r"] and records[2].num_scheduled_tokens == {}
    assert scheduler.observed["natural_stop"] == (status == FINISHED_STOPPED)


def test_a_stop_outside_the_sampled_tokens_is_refused() -> None:
    scheduler = make_scheduler(EAGLE, profile_named("vllm-0.33"))
    for event in _stream(20, 2)[:5]:
        scheduler.handle(event)
    for stopped in ({"r": 4}, {"r": 0}, {"x": 1}):
        with pytest.raises(InvalidEvent, match="stopped at token"):
            scheduler.fork().handle(ModelOutput({"r": 3}, stopped))


def _scenario(**extra: Any) -> dict[str, Any]:
    return {
        "profile": "vllm-0.32",
        "config": {
            "max_num_batched_tokens": 32,
            "max_num_seqs": 4,
            "max_model_len": 64,
            "block_size": 16,
            "num_gpu_blocks": 32,
            "speculative_config": {"method": "eagle3", "num_speculative_tokens": 2},
        },
        "requests": [
            {"id": "a", "prompt_len": 5, "max_tokens": 30},
            {"id": "b", "prompt_len": 7, "max_tokens": 30},
        ],
        "acceptance": {"fixed": 1},
        **extra,
    }


def test_scenario_stops_table_drives_and_writes_back() -> None:
    scenario = parse_scenario(_scenario(stops={"3": {"a": 2}, "5": {"b": 1}}))
    run = ScenarioRun(scenario)
    steps = list(run.steps())
    statuses = {rid: r.status for rid, r in run.scheduler.state.requests.items()}
    assert statuses == {"a": FINISHED_STOPPED, "b": FINISHED_STOPPED}
    assert steps[3].output.stopped == {"a": 2} and steps[5].output.stopped == {"b": 1}
    written = run.driver.scenario().to_json()
    assert written["stops"] == {"3": {"a": 2}, "5": {"b": 1}}
    again = ScenarioRun(parse_scenario(written))
    assert [s.record for s in again.steps()] == [s.record for s in steps]


def test_scenario_stops_are_checked() -> None:
    with pytest.raises(ScenarioError, match=r"stops\.3\.a"):
        parse_scenario(_scenario(stops={"3": {"a": 0}}))
    with pytest.raises(ScenarioError, match=r"stops\.3\.z"):
        parse_scenario(_scenario(stops={"3": {"z": 1}}))


# -- against vLLM ---------------------------------------------------------------------
@pytest.mark.live
@pytest.mark.parametrize(("max_tokens", "at", "status", "kept"), STOP_CASES)
def test_vllm_check_stop_agrees(
    max_tokens: int, at: int, status: str, kept: int, profile: str
) -> None:
    from dualbudget.integration.lockstep import Lockstep

    lock = Lockstep(EAGLE, profile)
    vllm = lock.live.scheduler
    reported: list[Any] = []
    update = vllm.update_from_output

    def keep(scheduler_output: Any, runner_output: Any) -> Any:
        outputs = update(scheduler_output, runner_output)
        reported.extend(o for batch in outputs.values() for o in batch.outputs)
        return outputs

    vllm.update_from_output = keep
    for event in _stream(max_tokens, at):
        lock.handle(event)  # raises DivergenceFound at the first differing step
    last = [o for o in reported if o.request_id == "r"][-1]
    assert str(last.finish_reason) == {FINISHED_STOPPED: "stop", FINISHED_LENGTH: "length"}[status]
    assert lock.reference.state.requests["r"].num_output_tokens == kept


@pytest.mark.live
def test_stops_table_agrees_with_vllm(profile: str) -> None:
    from dualbudget.integration.lockstep import run_in_lockstep

    scenario = parse_scenario(_scenario(profile=profile, stops={"3": {"a": 2}, "5": {"b": 1}}))
    steps, divergence = run_in_lockstep(scenario)
    assert divergence is None, divergence.report()
    assert steps > 5
