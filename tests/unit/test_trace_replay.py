"""Trace validation: a replay passes only when every recorded decision is the reference's,
fails naming the step when one differs, and refuses unreadable traces with exit code 2."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dualbudget import TRACES
from dualbudget.reference.events import ResetPrefixCache, ScheduleStep, SetPauseState, StepRecord
from dualbudget.reference.formats.trace import (
    VERSION,
    TraceError,
    TraceHeader,
    TraceWriter,
    read_trace,
)
from dualbudget.reference.runs.replay import replay_trace
from dualbudget.reference.runs.synthetic_trace import write_synthetic_trace
from dualbudget.reference.runs.workload import preset
from tests.engine_call_cases import CASES as ENGINE_CALL_CASES
from tests.worked_cases import Case

SHIPPED = TRACES


def dualbudget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dualbudget", *args], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def trace_lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    scenario = preset("chat-poisson").scenario(seed=7)
    path = tmp_path_factory.mktemp("trace") / "t.ndjson"
    write_synthetic_trace(scenario, path, "0.32.0", max_steps=120)
    return path.read_text().splitlines()


def write(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "trace.ndjson"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_faithful_trace_replays(tmp_path: Path, trace_lines: list[str]) -> None:
    run = dualbudget("replay", write(tmp_path, trace_lines))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "120 steps replayed" in run.stdout


@pytest.mark.parametrize("field", ["num_scheduled_tokens", "preempted", "finished", "spec"])
def test_changing_one_decision_fails_and_names_the_step(
    tmp_path: Path, trace_lines: list[str], field: str
) -> None:
    lines = list(trace_lines)
    for i, line in enumerate(lines):
        obj = json.loads(line)
        if obj.get("event") != "step" or obj["step"] < 40 or not obj["num_scheduled_tokens"]:
            continue
        rid = next(iter(obj["num_scheduled_tokens"]))
        if field == "num_scheduled_tokens":
            obj["num_scheduled_tokens"][rid] += 1
        elif field == "spec":
            obj["scheduled_spec_tokens"][rid] = obj["scheduled_spec_tokens"].get(rid, 0) + 1
        else:
            obj[field] = [*obj[field], "phantom"]
        lines[i] = json.dumps(obj)
        step = obj["step"]
        break
    run = dualbudget("replay", write(tmp_path, lines))
    assert run.returncode == 1
    assert f"DIVERGES at step {step}" in run.stdout


def test_another_profile_diverges(tmp_path: Path) -> None:
    # The same P-EAGLE workload: 0.32 and global-reserve budget it differently.
    path = tmp_path / "t.ndjson"
    write_synthetic_trace(preset("chat-poisson").scenario(seed=1), path, "0.32.0", 60)
    result = replay_trace(read_trace(path), None)
    assert result.ok and result.steps_checked == 60
    run = dualbudget("replay", "--profile", "global-reserve", str(path))
    assert run.returncode == 1 and "DIVERGES" in run.stdout


@pytest.mark.parametrize(
    ("mangle", "needle"),
    [
        (lambda lines: lines[:-1], "truncated: no end line"),
        (lambda lines: [*lines[:5], "{not json", *lines[5:]], "corrupt JSON"),
        (
            lambda lines: [lines[0].replace(f'"version":{VERSION}', '"version":7'), *lines[1:]],
            "version 7, this reads versions 1, 2, 3, 4 and 5 only",
        ),
        (
            lambda lines: [lines[0].replace("dualbudget-trace", "other"), *lines[1:]],
            "not a dualbudget-trace file",
        ),
        (
            lambda lines: [
                lines[0].replace('"enable_prefix_caching":false', '"enable_prefix_caching":true'),
                *lines[1:],
            ],
            "carries no block_hashes, which every request of a trace recorded with"
            " enable_prefix_caching needs",
        ),
        (
            lambda lines: [lines[0].replace('"0.32.0"', '"0.99.0"'), *lines[1:]],
            "no profile for vLLM '0.99.0'",
        ),
        (lambda lines: [], "empty"),
    ],
)
def test_unreadable_traces_exit_2_with_one_line(
    tmp_path: Path, trace_lines: list[str], mangle: object, needle: str
) -> None:
    run = dualbudget("replay", write(tmp_path, mangle(list(trace_lines))))  # type: ignore[operator]
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1 and needle in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_a_trace_without_steps_is_not_a_pass(tmp_path: Path, trace_lines: list[str]) -> None:
    run = dualbudget("replay", write(tmp_path, [trace_lines[0], '{"event":"end","steps":0}']))
    assert run.returncode == 1 and "checks nothing" in run.stdout


def test_read_trace_counts_steps(tmp_path: Path, trace_lines: list[str]) -> None:
    lines = list(trace_lines)
    lines[-1] = '{"event":"end","steps":3}'
    with pytest.raises(TraceError, match="end says 3 steps"):
        read_trace(write(tmp_path, lines))


SHIPPED_TRACES = sorted(SHIPPED.glob("*.ndjson")) + sorted(SHIPPED.glob("*.ndjson.gz"))


def test_traces_are_shipped_and_every_file_is_replayed() -> None:
    assert SHIPPED_TRACES, f"no trace under {SHIPPED}"
    # A file the glob above misses would ship unreplayed.
    assert sorted(SHIPPED.iterdir()) == sorted(SHIPPED_TRACES)
    headers = [read_trace(path).header for path in SHIPPED_TRACES]
    assert {"engine", "scheduler"} <= {header.source for header in headers}
    # Both format versions are shipped: version 1 must keep replaying.
    assert {1, 2} <= {header.version for header in headers}


@pytest.mark.parametrize("path", SHIPPED_TRACES, ids=lambda p: p.name)
def test_every_shipped_trace_replays(path: Path) -> None:
    result = replay_trace(read_trace(path))
    assert result.divergence is None, result.divergence
    assert not result.violations, result.violations
    assert result.steps_checked == read_trace(path).steps > 0


def _lines(path: Path) -> list[str]:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt") as stream:
            return stream.read().splitlines()
    return path.read_text().splitlines()


@pytest.mark.parametrize("path", SHIPPED_TRACES, ids=lambda p: p.name)
def test_changing_one_decision_of_a_shipped_trace_names_its_step(
    path: Path, tmp_path: Path
) -> None:
    lines = _lines(path)
    steps = [i for i, line in enumerate(lines) if '"event":"step"' in line]
    for i in steps[len(steps) // 2 :]:
        obj = json.loads(lines[i])
        if obj["num_scheduled_tokens"]:
            rid = sorted(obj["num_scheduled_tokens"])[0]
            obj["num_scheduled_tokens"][rid] -= 1
            if obj["num_scheduled_tokens"][rid] == 0:
                del obj["num_scheduled_tokens"][rid]
            lines[i] = json.dumps(obj)
            break
    run = dualbudget("replay", write(tmp_path, lines))
    assert run.returncode == 1
    assert f"DIVERGES at step {obj['step']}" in run.stdout


def test_the_file_is_a_complete_trace_after_every_entry(tmp_path: Path) -> None:
    from dualbudget.reference.events import AddRequest, ModelOutput, StepRecord
    from dualbudget.reference.formats.trace import TraceHeader, TraceWriter

    scenario = preset("chat-poisson").scenario(seed=1)
    path = tmp_path / "live.ndjson"
    writer = TraceWriter(path, TraceHeader("0.32.0", "engine", scenario.config))
    assert read_trace(path).steps == 0
    writer.write(AddRequest("a", 4, 2))
    record = StepRecord(0, {"a": 4}, {}, [], [], 4, 4)
    writer.write(record)
    writer.write(ModelOutput({"a": 1}))
    trace = read_trace(path)  # readable while the recorder is still open
    assert trace.steps == 1 and trace.entries[-1] == ModelOutput({"a": 1}, {}, 0)
    writer.close()
    assert read_trace(path).entries == trace.entries
    # A write cut short leaves no end line: truncated, not silently shorter.
    path.write_text(path.read_text().rsplit("\n", 2)[0][:-5] + "\n")
    with pytest.raises(TraceError, match="corrupt JSON"):
        read_trace(path)


def test_a_trace_becomes_a_what_if_workload(tmp_path: Path) -> None:
    from dualbudget.reference.events import (
        AddRequest,
        DraftProposals,
        ModelOutput,
        StepRecord,
    )
    from dualbudget.reference.formats.trace import TraceHeader, TraceWriter
    from dualbudget.reference.runs.simulate import scenario_from_trace

    config = preset("chat-poisson").scenario(seed=1).config
    path = tmp_path / "t.ndjson"
    writer = TraceWriter(path, TraceHeader("0.32.0", "engine", config))
    writer.write(AddRequest("a", 4, 9, priority=2))
    writer.write(StepRecord(0, {"a": 4}, {}, [], [], 4, 4))
    writer.write(ModelOutput({"a": 1}))
    writer.write(DraftProposals({"a": 2}))
    writer.write(AddRequest("b", 6, 3))  # arrives before step 1
    # Two drafts verified, one accepted: position 0 reached and accepted, 1 reached only.
    writer.write(StepRecord(1, {"a": 3, "b": 6}, {"a": 2}, [], [], 9, 12))
    writer.write(ModelOutput({"a": 2, "b": 1}))
    writer.write(DraftProposals({"a": 0, "b": 4}))
    # The drafter proposed nothing for "a": a rejection at position 0.
    writer.write(StepRecord(2, {"a": 1}, {}, [], [], 1, 4))
    writer.write(ModelOutput({"a": 1}))
    writer.close()

    scenario = scenario_from_trace(read_trace(path), "dual", seed=4)
    assert [(r.id, r.prompt_len, r.max_tokens, r.arrival_step, r.priority)
            for r in scenario.requests] == [("a", 4, 9, 0, 2), ("b", 6, 3, 1, 0)]  # fmt: skip
    # Position 0: reached twice, accepted once; position 1: reached once, never accepted.
    assert scenario.acceptance.per_position == (0.5, 0.0)
    assert scenario.acceptance.seed == 4
    run = dualbudget("simulate", "--trace", str(path), "--quiet", "--profile", "dual")
    assert run.returncode == 0, run.stderr
    assert "2 requests" in run.stdout


# -- the KV pool's free blocks (version 4) ---------------------------------------------------
POOL_TRACE = SHIPPED / "scheduler-async-0.33-gpt-oss-eagle3.ndjson.gz"
"""A shipped version-4 trace of vLLM's hybrid coordinator (a sliding window beside full
attention): the window frees blocks at nearly every step."""


def _as_version_3(lines: list[str]) -> list[str]:
    """The same trace without its pools: what version 3 held."""
    out = [lines[0].replace('"version":4', '"version":3')]
    for line in lines[1:]:
        obj = json.loads(line)
        obj.pop("num_free_blocks", None)
        out.append(json.dumps(obj))
    return out


def _one_block_more_at_step_100() -> tuple[list[str], int]:
    """``POOL_TRACE`` with vLLM's pool after step 100 one block fuller; the count written."""
    lines = _lines(POOL_TRACE)
    index, obj = next(
        (i, obj)
        for i, line in enumerate(lines)
        if (obj := json.loads(line)).get("event") == "step" and obj["step"] == 100
    )
    obj["num_free_blocks"] += 1
    lines[index] = json.dumps(obj)
    return lines, obj["num_free_blocks"]


def test_a_pool_that_differs_where_the_decisions_agree_fails_naming_the_step(
    tmp_path: Path,
) -> None:
    lines, recorded = _one_block_more_at_step_100()
    out = tmp_path / "replay.json"
    run = dualbudget("replay", write(tmp_path, lines), "--json", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "DIVERGES at step 100" in run.stdout and "free blocks" in run.stdout, run.stdout
    (entry,) = json.loads(out.read_text())["traces"]
    assert entry["divergence"] is None
    assert entry["free_blocks_divergence"] == {
        "step": 100,
        "recorded": recorded,
        "reference": recorded - 1,
    }
    assert entry["steps_checked"] == 101 and entry["free_blocks_checked"] == 100


def test_the_design_review_names_a_pool_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dualbudget import report

    lines, recorded = _one_block_more_at_step_100()
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "pool.ndjson").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(report, "TRACES", folder)
    text = "\n".join(report.traces_section())
    assert f"DIVERGES at step 100: vLLM's pool {recorded} free blocks" in text, text


def test_a_version_3_trace_has_no_pool_to_check(tmp_path: Path) -> None:
    run = dualbudget("replay", write(tmp_path, _as_version_3(_lines(POOL_TRACE))))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all decisions agree (profile" in run.stdout  # no pool checked, none claimed
    assert replay_trace(read_trace(POOL_TRACE)).free_blocks_checked == 300


def test_a_window_that_frees_a_block_late_is_found_by_the_pool_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted difference in the reference's sliding-window release: the pools tell it at
    the first step the reference holds a block vLLM's window freed, where the same trace
    without its pools (version 3) tells it only once the short pool moves a decision."""
    from dualbudget.reference.kv.sliding_window import SlidingWindowManager

    released = SlidingWindowManager.num_skipped_tokens

    def one_block_late(self: SlidingWindowManager, num_computed_tokens: int) -> int:
        return max(released(self, num_computed_tokens) - self.block_size, 0)

    monkeypatch.setattr(SlidingWindowManager, "num_skipped_tokens", one_block_late)
    with_pools = replay_trace(read_trace(POOL_TRACE))
    assert with_pools.divergence is None and with_pools.free_blocks_divergence is not None
    found_at, recorded, reference = with_pools.free_blocks_divergence
    assert reference < recorded  # the reference holds a block vLLM's window freed
    without_pools = replay_trace(read_trace(write(tmp_path, _as_version_3(_lines(POOL_TRACE)))))
    assert without_pools.free_blocks_checked == 0
    assert without_pools.divergence is not None
    assert found_at < without_pools.divergence[0]


def test_only_a_step_carries_free_blocks(tmp_path: Path) -> None:
    from dualbudget.reference.events import AddRequest, StepRecord
    from dualbudget.reference.formats.trace import TraceHeader, TraceWriter

    config = preset("chat-poisson").scenario(seed=1).config
    writer = TraceWriter(tmp_path / "t.ndjson", TraceHeader("0.33.0", "scheduler", config))
    with pytest.raises(TypeError, match="only a step carries num_free_blocks"):
        writer.write(AddRequest("a", 4, 2), num_free_blocks=3)
    writer.write(AddRequest("a", 4, 2))
    writer.write(StepRecord(0, {"a": 4}, {}, [], [], 4, 4), num_free_blocks=7)
    writer.close()
    assert read_trace(tmp_path / "t.ndjson").free_blocks == {0: 7}


@pytest.mark.parametrize(
    ("version", "count", "needle"),
    [
        (4, -1, "num_free_blocks: must be >= 0"),
        (3, 5, "num_free_blocks: unknown key in a version-3 trace"),
    ],
)
def test_a_bad_free_block_count_exits_2_naming_it(
    tmp_path: Path, trace_lines: list[str], version: int, count: int, needle: str
) -> None:
    written = f'"version":{VERSION}'
    assert written in trace_lines[0]
    lines = [trace_lines[0].replace(written, f'"version":{version}')]
    for line in trace_lines[1:]:
        obj = json.loads(line)
        if obj["event"] == "step":
            obj["num_free_blocks"] = count
        lines.append(json.dumps(obj))
    run = dualbudget("replay", write(tmp_path, lines))
    assert run.returncode == 2, run.stdout + run.stderr
    assert needle in run.stderr, run.stderr


# -- the engine's calls on the scheduler (version 5) ------------------------------------------
def _write_case(path: Path, case: Case, vllm_version: str) -> None:
    """A hand-worked stream of tests/engine_call_cases.py as a trace: its events as they
    came, and at each ScheduleStep the decision worked out by hand, so that the replay
    checks the reference against the hand, not against itself."""
    writer = TraceWriter(path, TraceHeader(vllm_version, "synthetic", case.config))
    decisions = iter(case.expected)
    step = 0
    for event in case.events:
        if not isinstance(event, ScheduleStep):
            writer.write(event)
            continue
        decision = next(decisions)
        scheduled = decision["num_scheduled_tokens"]
        total = sum(scheduled.values())
        preempted, finished = decision["preempted"], decision["finished"]
        writer.write(StepRecord(step, scheduled, {}, preempted, finished, total, total))
        step += 1
    writer.close()


@pytest.mark.parametrize("vllm_version", ["0.32.0", "0.33.0", "0.34.0"])
@pytest.mark.parametrize("case", ENGINE_CALL_CASES, ids=lambda c: c.name)
def test_a_trace_with_the_engines_calls_replays(
    case: Case, vllm_version: str, tmp_path: Path
) -> None:
    path = tmp_path / "calls.ndjson"
    _write_case(path, case, vllm_version)
    trace = read_trace(path)
    assert trace.header.version == VERSION
    calls = [e for e in case.events if isinstance(e, ResetPrefixCache | SetPauseState)]
    assert calls and [e for e in trace.entries if e in calls] == calls
    result = replay_trace(trace)
    assert result.ok, (result.divergence, result.violations)
    assert result.steps_checked == len(case.expected)


@pytest.mark.parametrize(
    ("name", "dropped", "step"),
    [
        ("reset-preempts-running-in-order", "reset_prefix_cache", 2),
        ("reset-drops-the-output-in-flight", "reset_prefix_cache", 2),
        ("pause-new-then-all-then-resume", "set_pause_state", 1),
    ],
)
def test_a_trace_missing_an_engine_call_diverges_after_it(
    tmp_path: Path, name: str, dropped: str, step: int
) -> None:
    """Each call moves a decision: without its line the replay fails at the next step."""
    case = next(c for c in ENGINE_CALL_CASES if c.name == name)
    path = tmp_path / "calls.ndjson"
    _write_case(path, case, "0.34.0")
    lines = path.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if f'"event":"{dropped}"' in line)
    run = dualbudget("replay", write(tmp_path, lines[:first] + lines[first + 1 :]))
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"DIVERGES at step {step}" in run.stdout, run.stdout


def test_a_trace_with_the_engines_calls_passes_them_to_a_what_if(tmp_path: Path) -> None:
    """``simulate --trace`` keeps each call before the step it came before: the what-if of
    the hand-worked streams, under the profile that recorded them, makes their decisions."""
    from dualbudget.reference.runs.driver import ScenarioRun
    from dualbudget.reference.runs.simulate import scenario_from_trace

    tables = {
        "reset-preempts-running-in-order": ({2: True}, None),
        "pause-new-then-all-then-resume": (None, {1: "paused_new", 2: "paused_all", 3: "unpaused"}),
    }
    for name, (resets, pauses) in tables.items():
        case = next(c for c in ENGINE_CALL_CASES if c.name == name)
        path = tmp_path / f"{name}.ndjson"
        _write_case(path, case, "0.34.0")
        scenario = scenario_from_trace(read_trace(path), "vllm-0.34")
        assert (scenario.resets, scenario.pauses) == (resets, pauses)
        decisions = [record.decision() for record in ScenarioRun(scenario).records()]
        assert decisions == list(case.expected), name
