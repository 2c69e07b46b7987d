"""The file formats' schemas: each default is read from the dataclass it fills, what the
writers write reads back equal, and bad input is one line naming the field (and, in a
trace, the line), never pydantic's own multi-line report."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dualbudget.reference.events import (
    Abort,
    AddRequest,
    DraftProposals,
    ModelOutput,
    ResetPrefixCache,
    SetPauseState,
    StepRecord,
)
from dualbudget.reference.formats.scenario import (
    Acceptance,
    ConfigJson,
    RequestJson,
    RequestSpec,
    ScenarioError,
    SpeculativeJson,
    parse_scenario,
)
from dualbudget.reference.formats.settings import SETTINGS, assumed_settings
from dualbudget.reference.formats.trace import (
    VERSION,
    TraceError,
    TraceHeader,
    TraceWriter,
    entry_to_json,
    read_trace,
)
from dualbudget.reference.formats.trace_schema import EndLine, line_adapter, settings_schema
from dualbudget.spec.config import EngineConfig, SpeculativeConfig

MODELS_AND_DATACLASSES: list[tuple[type[BaseModel], type[Any]]] = [
    (ConfigJson, EngineConfig),
    (SpeculativeJson, SpeculativeConfig),
    (RequestJson, RequestSpec),
]


@pytest.mark.parametrize(("model", "cls"), MODELS_AND_DATACLASSES, ids=lambda c: c.__name__)
def test_a_schema_holds_its_dataclass_fields_with_their_defaults(
    model: type[BaseModel], cls: type[Any]
) -> None:
    fields = dataclasses.fields(cls)
    assert list(model.model_fields) == [f.name for f in fields]
    for item in fields:
        info = model.model_fields[item.name]
        if item.default is dataclasses.MISSING:
            assert info.is_required(), item.name
        else:
            assert info.default == item.default, item.name


def base() -> dict[str, Any]:
    return {
        "profile": "vllm-0.32",
        "config": {
            "max_num_batched_tokens": 20,
            "max_num_seqs": 16,
            "max_model_len": 64,
            "block_size": 16,
            "num_gpu_blocks": 64,
            "speculative_config": {"method": "eagle3", "num_speculative_tokens": 4},
        },
        "requests": [
            {"id": "a", "prompt_len": 10, "max_tokens": 6},
            {"id": 7, "prompt_len": 3, "max_tokens": 2},
        ],
    }


def test_a_scenario_left_at_its_defaults_reads_as_the_dataclasses_defaults() -> None:
    scenario = parse_scenario(base())
    assert scenario.config == EngineConfig(
        20, 16, 64, 16, 64, speculative_config=SpeculativeConfig("eagle3", 4)
    )
    assert scenario.requests == (RequestSpec("a", 10, 6), RequestSpec("7", 3, 2))
    assert scenario.acceptance == Acceptance()
    assert scenario.drafts is None and scenario.stops is None
    assert parse_scenario(scenario.to_json()) == scenario


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Sets the key at ``path`` (dots; a digit is a list index) of a scenario."""

    def change(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = obj
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda obj: obj["config"].pop(key)


BAD_SCENARIOS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "bool-for-int": (
        _set("config.max_num_seqs", True),
        "config.max_num_seqs: must be an integer, got true",
    ),
    "float-for-int": (
        _set("config.block_size", 16.0),
        "config.block_size: must be an integer, got 16.0",
    ),
    "string-for-bool": (
        _set("config.async_scheduling", "yes"),
        "config.async_scheduling: must be true or false, got 'yes'",
    ),
    "missing": (_drop("max_model_len"), "config.max_model_len: missing"),
    "unknown-nested-key": (
        _set("config.speculative_config.num_speculative_token", 4),
        "config.speculative_config.num_speculative_token: unknown key",
    ),
    "list-item": (_set("requests.1.max_tokens", 0), "requests[1].max_tokens: must be >= 1, got 0"),
    "id-not-a-string": (_set("requests.0.id", None), "requests[0].id: must be a string, got null"),
    "duplicate-id": (_set("requests.1.id", "a"), "requests[1].id: duplicate request id 'a'"),
    "no-requests": (_set("requests", []), "requests: must hold at least 1, holds 0"),
    "not-an-object": (_set("requests.0", [1]), "requests[0]: must be a JSON object, got a list"),
    "step-key": (
        _set("stops", {"one": {"a": 1}}),
        "stops.one: step keys must be non-negative integers",
    ),
    "table-id": (_set("stops", {"2": {"z": 1}}), "stops.2.z: no request has this id"),
    "probability": (
        _set("acceptance", {"per_position": [0.5, 2], "seed": 0}),
        "acceptance.per_position[1]: must be <= 1.0, got 2",
    ),
    "two-kinds": (
        _set("acceptance", {"fixed": 1, "explicit": {}}),
        "acceptance: must have exactly one of 'fixed', 'per_position', 'explicit'",
    ),
    "drafts-past-k": (_set("drafts", {"fixed": 5}), "drafts.fixed: must be <= K=4, got 5"),
    "version": (_set("version", 2), "version: must be 1, got 2"),
}


@pytest.mark.parametrize(("change", "message"), BAD_SCENARIOS.values(), ids=list(BAD_SCENARIOS))
def test_a_bad_scenario_is_one_line_naming_the_field(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    obj = base()
    change(obj)
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(obj)
    assert str(raised.value) == message
    assert raised.value.field == message.split(": ")[0]


def test_a_scenario_that_is_no_object_is_named_as_a_whole() -> None:
    with pytest.raises(ScenarioError, match=r"^scenario: must be a JSON object, got a list$"):
        parse_scenario([base()])


# -- the trace ---------------------------------------------------------------------------
Entry = (
    AddRequest
    | Abort
    | ResetPrefixCache
    | SetPauseState
    | StepRecord
    | ModelOutput
    | DraftProposals
)
ENGINE_CALLS: list[Entry] = [
    ResetPrefixCache(reset_running_requests=True),
    SetPauseState("paused_all"),
    ResetPrefixCache(),
    SetPauseState("unpaused"),
]
"""Lines 8 to 11 of the trace below: every line kind version 5 added, each value."""
ENGINE_CALL_EVENTS = {"reset_prefix_cache", "set_pause_state"}
ENTRIES: list[Entry] = [
    AddRequest("a", 48, 3, priority=1, arrival_time=0.5, block_hashes=("0a", "0b")),
    AddRequest("b", 8, 2),
    StepRecord(0, {"a": 48, "b": 8}, {}, [], [], 56, 56, {"token_budget": 0}),
    ModelOutput({"a": 1, "b": 1}, {"b": 1}, 0, block_hashes={"a": ("0c",)}),
    DraftProposals({"a": 2}),
    Abort("a"),
    *ENGINE_CALLS,
    StepRecord(1, {}, {}, [], ["a", "b"], 0, 0),
]
CONFIG = EngineConfig(64, 4, 128, 16, 64, speculative_config=SpeculativeConfig("draft_model", 2))


def write_trace(path: Path) -> list[str]:
    """A small trace through the writer (no scheduler involved); its lines."""
    writer = TraceWriter(path, TraceHeader("0.32.0", "engine", CONFIG))
    for entry in ENTRIES:
        writer.write(entry, {"structured_outputs": True} if entry == ENTRIES[1] else None)
    writer.close()
    return path.read_text().splitlines()


def test_what_the_writer_writes_reads_back_equal(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.ndjson")
    trace = read_trace(tmp_path / "t.ndjson")
    assert trace.entries == tuple(ENTRIES)
    assert trace.header == TraceHeader("0.32.0", "engine", CONFIG)
    assert trace.request_settings == {"b": {"structured_outputs": True}}
    for entry in ENTRIES:
        line = line_adapter(VERSION).validate_json(json.dumps(entry_to_json(entry)))
        assert not isinstance(line, EndLine) and line.entry() == entry


def _mangle_line(
    number: int, change: Callable[[dict[str, Any]], None]
) -> Callable[[list[str]], None]:
    def mangle(lines: list[str]) -> None:
        obj = json.loads(lines[number - 1])
        change(obj)
        lines[number - 1] = json.dumps(obj)

    return mangle


BAD_TRACES: dict[str, tuple[Callable[[list[str]], None], str]] = {
    # What follows "trace 'PATH'" in the message.
    "string-for-int": (
        _mangle_line(2, lambda o: o.update(prompt_len="48")),
        " line 2: add_request.prompt_len: must be an integer, got '48'",
    ),
    "unknown-key": (
        _mangle_line(4, lambda o: o.update(draft_row=1)),
        " line 4: step.draft_row: unknown key",
    ),
    "unknown-event": (
        _mangle_line(7, lambda o: o.update(event="abortion")),
        " line 7: event: must be one of 'add_request', 'abort', 'reset_prefix_cache',"
        " 'set_pause_state', 'step', 'model_output', 'draft_proposals', 'end', got 'abortion'",
    ),
    "no-event": (_mangle_line(7, lambda o: o.pop("event")), " line 7: event: missing"),
    "no-stopped": (
        _mangle_line(5, lambda o: o.pop("stopped")),
        " line 5: model_output.stopped: missing",
    ),
    "stop-past-sampled": (
        _mangle_line(5, lambda o: o["stopped"].update(b=2)),
        " line 5: model_output.stopped.b: must be in 1..num_sampled (1), got 2",
    ),
    "not-hex": (
        _mangle_line(2, lambda o: o.update(block_hashes=["0A"])),
        " line 2: add_request.block_hashes[0]: must match ^[0-9a-f]+$, got '0A'",
    ),
    "reset-flag": (
        _mangle_line(8, lambda o: o.update(reset_running_requests="yes")),
        " line 8: reset_prefix_cache.reset_running_requests: must be true or false, got 'yes'",
    ),
    "pause-state": (
        _mangle_line(9, lambda o: o.update(state="paused")),
        " line 9: set_pause_state.state: must be one of unpaused, paused_new, paused_all",
    ),
    "no-pause-state": (
        _mangle_line(11, lambda o: o.pop("state")),
        " line 11: set_pause_state.state: missing",
    ),
    "request-setting": (
        _mangle_line(3, lambda o: o.update(settings={"watermark": 0.1})),
        " line 3: add_request.settings.watermark: unknown key",
    ),
    "header-type": (
        _mangle_line(1, lambda o: o["config"].update(max_num_seqs="4")),
        ": header.config.max_num_seqs: must be an integer, got '4'",
    ),
    "header-setting": (
        _mangle_line(1, lambda o: o["settings"].pop("watermark")),
        ": header.settings.watermark: missing",
    ),
    "corrupt": (
        lambda lines: lines.insert(3, '{"event": '),
        " line 4: corrupt JSON: EOF while parsing a value at line 1 column 10",
    ),
}


@pytest.mark.parametrize(("mangle", "message"), BAD_TRACES.values(), ids=list(BAD_TRACES))
def test_a_bad_trace_is_one_line_naming_line_and_field(
    tmp_path: Path, mangle: Callable[[list[str]], None], message: str
) -> None:
    path = tmp_path / "t.ndjson"
    lines = write_trace(path)
    mangle(lines)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert str(raised.value) == f"trace {str(path)!r}{message}"


def test_a_reset_left_at_its_default_reads_as_the_events_default(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"
    lines = write_trace(path)
    assert json.loads(lines[9]) == {"event": "reset_prefix_cache", "reset_running_requests": False}
    lines[9] = json.dumps({"event": "reset_prefix_cache"})
    path.write_text("\n".join(lines) + "\n")
    assert read_trace(path).entries == tuple(ENTRIES)


def test_the_engine_calls_are_lines_of_version_5_on(tmp_path: Path) -> None:
    """A version-4 trace holds no engine call (its reader would refuse one): such a line
    in it is refused naming the version, and without them it reads as it always did."""
    path = tmp_path / "t.ndjson"
    lines = write_trace(path)
    header = json.loads(lines[0])
    assert header["version"] == VERSION == 5
    header["version"] = 4
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(TraceError) as raised:
        read_trace(path)
    assert str(raised.value) == (
        f"trace {str(path)!r} line 8: event: must be one of 'add_request', 'abort', 'step',"
        " 'model_output', 'draft_proposals', 'end', got 'reset_prefix_cache' in a version-4"
        " trace"
    )
    kept = [line for line in lines[1:] if json.loads(line)["event"] not in ENGINE_CALL_EVENTS]
    path.write_text("\n".join([json.dumps(header), *kept]) + "\n")
    trace = read_trace(path)
    assert trace.header.version == 4
    assert trace.entries == tuple(e for e in ENTRIES if e not in ENGINE_CALLS)


def test_a_header_holds_the_settings_its_version_records(tmp_path: Path) -> None:
    path = tmp_path / "t.ndjson"
    lines = write_trace(path)
    header = json.loads(lines[0])
    later = [s.name for s in SETTINGS if s.scope == "engine" and s.recorded_since > 2]
    assert later  # what version 3 added to the header
    for name in later:
        del header["settings"][name]
    header["version"] = 2
    # Version 2 holds no block hashes either, nor the engine's calls.
    objects = [json.loads(line) for line in lines[1:]]
    objects = [obj for obj in objects if obj["event"] not in ENGINE_CALL_EVENTS]
    for obj in objects:
        obj.pop("block_hashes", None)
    lines = [json.dumps(obj) for obj in objects]
    path.write_text("\n".join([json.dumps(header), *lines]) + "\n")
    # ... read with the later settings at the value the reference assumes,
    assert read_trace(path).header.settings == assumed_settings()
    # while version 3 must hold them.
    header["version"] = 3
    path.write_text("\n".join([json.dumps(header), *lines]) + "\n")
    # A setting rows of traces written before it allow to be absent (``optional``) is not
    # missing; the first that is not is.
    required = next(s.name for s in SETTINGS if s.name in later and not s.optional)
    with pytest.raises(TraceError, match=rf"header\.settings\.{required}: missing"):
        read_trace(path)


@pytest.mark.parametrize("version", [2, 3])
def test_the_settings_schemas_follow_the_settings_table(version: int) -> None:
    engine = settings_schema("engine", version).model_fields
    recorded = [s for s in SETTINGS if s.recorded_since <= version]
    assert list(engine) == [s.name for s in recorded if s.scope == "engine"]
    optional = {s.name for s in recorded if s.optional}
    assert all(info.is_required() != (name in optional) for name, info in engine.items())
    request = settings_schema("request", version).model_fields
    assert list(request) == [s.name for s in recorded if s.scope == "request"]
    assert not any(info.is_required() for info in request.values())
