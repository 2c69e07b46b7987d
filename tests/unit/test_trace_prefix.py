"""Trace format version 3: prefix caching replayed from vLLM's own block hashes. The
shipped prefix-cached engine trace replays with every decision agreeing and hits above
zero; the older traces replay as before; hashes inconsistent with the trace's block size
or chain are refused by name (exit 2); the recorder writes what vLLM's requests hold."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dualbudget import TRACES
from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep, StepRecord
from dualbudget.reference.formats.settings import SETTINGS
from dualbudget.reference.formats.trace import READS, VERSION, TraceHeader, TraceWriter, read_trace
from dualbudget.reference.runs.replay import profile_for_vllm_version, replay_trace
from dualbudget.reference.runs.simulate import prompt_ids_from_hashes, scenario_from_trace
from dualbudget.reference.runs.workload import preset
from dualbudget.reference.scheduler import PREFIX_OBSERVED
from tests.paths import REPO

SHIPPED = TRACES
PREFIX_TRACE = SHIPPED / "engine-draft-model-k3-prefix.ndjson"


def dualbudget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dualbudget", *args], capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return PREFIX_TRACE.read_text().splitlines()


def write(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "t.ndjson"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def refused(tmp_path: Path, lines: list[str]) -> str:
    """Replay ``lines``: exit 2 with one line on stderr, which is returned."""
    run = dualbudget("replay", write(tmp_path, lines))
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    return run.stderr


def index(lines: list[str], match: Any) -> int:
    return next(i for i, line in enumerate(lines) if match(json.loads(line)))


def held(lines: list[str]) -> dict[str, list[str]]:
    """Every request's block hashes at the end of the trace."""
    hashes: dict[str, list[str]] = {}
    for line in lines:
        obj = json.loads(line)
        if obj.get("event") == "add_request":
            hashes[obj["request_id"]] = list(obj["block_hashes"])
        elif obj.get("event") == "model_output":
            for rid, gained in obj.get("block_hashes", {}).items():
                hashes[rid] += gained
    return hashes


def test_the_shipped_prefix_trace_is_a_default_engine_run_that_shares_prefixes(
    lines: list[str],
) -> None:
    trace = read_trace(PREFIX_TRACE)
    header = trace.header
    assert header.version == 3 < VERSION and header.source == "engine"
    assert header.vllm_version == "0.32.0"
    assert header.enable_prefix_caching and header.config.enable_prefix_caching
    assert json.loads(lines[0])["settings"]["enable_prefix_caching"] is True
    assert "enable_prefix_caching" not in json.loads(lines[0])["config"]
    assert trace.natural_stops > 0
    assert any(e.preempted for e in trace.entries if isinstance(e, StepRecord))
    # A system prompt: three blocks of 32 every first-round request holds first.
    firsts = Counter(tuple(h[:3]) for h in held(lines).values())
    assert firsts.most_common(1)[0][1] >= 20
    # Follow-up turns: a request whose hashes extend another's past the system prompt.
    chains = list(held(lines).values())
    assert any(
        len(a) > len(b) > 3 and a[: len(b)] == b for a in chains for b in chains if a is not b
    )
    # The recorder wrote what each sampling request gained, [] included.
    outputs = [e for e in trace.entries if isinstance(e, ModelOutput)]
    assert all(set(o.block_hashes) == {r for r, n in o.num_sampled.items() if n} for o in outputs)


def test_the_shipped_prefix_trace_replays_with_hits(tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    run = dualbudget("replay", str(PREFIX_TRACE), "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    (entry,) = json.loads(out.read_text())["traces"]
    trace = read_trace(PREFIX_TRACE)
    assert entry["divergence"] is None and entry["violations"] == []
    assert entry["steps_checked"] == trace.steps > 100
    assert entry["prefix_hits"] > 0
    assert entry["natural_stops"] == trace.natural_stops > 0


def test_the_shipped_prefix_trace_holds_every_prefix_caching_event() -> None:
    trace = read_trace(PREFIX_TRACE)
    profile = profile_for_vllm_version(trace.header.vllm_version)
    scheduler = make_scheduler(trace.header.config, profile, check="collect")
    for entry in trace.entries:
        scheduler.handle(ScheduleStep() if isinstance(entry, StepRecord) else entry)
    assert {name: scheduler.observed[name] > 0 for name in PREFIX_OBSERVED} == dict.fromkeys(
        PREFIX_OBSERVED, True
    ), scheduler.observed


def test_every_shipped_trace_replays_and_only_the_prefix_cached_ones_hit(tmp_path: Path) -> None:
    paths = sorted(SHIPPED.iterdir())
    out = tmp_path / "replay.json"
    run = dualbudget("replay", *map(str, paths), "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    entries = json.loads(out.read_text())["traces"]
    versions = {read_trace(p).header.version for p in paths}
    assert versions == set(READS)  # versions 1 to 3 still read and replayed
    for path, entry in zip(paths, entries, strict=True):
        assert entry["divergence"] is None and entry["steps_checked"] > 0
        assert (entry["prefix_hits"] > 0) == read_trace(path).header.enable_prefix_caching
        # From version 4 every step's pool is checked too, and every one matched.
        pools_recorded = read_trace(path).header.version >= 4
        assert entry["free_blocks_divergence"] is None
        assert entry["free_blocks_checked"] == (entry["steps_checked"] if pools_recorded else 0)


def test_the_shipped_0_33_trace_replays_lookahead_hashes_with_hits(tmp_path: Path) -> None:
    path = SHIPPED / "scheduler-async-0.33-chat-system-prompt.ndjson.gz"
    trace = read_trace(path)
    header = trace.header
    assert header.vllm_version == "0.33.0" and header.async_scheduling
    assert header.enable_prefix_caching and header.source == "scheduler"
    spec = header.config.speculative_config
    assert spec is not None and spec.method == "eagle3"  # 0.33 hashes one token ahead
    block = header.config.block_size
    tokens = {e.request_id: e.prompt_len for e in trace.entries if isinstance(e, AddRequest)}
    hashes = {
        e.request_id: len(e.block_hashes or ()) for e in trace.entries if isinstance(e, AddRequest)
    }
    # vLLM made no hash of a prompt's last full block until a token followed it.
    assert all(hashes[r] == (n - 1) // block for r, n in tokens.items())
    assert any(n % block == 0 for n in tokens.values())
    result = replay_trace(trace)
    assert result.ok, (result.divergence, result.violations)
    assert result.steps_checked == trace.steps == 300 and result.prefix_hits > 0


def test_hashes_decide_the_hits(tmp_path: Path, lines: list[str]) -> None:
    # Give one request that hit its own fresh chain: vLLM's hit is then not the
    # reference's, and the replay says where.
    chains = held(lines)
    first = json.loads(lines[index(lines, lambda o: o.get("event") == "add_request")])
    victim = next(
        rid
        for rid, hashes in chains.items()
        if rid != first["request_id"] and hashes[:3] == chains[first["request_id"]][:3]
    )
    fresh = {h: hashlib.sha256(f"other:{h}".encode()).hexdigest() for h in chains[victim]}
    mangled = []
    for line in lines:
        obj = json.loads(line)
        if obj.get("event") == "add_request" and obj["request_id"] == victim:
            obj["block_hashes"] = [fresh[h] for h in obj["block_hashes"]]
        elif obj.get("event") == "model_output" and victim in obj.get("block_hashes", {}):
            obj["block_hashes"][victim] = [fresh[h] for h in obj["block_hashes"][victim]]
        mangled.append(json.dumps(obj))
    run = dualbudget("replay", write(tmp_path, mangled))
    assert run.returncode == 1 and "DIVERGES at step" in run.stdout, run.stdout + run.stderr


def mangle_add(lines: list[str], nth: int, change: Any) -> list[str]:
    """``lines`` with the ``nth`` add_request changed by ``change(obj)``."""
    adds = [i for i, line in enumerate(lines) if '"event":"add_request"' in line]
    obj = json.loads(lines[adds[nth]])
    change(obj)
    return [*lines[: adds[nth]], json.dumps(obj), *lines[adds[nth] + 1 :]]


def test_more_hashes_than_full_blocks_is_refused(tmp_path: Path, lines: list[str]) -> None:
    def extra(obj: dict[str, Any]) -> None:
        obj["block_hashes"].append("ab" * 32)

    first = json.loads(lines[1])
    stderr = refused(tmp_path, mangle_add(lines, 0, extra))
    full = first["prompt_len"] // 32
    assert f"request {first['request_id']!r} holds {full + 1} block hashes" in stderr
    assert f"more than the {full} full blocks of the hash block size 32" in stderr
    assert "line 2" in stderr


def test_a_model_output_gaining_too_many_hashes_is_refused(
    tmp_path: Path, lines: list[str]
) -> None:
    i = index(lines, lambda o: o.get("event") == "model_output" and "block_hashes" in o)
    obj = json.loads(lines[i])
    rid = next(iter(obj["block_hashes"]))
    obj["block_hashes"][rid] = [*obj["block_hashes"].get(rid, []), *("cd" * 32 for _ in range(9))]
    stderr = refused(tmp_path, [*lines[:i], json.dumps(obj), *lines[i + 1 :]])
    assert f"line {i + 1}: request {rid!r} holds" in stderr and "full blocks" in stderr


def test_one_hash_at_two_positions_is_refused(tmp_path: Path, lines: list[str]) -> None:
    def shifted(obj: dict[str, Any]) -> None:
        obj["block_hashes"] = [obj["block_hashes"][1], *obj["block_hashes"][1:]]

    stderr = refused(tmp_path, mangle_add(lines, 1, shifted))
    assert "at block 0, and at block 1" in stderr and "two positions" in stderr


def test_a_shared_hash_after_other_hashes_is_refused(tmp_path: Path, lines: list[str]) -> None:
    def other_parent(obj: dict[str, Any]) -> None:
        obj["block_hashes"][0] = "ef" * 32

    stderr = refused(tmp_path, mangle_add(lines, 1, other_parent))
    assert f"follows {'ef' * 32}" in stderr and "preceding hashes differ" in stderr


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda o: o.update(block_hashes=["XYZ"]), "add_request.block_hashes[0]: must match"),
        (lambda o: o.update(block_hashes="ab"), "add_request.block_hashes: must be a list"),
        (lambda o: o.pop("block_hashes"), "carries no block_hashes"),
    ],
)
def test_malformed_or_missing_hashes_are_refused(
    tmp_path: Path, lines: list[str], change: Any, needle: str
) -> None:
    assert needle in refused(tmp_path, mangle_add(lines, 0, change))


def test_hashes_for_a_request_never_added_are_refused(tmp_path: Path, lines: list[str]) -> None:
    i = index(lines, lambda o: o.get("event") == "model_output" and "block_hashes" in o)
    obj = json.loads(lines[i])
    obj["block_hashes"]["ghost"] = []
    stderr = refused(tmp_path, [*lines[:i], json.dumps(obj), *lines[i + 1 :]])
    assert "block_hashes for 'ghost', a request the trace never added" in stderr


def as_version_2(lines: list[str]) -> list[str]:
    header = json.loads(lines[0])
    header["version"] = 2
    for setting in SETTINGS:
        if setting.recorded_since > 2:
            header["settings"].pop(setting.name, None)
    return [json.dumps(header), *lines[1:]]


def test_an_older_trace_carries_no_hashes(tmp_path: Path, lines: list[str]) -> None:
    stderr = refused(tmp_path, as_version_2(lines))
    assert "add_request.block_hashes: unknown key in a version-2 trace" in stderr
    # A version-2 trace recorded with prefix caching: read, but not replayed.
    bare = as_version_2(lines[:1]) + [
        json.dumps({k: v for k, v in json.loads(line).items() if k != "block_hashes"})
        for line in lines[1:]
    ]
    assert read_trace(write(tmp_path, bare)).header.enable_prefix_caching
    stderr = refused(tmp_path, bare)
    assert "recorded with enable_prefix_caching = true in version 2" in stderr


def test_version_2_reads_the_settings_added_since_at_their_assumed_value(
    tmp_path: Path,
) -> None:
    v2 = next(p for p in sorted(SHIPPED.iterdir()) if read_trace(p).header.version == 2)
    settings = read_trace(v2).header.settings
    assert settings["disable_eagle_block_drop"] is False
    assert settings["disable_lookahead_block_hashes"] is False


@pytest.mark.parametrize("name", ["disable_eagle_block_drop", "disable_lookahead_block_hashes"])
def test_a_switched_off_hit_rule_is_refused_by_name(
    tmp_path: Path, lines: list[str], name: str
) -> None:
    header = json.loads(lines[0])
    header["settings"][name] = True
    stderr = refused(tmp_path, [json.dumps(header), *lines[1:]])
    assert f"recorded with {name} = true" in stderr and "does not model" in stderr


def test_skipping_the_prefix_cache_is_refused_only_with_prefix_caching_on(
    tmp_path: Path, lines: list[str]
) -> None:
    def skips(obj: dict[str, Any]) -> None:
        obj["settings"] = {"skip_reading_prefix_cache": True}

    stderr = refused(tmp_path, mangle_add(lines, 0, skips))
    assert "skip_reading_prefix_cache = true (request" in stderr
    # Without prefix caching there is no hit to skip: the setting changes nothing.
    config = dataclasses.replace(preset("chat-poisson").scenario(seed=1).config)
    path = tmp_path / "off.ndjson"
    writer = TraceWriter(path, TraceHeader("0.32.0", "synthetic", config))
    writer.write(AddRequest("a", 4, 1), settings={"skip_reading_prefix_cache": True})
    writer.write(StepRecord(0, {"a": 4}, {}, [], [], 4, 4))
    writer.close()
    assert read_trace(path).request_settings == {"a": {"skip_reading_prefix_cache": True}}
    assert replay_trace(read_trace(path)).ok


def test_the_writer_keeps_hashes_and_needs_them_under_prefix_caching(tmp_path: Path) -> None:
    config = dataclasses.replace(
        preset("chat-poisson").scenario(seed=1).config, enable_prefix_caching=True
    )
    header = TraceHeader("0.32.0", "synthetic", config)
    assert header.settings["enable_prefix_caching"] is True  # the config is its home
    path = tmp_path / "t.ndjson"
    writer = TraceWriter(path, header)
    with pytest.raises(ValueError, match="needs its block_hashes"):
        writer.write(AddRequest("a", 20, 4, prompt_token_ids=tuple(range(20))))
    writer.write(AddRequest("a", 20, 4, block_hashes=("0a",)))
    writer.write(StepRecord(0, {"a": 20}, {}, [], [], 20, 20))
    writer.write(ModelOutput({"a": 1}, block_hashes={"a": ()}))
    writer.close()
    text = path.read_text()
    assert '"prompt_token_ids"' not in text and '"token_ids"' not in text
    entries = read_trace(path).entries
    assert entries[0] == AddRequest("a", 20, 4, block_hashes=("0a",))
    assert entries[2] == ModelOutput({"a": 1}, {}, 0, block_hashes={"a": ()})


def test_a_what_if_from_the_trace_shares_prompts_where_vllm_hashed_them_equal() -> None:
    trace = read_trace(PREFIX_TRACE)
    scenario = scenario_from_trace(trace, "dual")
    assert scenario.config.enable_prefix_caching
    by_id = {r.id: r for r in scenario.requests}
    adds = [e for e in trace.entries if isinstance(e, AddRequest)]
    for a in adds:
        ids = by_id[a.request_id].prompt_token_ids
        assert ids is not None and len(ids) == a.prompt_len
    for a in adds[:6]:
        for b in adds[:6]:
            shared = 0
            assert a.block_hashes is not None and b.block_hashes is not None
            while shared < min(len(a.block_hashes), len(b.block_hashes)):
                if a.block_hashes[shared] != b.block_hashes[shared]:
                    break
                shared += 1
            ia, ib = (by_id[x.request_id].prompt_token_ids or () for x in (a, b))
            assert ia[: shared * 32] == ib[: shared * 32]
            if a is not b and shared < min(len(a.block_hashes), len(b.block_hashes)):
                block = slice(shared * 32, (shared + 1) * 32)
                assert ia[block] != ib[block]
    assert prompt_ids_from_hashes("x", 5, (), 32) != prompt_ids_from_hashes("y", 5, (), 32)


@pytest.mark.live
def test_the_recorder_writes_vllms_block_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.lockstep import live_records
    from dualbudget.integration.recorder import RecordingScheduler
    from dualbudget.integration.testing import built_by_the_release

    scenario = built_by_the_release(preset("chat-system-prompt").scenario(0), profile)
    assert scenario.config.enable_prefix_caching
    trace = tmp_path / "trace.ndjson"
    monkeypatch.setenv("DUALBUDGET_TRACE", str(trace))
    monkeypatch.setenv("DUALBUDGET_TRACE_SOURCE", "scheduler")
    plain = live_records(scenario, LiveScheduler(scenario.config), 60)
    live = LiveScheduler(scenario.config, scheduler_cls=RecordingScheduler)
    recorded = live_records(scenario, live, 60)
    assert [r.decision() for r in recorded] == [r.decision() for r in plain]
    written = read_trace(trace)
    chains = held(trace.read_text().splitlines())
    running = live.scheduler.requests
    assert running
    for rid, request in running.items():
        assert chains[rid] == [bytes(h).hex() for h in request.block_hashes]
    live.scheduler.shutdown()
    result = replay_trace(written)
    assert result.ok, (result.divergence, result.violations)
    assert result.steps_checked == 60 and result.prefix_hits > 0


def test_docs_traces_md_states_this_version_and_every_replay_json_key() -> None:
    from dualbudget.reference.runs.replay import ReplayResult

    text = (REPO / "docs/traces.md").read_text()
    assert f"## The format: `dualbudget-trace`, version {VERSION}\n" in text
    table = text.split("`--json FILE` writes", 1)[1].split("\n\n")[1]
    keys = [row.split("|")[1].strip().strip("`") for row in table.splitlines()[2:]]
    assert keys == list(ReplayResult("p", "vllm-0.32").to_json())
