"""The trace recorder inside the real vLLM scheduler: it changes no decision, and what it
writes replays against the reference (needs vLLM; fails under CI=true without it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualbudget.integration.live import LiveScheduler
from dualbudget.integration.lockstep import live_records
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

    plain = live_records(scenario, LiveScheduler(scenario.config))
    recording = LiveScheduler(scenario.config, scheduler_cls=RecordingScheduler)
    recorded = live_records(scenario, recording)
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


def test_the_async_recorder_records_and_replay_refuses_its_trace(
    profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under async scheduling vLLM picks ``AsyncScheduler``; its recording twin runs, says
    so in the header, and replay refuses the trace with one line (a documented limit)."""
    import subprocess
    import sys

    from dualbudget.integration.recorder import RecordingAsyncScheduler
    from dualbudget.reference.events import AddRequest, DraftProposals, ModelOutput, ScheduleStep

    scenario = load_scenario(REPO / "examples" / "priority.json")
    trace = tmp_path / "async.ndjson"
    monkeypatch.setenv("DUALBUDGET_TRACE", str(trace))
    live = LiveScheduler(scenario.config)
    live.vllm_config.scheduler_config.async_scheduling = True
    live.scheduler = RecordingAsyncScheduler(
        vllm_config=live.vllm_config,
        kv_cache_config=live.scheduler.kv_cache_config,
        structured_output_manager=live.scheduler.structured_output_manager,
        block_size=scenario.config.block_size,
        log_stats=False,
    )
    live.handle(AddRequest("a", 5, 3))
    record = live.handle(ScheduleStep())
    assert record is not None and record.num_scheduled_tokens == {"a": 5}
    live.handle(ModelOutput({"a": 1}))
    live.handle(DraftProposals({"a": scenario.config.num_speculative_tokens}))
    live.scheduler.shutdown()

    written = read_trace(trace)
    assert written.header.async_scheduling is True
    assert written.header.scheduler_class == "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
    assert written.steps == 1
    run = subprocess.run(
        [sys.executable, "-m", "dualbudget", "replay", str(trace)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2
    assert "async scheduling" in run.stderr and run.stderr.count("\n") == 1
