"""The trace recorder inside the real vLLM scheduler: it changes no decision, and what it
writes replays against the reference (needs vLLM; fails under CI=true without it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dualbudget.integration.live import LiveScheduler
from dualbudget.integration.lockstep import live_records
from dualbudget.reference.events import ModelOutput, ResetPrefixCache, SetPauseState, StepRecord
from dualbudget.reference.formats.deployments import DEPLOYMENTS, Deployment
from dualbudget.reference.formats.scenario import RequestSpec, Scenario, load_scenario, validate
from dualbudget.reference.formats.trace import VERSION, read_trace
from dualbudget.reference.runs.replay import replay_trace
from dualbudget.reference.runs.workload import preset
from dualbudget.spec.profiles import profile_named
from tests.paths import REPO

pytestmark = pytest.mark.live


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
    assert result.ok, (result.divergence, result.free_blocks_divergence, result.violations)
    assert result.steps_checked == len(plain)
    # vLLM's pool after every step, read by the recorder and matched by the reference's;
    # it moved during the run, so the check is not one of a constant.
    assert sorted(written.free_blocks) == list(range(len(plain)))
    assert result.free_blocks_checked == len(plain)
    assert len(set(written.free_blocks.values())) > 1


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_engines_calls_are_recorded_where_vllm_took_them_and_replay(
    async_scheduling: bool, profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefix-cache reset that preempts the running requests, and a pause and resume,
    made on the recording scheduler between steps: each is written between the two steps
    it came between, nothing vLLM decides changes, and the trace replays with every
    decision and every pool agreeing."""
    from dualbudget.integration.recorder import RecordingAsyncScheduler, RecordingScheduler
    from tests.engine_call_cases import ASYNC, SYNC

    # Prefix caching on, so that the reset is seen: without it, a and b would resume on
    # their own cached blocks at step 2 instead of computing every token again.
    config = dataclasses.replace(ASYNC if async_scheduling else SYNC, enable_prefix_caching=True)
    scenario = validate(
        Scenario(
            profile,
            config,
            (RequestSpec("a", 8, 8), RequestSpec("b", 8, 8), RequestSpec("c", 4, 4, 4)),
            resets={2: True, 7: False},  # the second finds blocks held: vLLM refuses it
            pauses={3: "paused_new", 5: "paused_all", 6: "unpaused"},
        )
    )
    trace = tmp_path / "calls.ndjson"
    monkeypatch.setenv("DUALBUDGET_TRACE", str(trace))
    monkeypatch.setenv("DUALBUDGET_TRACE_SOURCE", "scheduler")
    plain = live_records(scenario, LiveScheduler(scenario.config))
    recording_cls = RecordingAsyncScheduler if async_scheduling else RecordingScheduler
    recording = LiveScheduler(scenario.config, scheduler_cls=recording_cls)
    recorded = live_records(scenario, recording)
    recording.scheduler.shutdown()
    assert [r.decision() for r in recorded] == [r.decision() for r in plain]

    written = read_trace(trace)
    assert written.header.version == VERSION
    assert written.header.async_scheduling is async_scheduling
    # Each call with the last step line before it and the first after it.
    calls, last = [], None
    for entry in written.entries:
        if isinstance(entry, StepRecord):
            last = entry.step
        elif isinstance(entry, ResetPrefixCache | SetPauseState):
            calls.append((entry, last))
    assert calls == [
        (ResetPrefixCache(reset_running_requests=True), 1),
        (SetPauseState("paused_new"), 2),
        (SetPauseState("paused_all"), 4),
        (SetPauseState("unpaused"), 5),
        (ResetPrefixCache(reset_running_requests=False), 6),
    ]
    steps = [e for e in written.entries if isinstance(e, StepRecord)]
    assert steps[2].preempted == ["a", "b"]  # vLLM reports the reset's victims
    assert "c" not in steps[4].num_scheduled_tokens  # paused_new: c arrived, not admitted
    assert steps[5].num_scheduled_tokens == {}  # paused_all
    assert "c" in steps[6].num_scheduled_tokens  # resumed
    result = replay_trace(written)
    assert result.ok, (result.divergence, result.free_blocks_divergence, result.violations)
    assert result.steps_checked == result.free_blocks_checked == len(plain)


def test_the_recorder_refuses_to_start_without_a_trace_path(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dualbudget.integration.recorder import RecordingScheduler

    monkeypatch.delenv("DUALBUDGET_TRACE", raising=False)
    scenario = load_scenario(REPO / "examples" / "priority.json")
    with pytest.raises(RuntimeError, match="DUALBUDGET_TRACE must name the trace file"):
        LiveScheduler(scenario.config, scheduler_cls=RecordingScheduler)


def _stopping(scenario: Scenario, async_scheduling: bool) -> Scenario:
    """``scenario`` with every request that samples in steps 3, 6, ... stopping at its
    first token (EOS or a stop token, decided by vLLM's own check_stop)."""
    stops = {s: {r.id: 1 for r in scenario.requests} for s in range(3, 40, 3)}
    config = dataclasses.replace(scenario.config, async_scheduling=async_scheduling)
    return validate(dataclasses.replace(scenario, config=config, stops=stops))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_natural_stops_are_recorded_from_vllm_and_replay(
    async_scheduling: bool, profile: str, tmp_path: Path
) -> None:
    """vLLM's check_stop finishes the requests (FINISHED_STOPPED); the recorder takes the
    stops from what update_from_output reports, and the trace replays with them."""
    from dualbudget.integration.scheduler_trace import write_scheduler_trace

    scenario = _stopping(load_scenario(REPO / "examples" / "kv-pressure.json"), async_scheduling)
    scenario = scenario.with_profile(profile)
    path = tmp_path / "stops.ndjson"
    steps = write_scheduler_trace(scenario, path)
    trace = read_trace(path)
    assert trace.header.version == VERSION and trace.steps == steps > 3
    assert trace.header.async_scheduling is async_scheduling
    expected = "AsyncScheduler" if async_scheduling else "Scheduler"
    assert trace.header.scheduler_class.rsplit(".", 1)[1] == expected
    outputs = [e for e in trace.entries if isinstance(e, ModelOutput)]
    assert all(o.step is not None for o in outputs)
    assert trace.natural_stops > 0
    result = replay_trace(trace)
    assert result.ok, (result.divergence, result.violations)
    assert result.natural_stops == trace.natural_stops


def test_the_recorder_follows_async_scheduling_and_reads_every_setting(
    profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--scheduler-cls ...RecordingScheduler`` alone records an async deployment (it
    hands over to its AsyncScheduler twin), and the header's settings come from the live
    config: a non-default one makes replay refuse the trace, naming it."""
    import subprocess
    import sys

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from dualbudget.integration.recorder import RecordingScheduler

    scenario = load_scenario(REPO / "examples" / "kv-pressure.json").with_profile(profile)
    trace = tmp_path / "async.ndjson"
    monkeypatch.setenv("DUALBUDGET_TRACE", str(trace))
    live = LiveScheduler(scenario.config)
    live.vllm_config.scheduler_config.async_scheduling = True
    live.vllm_config.scheduler_config.watermark = 0.05
    scheduler = RecordingScheduler(
        vllm_config=live.vllm_config,
        kv_cache_config=live.scheduler.kv_cache_config,
        structured_output_manager=live.scheduler.structured_output_manager,
        block_size=scenario.config.block_size,
        log_stats=False,
    )
    assert isinstance(scheduler, AsyncScheduler)
    scheduler.shutdown()
    written = read_trace(trace)
    assert written.header.async_scheduling is True
    assert written.header.scheduler_class == "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
    assert written.header.settings["watermark"] == 0.05
    assert written.header.settings["kv_cache_groups"] == ["FullAttentionSpec"]
    run = subprocess.run(
        [sys.executable, "-m", "dualbudget", "replay", str(trace)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "recorded with watermark = 0.05" in run.stderr


FAMILIES = [
    d for d in DEPLOYMENTS if not d.settings and [n for n, _ in d.groups] != ["FullAttentionSpec"]
]
"""The families of the table whose KV groups are not one full-attention group."""


@pytest.mark.parametrize("deployment", FAMILIES, ids=lambda d: d.family)
def test_a_family_recorded_at_vllms_defaults_replays_as_the_table_says(
    deployment: Deployment, profile: str, tmp_path: Path
) -> None:
    """A family of the deployment table, recorded from vLLM's own scheduler at its
    defaults (its KV groups, async, prefix caching on; an EAGLE drafter of the same K for
    MTP), replays agreeing where the table says it replays, and is refused by the
    reference naming its layout where the table says refused."""
    from dualbudget.integration.lockstep import DivergenceFound
    from dualbudget.integration.scheduler_trace import deployment_config, write_scheduler_trace

    release = profile_named(profile).release
    stand_in = "eagle" if deployment.method == "mtp" else None
    scenario = preset("chat-system-prompt").scenario(0)
    config, notes = deployment_config(scenario.config, deployment.family, stand_in, release)
    blocks = max(300, -(-config.max_model_len // config.block_size) * len(config.groups) + 2)
    config = dataclasses.replace(config, num_gpu_blocks=blocks)
    scenario = validate(dataclasses.replace(scenario, profile=profile, config=config))
    path = tmp_path / "family.ndjson"
    # The recorder builds vLLM's scheduler configs itself, as a scheduler-level trace
    # does, not through the engine: the table's verdict for such a recording.
    verdict = deployment.verdict(release.version, served=False)
    if verdict != "replays":
        with pytest.raises(DivergenceFound, match="validation"):
            write_scheduler_trace(scenario, path, 30, notes)
        return
    assert write_scheduler_trace(scenario, path, 30, notes) == 30
    trace = read_trace(path)
    assert trace.header.settings["kv_cache_groups"] == [name for name, _ in deployment.groups]
    assert trace.header.config.enable_prefix_caching and trace.header.async_scheduling
    result = replay_trace(trace)
    assert result.ok and result.steps_checked == 30, (
        result.divergence,
        result.free_blocks_divergence,
        result.violations,
    )
    assert result.free_blocks_checked == 30


def test_gpt_oss_recorded_at_the_engines_retention_replays(profile: str, tmp_path: Path) -> None:
    """gpt-oss + EAGLE3 recorded from vLLM's own scheduler built on a ``KVCacheConfig``
    holding the engine's ``prefix_cache_retention_interval`` = 0: the header and its
    config say 0, and the replay agrees on every step with hits."""
    from dualbudget.integration.scheduler_trace import deployment_config, write_scheduler_trace

    release = profile_named(profile).release
    scenario = preset("chat-system-prompt").scenario(0)
    config, notes = deployment_config(scenario.config, "gpt-oss + EAGLE3", None, release)
    blocks = max(300, -(-config.max_model_len // config.block_size) * len(config.groups) + 2)
    config = dataclasses.replace(config, num_gpu_blocks=blocks, prefix_cache_retention_interval=0)
    scenario = validate(dataclasses.replace(scenario, profile=profile, config=config))
    path = tmp_path / "gpt-oss.ndjson"
    assert write_scheduler_trace(scenario, path, 60, notes) == 60
    trace = read_trace(path)
    assert trace.header.settings["prefix_cache_retention_interval"] == 0
    assert trace.header.config.prefix_cache_retention_interval == 0
    result = replay_trace(trace)
    assert result.ok and result.steps_checked == 60, (
        result.divergence,
        result.free_blocks_divergence,
        result.violations,
    )
    assert result.free_blocks_checked == 60
    assert result.prefix_hits > 0
