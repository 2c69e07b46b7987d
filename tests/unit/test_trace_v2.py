"""Trace format version 2: model outputs name their step and natural stops, the header
carries every setting of reference/formats/settings.py, replay refuses a setting it does not model
by name (exit 2), version 1 is still read, and ``replay --json`` summarises each trace."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dualbudget import TRACES
from dualbudget.reference.events import AddRequest, ModelOutput, StepRecord
from dualbudget.reference.formats.scenario import Scenario, validate
from dualbudget.reference.formats.settings import ENGINE_SETTINGS, REQUEST_SETTINGS, SETTINGS
from dualbudget.reference.formats.trace import TraceHeader, TraceWriter, read_trace
from dualbudget.reference.runs.replay import replay_trace
from dualbudget.reference.runs.synthetic_trace import write_synthetic_trace
from dualbudget.reference.runs.workload import preset
from dualbudget.spec.releases import RELEASE_VERSIONS

SHIPPED = TRACES
STOPS_TRACE = SHIPPED / "engine-draft-model-k3-stops.ndjson"


def dualbudget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dualbudget", *args], capture_output=True, text=True, check=False
    )


def chat(async_scheduling: bool = False, stops: bool = False) -> Scenario:
    """chat-poisson (P-EAGLE K=4, max_num_seqs 32), a KV pool small enough to preempt."""
    scenario = preset("chat-poisson").scenario(seed=3)
    config = dataclasses.replace(
        scenario.config, async_scheduling=async_scheduling, num_gpu_blocks=140
    )
    # Every request that samples in steps 30, 60, ... stops at its first token.
    table = {s: {r.id: 1 for r in scenario.requests} for s in range(30, 200, 30)}
    return validate(dataclasses.replace(scenario, config=config, stops=table if stops else None))


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = tmp_path_factory.mktemp("v2") / "t.ndjson"
    write_synthetic_trace(chat(stops=True), path, "0.32.0", max_steps=150)
    return path.read_text().splitlines()


def write(tmp_path: Path, lines: list[str], name: str = "t.ndjson") -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def with_header(lines: list[str], **changes: Any) -> list[str]:
    header = json.loads(lines[0])
    for key, value in changes.items():
        if key.startswith("settings."):
            header["settings"][key.removeprefix("settings.")] = value
        elif value is None:
            header.pop(key, None)
        else:
            header[key] = value
    return [json.dumps(header), *lines[1:]]


def test_version_2_names_each_outputs_step_and_the_natural_stops(lines: list[str]) -> None:
    header = json.loads(lines[0])
    assert header["version"] >= 2  # what version 2 introduced, later versions keep
    assert tuple(header["settings"]) == ENGINE_SETTINGS
    assert "async_scheduling" not in header and "enable_prefix_caching" not in header
    outputs = [json.loads(line) for line in lines if '"model_output"' in line]
    steps = [json.loads(line)["step"] for line in lines if '"event":"step"' in line]
    # Synchronous: each output answers the step just before it.
    assert [o["step"] for o in outputs] == steps[: len(outputs)]
    assert sum(len(o["stopped"]) for o in outputs) > 0
    assert all(1 <= n <= o["num_sampled"][rid] for o in outputs for rid, n in o["stopped"].items())


def test_the_natural_stop_trace_replays(tmp_path: Path, lines: list[str]) -> None:
    trace = read_trace(write(tmp_path, lines))
    result = replay_trace(trace)
    assert result.ok, (result.divergence, result.violations)
    assert result.natural_stops == trace.natural_stops > 0
    assert result.steps_checked == 150


def test_an_async_trace_with_natural_stops_replays(tmp_path: Path) -> None:
    path = tmp_path / "async.ndjson"
    write_synthetic_trace(chat(async_scheduling=True, stops=True), path, "0.33.0", 150)
    trace = read_trace(path)
    assert trace.header.async_scheduling
    outputs = [e for e in trace.entries if isinstance(e, ModelOutput)]
    # Under async an output arrives after the next step is scheduled: its step says which.
    order = [e.step for e in trace.entries if isinstance(e, StepRecord | ModelOutput)]
    assert any(step is not None and step < i - 1 for i, step in enumerate(order))
    assert all(o.step is not None for o in outputs)
    run = dualbudget("replay", str(path), "--json", str(tmp_path / "r.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    (entry,) = json.loads((tmp_path / "r.json").read_text())["traces"]
    assert entry["async_scheduling"] is True and entry["natural_stops"] > 0


# A value of every setting the reference does not model, other than the one it replays.
UNMODELLED = {
    "max_num_active_seqs": 3,
    "watermark": 0.01,
    "cache_aware_admission_window": 8,
    "scheduler_reserve_full_isl": False,
    "long_prefill_token_threshold_adaptive": True,
    "prefill_schedule_interval": 2,
    "num_speculative_tokens_per_batch_size": [[1, 8, 2]],
    "disable_eagle_block_drop": True,
    "disable_lookahead_block_hashes": True,
    "kv_cache_groups": ["FullAttentionSpec", "SlidingWindowSpec"],
    "prefix_replay_tokens": 128,
    "prefix_match_unit": 8,
    "enable_mamba_shared_prefix_checkpoint": True,
    "enable_lora": True,
    "kv_connector": "OffloadingConnector",
    "pipeline_parallel_size": 2,
    "decode_context_parallel_size": 2,
}


def test_every_unmodelled_engine_setting_has_a_refusal_case() -> None:
    unmodelled = {s.name for s in SETTINGS if not s.modelled and s.scope == "engine"}
    # Refused only on some traces (routed experts on the release that caps hits for
    # it): tests/unit/test_settings.py.
    refused_on_some = {"enable_return_routed_experts"}
    assert set(UNMODELLED) == unmodelled - refused_on_some


@pytest.mark.parametrize("name", sorted(UNMODELLED))
def test_a_setting_the_reference_does_not_model_is_refused_by_name(
    tmp_path: Path, lines: list[str], name: str
) -> None:
    run = dualbudget(
        "replay", write(tmp_path, with_header(lines, **{f"settings.{name}": UNMODELLED[name]}))
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert f"recorded with {name} = {json.dumps(UNMODELLED[name])}" in run.stderr
    assert "does not model" in run.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("max_num_active_seqs", 32),  # the profile's own cap: max_num_seqs
    ],
)
def test_values_the_reference_derives_itself_replay(
    tmp_path: Path, lines: list[str], name: str, value: object
) -> None:
    run = dualbudget("replay", write(tmp_path, with_header(lines, **{f"settings.{name}": value})))
    assert run.returncode == 0, run.stdout + run.stderr


def test_mtp_modules_on_another_drafters_trace_are_refused_by_name(
    tmp_path: Path, lines: list[str]
) -> None:
    """The modules are an MTP drafter's: recorded beside another method, the header
    contradicts itself, and replay says which setting."""
    header = with_header(lines, **{"settings.num_nextn_predict_layers": 3})
    run = dualbudget("replay", write(tmp_path, header))
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "num_nextn_predict_layers: is an MTP drafter's" in run.stderr


def test_a_request_with_structured_outputs_is_refused_by_name(tmp_path: Path) -> None:
    assert REQUEST_SETTINGS[:2] == ("structured_outputs", "skip_reading_prefix_cache")
    config = chat().config
    path = tmp_path / "t.ndjson"
    writer = TraceWriter(path, TraceHeader("0.32.0", "engine", config))
    writer.write(AddRequest("a", 4, 2), settings={"structured_outputs": False})
    writer.write(AddRequest("b", 4, 2), settings={"structured_outputs": True})
    writer.write(StepRecord(0, {"a": 4, "b": 4}, {}, [], [], 8, 8))
    writer.close()
    text = path.read_text()
    assert text.count('"settings"') == 2  # the header's, and b's: a's is the assumed value
    assert read_trace(path).request_settings == {"b": {"structured_outputs": True}}
    run = dualbudget("replay", str(path))
    assert run.returncode == 2
    assert "structured_outputs = true (request 'b')" in run.stderr


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"settings.watermarks": 0.0}, "header.settings.watermarks: unknown key"),
        ({"settings": {}}, "header.settings.enable_prefix_caching: missing"),
        ({"settings": None}, "header.settings: must be a JSON object, got null"),
        ({"async_scheduling": True}, "header.async_scheduling: unknown key"),
        ({"version": 6}, "version 6, this reads versions 1, 2, 3, 4 and 5 only"),
    ],
)
def test_a_bad_version_2_header_exits_2_naming_the_key(
    tmp_path: Path, lines: list[str], changes: dict[str, Any], needle: str
) -> None:
    mangled = with_header(lines, **changes)
    if changes == {"settings": None}:
        header = json.loads(mangled[0])
        header["settings"] = None
        mangled[0] = json.dumps(header)
    run = dualbudget("replay", write(tmp_path, mangled))
    assert run.returncode == 2, run.stdout + run.stderr
    assert needle in run.stderr and run.stderr.count("\n") == 1, run.stderr


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda o: o.update(step=10_000), "model_output.step: must name a step already recorded"),
        (lambda o: o.pop("step"), "model_output.step: missing"),
        (
            lambda o: o["stopped"].update({next(iter(o["num_sampled"])): 99}),
            "must be in 1..num_sampled",
        ),
    ],
)
def test_a_bad_model_output_exits_2_naming_its_line(
    tmp_path: Path, lines: list[str], change: Any, needle: str
) -> None:
    mangled = list(lines)
    i = next(
        i
        for i, line in enumerate(mangled)
        if '"model_output"' in line and '"num_sampled":{"' in line
    )
    obj = json.loads(mangled[i])
    change(obj)
    mangled[i] = json.dumps(obj)
    run = dualbudget("replay", write(tmp_path, mangled))
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"line {i + 1}" in run.stderr and needle in run.stderr, run.stderr


def v1_header(config_json: dict[str, Any], async_scheduling: bool, prefix: bool) -> str:
    return json.dumps(
        {
            "format": "dualbudget-trace",
            "version": 1,
            "vllm_version": "0.32.0",
            "source": "engine",
            "async_scheduling": async_scheduling,
            "enable_prefix_caching": prefix,
            "config": config_json,
        }
    )


def test_version_1_is_read_with_every_other_setting_assumed(tmp_path: Path) -> None:
    shipped_v1 = [p for p in sorted(SHIPPED.iterdir()) if read_trace(p).header.version == 1]
    assert len(shipped_v1) >= 4  # the traces recorded before version 2 still replay
    for path in shipped_v1:
        header = read_trace(path).header
        assert not header.async_scheduling and not header.enable_prefix_caching
        assert replay_trace(read_trace(path)).ok
    trace = read_trace(shipped_v1[0])
    assert trace.header.settings == TraceHeader("0.32.0", "engine", trace.header.config).settings


@pytest.mark.parametrize(
    ("async_scheduling", "prefix", "needle"),
    [
        (True, False, "a version-1 trace recorded under async scheduling"),
        (False, True, "recorded with enable_prefix_caching = true"),
    ],
)
def test_version_1_async_or_prefix_caching_is_refused(
    tmp_path: Path, lines: list[str], async_scheduling: bool, prefix: bool, needle: str
) -> None:
    config = json.loads(lines[0])["config"]
    # A version-1 model output holds only its num_sampled.
    objects = [json.loads(line) for line in lines[1:]]
    body = [
        json.dumps({k: v for k, v in o.items() if k not in ("step", "stopped")})
        if o["event"] == "model_output"
        else json.dumps(o)
        for o in objects
    ]
    run = dualbudget(
        "replay", write(tmp_path, [v1_header(config, async_scheduling, prefix), *body])
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert needle in run.stderr and run.stderr.count("\n") == 1, run.stderr


def test_the_writer_names_the_step_an_output_answers(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"
    writer = TraceWriter(path, TraceHeader("0.32.0", "engine", chat().config))
    with pytest.raises(ValueError, match="a model output before any step"):
        writer.write(ModelOutput({}))
    writer.write(AddRequest("a", 4, 3))
    writer.write(StepRecord(0, {"a": 4}, {}, [], [], 4, 4))
    writer.write(ModelOutput({"a": 1}))
    writer.write(StepRecord(1, {"a": 1}, {}, [], [], 1, 1))
    writer.write(ModelOutput({"a": 1}, {"a": 1}))
    writer.close()
    outputs = [e for e in read_trace(path).entries if isinstance(e, ModelOutput)]
    assert outputs == [ModelOutput({"a": 1}, {}, 0), ModelOutput({"a": 1}, {"a": 1}, 1)]


def test_replay_json_on_a_shipped_engine_trace_with_natural_stops(tmp_path: Path) -> None:
    trace = read_trace(STOPS_TRACE)
    assert trace.header.version == 2 and trace.header.source == "engine"
    out = tmp_path / "replay.json"
    run = dualbudget("replay", str(STOPS_TRACE), "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    (entry,) = json.loads(out.read_text())["traces"]
    assert entry == {
        "path": str(STOPS_TRACE),
        "vllm_version": "0.32.0",
        "profile": "vllm-0.32",
        "async_scheduling": False,
        "steps_checked": trace.steps,
        "natural_stops": trace.natural_stops,
        "prefix_hits": 0,
        "free_blocks_checked": 0,  # version 2 records no pool
        "divergence": None,
        "free_blocks_divergence": None,
        "violations": [],
    }
    assert entry["natural_stops"] >= 10 and entry["steps_checked"] > 100
    # Some stop fell inside accepted drafts: vLLM kept fewer tokens than it sampled.
    outputs = [e for e in trace.entries if isinstance(e, ModelOutput)]
    assert any(n < o.num_sampled[rid] for o in outputs for rid, n in o.stopped.items())
    assert any(e.preempted for e in trace.entries if isinstance(e, StepRecord))


def test_replay_json_reports_the_divergence(tmp_path: Path, lines: list[str]) -> None:
    mangled = list(lines)
    i = next(i for i, line in enumerate(mangled) if '"event":"step","step":40,' in line)
    obj = json.loads(mangled[i])
    rid = sorted(obj["num_scheduled_tokens"])[0]
    obj["num_scheduled_tokens"][rid] += 1
    mangled[i] = json.dumps(obj)
    out = tmp_path / "replay.json"
    run = dualbudget("replay", write(tmp_path, mangled), "--json", str(out))
    assert run.returncode == 1
    (entry,) = json.loads(out.read_text())["traces"]
    divergence = entry["divergence"]
    assert divergence["step"] == 40
    assert divergence["recorded"]["num_scheduled_tokens"][rid] == obj["num_scheduled_tokens"][rid]
    assert (
        divergence["reference"]["num_scheduled_tokens"][rid] == obj["num_scheduled_tokens"][rid] - 1
    )
    assert entry["steps_checked"] == 40


def test_an_unreadable_trace_is_refused_before_json(tmp_path: Path, lines: list[str]) -> None:
    out = tmp_path / "replay.json"
    run = dualbudget("replay", write(tmp_path, lines[:-1]), "--json", str(out))
    assert run.returncode == 2 and "truncated" in run.stderr
    assert not out.exists()


ASYNC_TRACES = sorted(SHIPPED.glob("scheduler-async-*.ndjson.gz"))


def test_shipped_async_traces_with_natural_stops_replay_in_every_vllm(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    run = dualbudget("replay", *map(str, ASYNC_TRACES), "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    entries = json.loads(out.read_text())["traces"]
    assert {e["vllm_version"] for e in entries} == {f"{v}.0" for v in RELEASE_VERSIONS}
    for entry, path in zip(entries, ASYNC_TRACES, strict=True):
        trace = read_trace(path)
        assert entry["async_scheduling"] is True and entry["divergence"] is None
        assert entry["natural_stops"] == trace.natural_stops > 0
        assert entry["steps_checked"] == trace.steps == 300
        assert trace.header.scheduler_class.endswith(".AsyncScheduler")
        # Outputs in flight: step n's output comes after step n+1 is scheduled, and some
        # arrive for a request preempted after their step was scheduled (stale).
        preempted_at: dict[str, list[int]] = {}
        last_step, late, stale = -1, 0, 0
        for e in trace.entries:
            if isinstance(e, StepRecord):
                last_step = e.step
                for rid in e.preempted:
                    preempted_at.setdefault(rid, []).append(e.step)
            elif isinstance(e, ModelOutput):
                assert e.step is not None
                late += e.step < last_step
                stale += sum(
                    any(s > e.step for s in preempted_at.get(rid, [])) for rid in e.num_sampled
                )
        assert late == trace.steps - 1 and stale > 0
