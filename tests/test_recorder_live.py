"""The trace recorder inside the real vLLM scheduler: it changes no decision, and what it
writes replays against the reference (needs vLLM; fails under CI=true without it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualbudget.integration.live import LiveScheduler
from dualbudget.integration.record_live import drive
from dualbudget.integration.testing import live_profile_name
from dualbudget.reference.events import StepRecord
from dualbudget.reference.replay import replay_trace
from dualbudget.reference.scenario import load_scenario
from dualbudget.reference.trace import read_trace

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def profile() -> str:
    return live_profile_name()


@pytest.mark.parametrize("example", ["kv-pressure.json", "priority.json", "dflash.json"])
def test_recording_changes_no_decision_and_replays(
    example: str, profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dualbudget.integration.recorder import RecordingScheduler

    scenario = load_scenario(REPO / "examples" / example).with_profile(profile)
    trace = tmp_path / "trace.ndjson"
    monkeypatch.setenv("DUALBUDGET_TRACE", str(trace))
    monkeypatch.setenv("DUALBUDGET_TRACE_SOURCE", "scheduler")

    plain = drive(scenario, LiveScheduler(scenario.config))
    recording = LiveScheduler(scenario.config, scheduler_cls=RecordingScheduler)
    recorded = drive(scenario, recording)
    recording.scheduler.shutdown()

    assert [r.decision() for r in recorded] == [r.decision() for r in plain]
    assert len(plain) > 3
    written = read_trace(trace)
    assert written.header.source == "scheduler"
    assert [r.decision() for r in written.entries if isinstance(r, StepRecord)] == [
        r.decision() for r in plain
    ]
    result = replay_trace(written)
    assert result.ok, (result.divergence, result.violations)
    assert result.steps_checked == len(plain)


def test_the_recorder_refuses_to_start_without_a_trace_path(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dualbudget.integration.recorder import RecordingScheduler

    monkeypatch.delenv("DUALBUDGET_TRACE", raising=False)
    scenario = load_scenario(REPO / "examples" / "priority.json")
    with pytest.raises(RuntimeError, match="DUALBUDGET_TRACE must name the trace file"):
        LiveScheduler(scenario.config, scheduler_cls=RecordingScheduler)
