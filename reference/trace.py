"""The trace format ``dualbudget-trace``, version 3 (versions 1 and 2 are still read):
NDJSON, one object per line.

Line 1, the header::

    {"format": "dualbudget-trace", "version": 3, "vllm_version": "0.32.0",
     "source": "engine" | "scheduler" | "synthetic", "scheduler_class": "...",
     "config": {... vLLM's names, as in a scenario, async_scheduling included ...},
     "settings": {... every engine-scope setting of reference/settings.py ...},
     "notes": {...}}

then, in the order they happened, the events that came from outside the scheduler and the
decisions it made::

    {"event": "add_request", "request_id", "prompt_len", "max_tokens", "priority",
     "arrival_time", "settings"?,          (request-scope settings, only when set)
     "block_hashes"?}                      (prefix caching: the prompt's full blocks)
    {"event": "abort", "request_id"}
    {"event": "step", "step", "num_scheduled_tokens", "scheduled_spec_tokens", "preempted",
     "finished", ...}                      (a step record, docs/design.md §4.2)
    {"event": "model_output", "step", "num_sampled": {id: n}, "stopped": {id: n},
     "block_hashes"?: {id: [...]}}         (prefix caching: the hashes each request gained)
    {"event": "draft_proposals", "num_drafts": {id: n}}

and last ``{"event": "end", "steps": N}``: a trace without it was cut short. Only
budget-relevant fields are kept: no token ids, no prompts. Prefix caching's hits are
reproduced from vLLM's own block hashes (``Request.block_hashes``, as hex): only their
equality matters, so they carry no token content. A file named ``*.gz`` is read through
gzip (a burst of thousands of arrivals compresses well).

Version 2 differs in two places: it carries no block hashes (a version-2 trace recorded
with prefix caching is read but not replayed), and its header's ``settings`` lack those
added since (read at the value the reference assumes). Version 1 differs from version 2
in three: the header holds ``async_scheduling`` and ``enable_prefix_caching`` as top-level
flags and no ``settings`` (a version-1 trace is read with every other setting at the value
the reference assumes), a model output names neither its step nor natural stops, and
``add_request`` carries no settings.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from dualbudget.spec.config import EngineConfig
from dualbudget.spec.errors import BadInput

from .events import Abort, AddRequest, DraftProposals, Event, ModelOutput, StepRecord
from .prefix_cache import HitRule
from .scenario import (
    Acceptance,
    RequestSpec,
    Scenario,
    ScenarioError,
    config_to_json,
    parse_config,
    validate,
)
from .settings import (
    ENGINE_SETTINGS,
    REQUEST_SETTINGS,
    Json,
    assumed_request_settings,
    assumed_settings,
)
from .token_ids import segment

FORMAT = "dualbudget-trace"
VERSION = 3
"""The version written."""
READS = (1, 2, 3)
"""The versions read."""
HASHES_FROM = 3
"""The first version that carries block hashes (prefix caching replays from it on)."""
ENGINE_SETTINGS_OF_VERSION_2 = (
    "enable_prefix_caching",
    "max_num_active_seqs",
    "watermark",
    "scheduler_reserve_full_isl",
    "long_prefill_token_threshold_adaptive",
    "prefill_schedule_interval",
    "num_speculative_tokens_per_batch_size",
    "num_nextn_predict_layers",
    "kv_cache_groups",
    "enable_lora",
)
"""The engine-scope settings a version-2 header holds, every one of them; the others are
read at the value the reference assumes."""
SOURCES = ("engine", "scheduler", "synthetic")

Entry = Event | StepRecord


class TraceError(BadInput):
    """A trace that cannot be read: corrupt, truncated, or of another format or version."""


@dataclass(frozen=True)
class TraceHeader:
    vllm_version: str
    source: str
    config: EngineConfig
    """The engine config; ``config.async_scheduling`` says whether scheduling was async."""
    scheduler_class: str = "vllm.v1.core.sched.scheduler.Scheduler"
    settings: dict[str, Json] = field(default_factory=assumed_settings)
    """Every engine-scope setting of ``reference/settings.py`` ``SETTINGS``, as recorded."""
    notes: dict[str, Any] = field(default_factory=dict)
    """Free-form facts about the recording (e.g. a method substituted on CPU)."""
    version: int = VERSION
    """The format version the trace was read from (written: always ``VERSION``)."""

    def __post_init__(self) -> None:
        # In memory the engine config is the home of enable_prefix_caching (the reference
        # runs on it); the file keeps it in settings: the two never disagree.
        settings = {**self.settings, "enable_prefix_caching": self.config.enable_prefix_caching}
        object.__setattr__(self, "settings", settings)

    @property
    def async_scheduling(self) -> bool:
        return self.config.async_scheduling

    @property
    def enable_prefix_caching(self) -> bool:
        return self.config.enable_prefix_caching

    def to_json(self) -> dict[str, Any]:
        config = config_to_json(self.config)
        config.pop("enable_prefix_caching", None)
        return {
            "format": FORMAT,
            "version": VERSION,
            "vllm_version": self.vllm_version,
            "source": self.source,
            "scheduler_class": self.scheduler_class,
            "config": config,
            "settings": dict(self.settings),
            "notes": dict(self.notes),
        }


@dataclass(frozen=True)
class Trace:
    path: str
    header: TraceHeader
    entries: tuple[Entry, ...]
    request_settings: dict[str, dict[str, Json]] = field(default_factory=dict)
    """Request-scope settings by request id, for the requests that set one."""

    @property
    def steps(self) -> int:
        return sum(isinstance(entry, StepRecord) for entry in self.entries)

    @property
    def natural_stops(self) -> int:
        """How many requests the trace saw stop on EOS or a stop token."""
        return sum(len(e.stopped) for e in self.entries if isinstance(e, ModelOutput))


def entry_to_json(entry: Entry) -> dict[str, Any]:
    """An entry as its trace line; token ids are never written (block hashes stand for
    them under prefix caching)."""
    if isinstance(entry, StepRecord):
        return {"event": "step", **entry.to_json()}
    if isinstance(entry, AddRequest):
        obj: dict[str, Any] = {
            "event": "add_request",
            "request_id": entry.request_id,
            "prompt_len": entry.prompt_len,
            "max_tokens": entry.max_tokens,
            "priority": entry.priority,
            "arrival_time": entry.arrival_time,
        }
        if entry.block_hashes is not None:
            obj["block_hashes"] = list(entry.block_hashes)
        return obj
    if isinstance(entry, Abort):
        return {"event": "abort", "request_id": entry.request_id}
    if isinstance(entry, ModelOutput):
        obj = {
            "event": "model_output",
            "step": entry.step,
            "num_sampled": dict(entry.num_sampled),
            "stopped": dict(entry.stopped),
        }
        if entry.block_hashes:
            obj["block_hashes"] = {rid: list(h) for rid, h in entry.block_hashes.items()}
        return obj
    if isinstance(entry, DraftProposals):
        return {"event": "draft_proposals", "num_drafts": dict(entry.num_drafts)}
    raise TypeError(f"not a trace entry: {entry!r}")


class TraceWriter:
    """Writes a trace so that the file on disk is a complete trace after every entry.

    Each entry is followed by the end line, which the next entry overwrites: a recorder
    whose process is killed (a server stopped by a signal that never reaches its
    ``shutdown``) still leaves a trace of everything it saw, while a write cut in the
    middle leaves no end line, which ``read_trace`` reports as truncated.
    """

    def __init__(self, path: str | Path, header: TraceHeader) -> None:
        self._stream: IO[bytes] = open(path, "wb")  # noqa: SIM115 (closed in close())
        self._prefix_caching = header.enable_prefix_caching
        self._steps = 0
        self._last_step: int | None = None
        self._append(header.to_json())

    def write(self, entry: Entry, settings: Mapping[str, Json] | None = None) -> None:
        """Append ``entry``; ``settings`` are an ``AddRequest``'s request-scope settings
        (written only when one differs from what the reference assumes)."""
        if self._prefix_caching and isinstance(entry, AddRequest) and entry.block_hashes is None:
            # Token ids are never written: without its hashes a request's hits are lost.
            raise ValueError(
                f"request {entry.request_id!r}: a trace with prefix caching needs its block_hashes"
            )
        obj = entry_to_json(entry)
        if isinstance(entry, StepRecord):
            self._steps += 1
            self._last_step = entry.step
        elif isinstance(entry, ModelOutput) and entry.step is None:
            # None is "the step just scheduled" (events.py): name it, as version 2 must.
            if self._last_step is None:
                raise ValueError("a model output before any step")
            obj["step"] = self._last_step
        if settings:
            if not isinstance(entry, AddRequest):
                raise TypeError("only an add_request carries settings")
            defaults = assumed_request_settings()
            unknown = set(settings) - set(defaults)
            if unknown:
                raise ValueError(f"not request-scope settings: {sorted(unknown)}")
            changed = {k: v for k, v in settings.items() if v != defaults[k]}
            if changed:
                obj["settings"] = changed
        self._append(obj)

    def close(self) -> None:
        """Close the file (its end line is already written); a second call does nothing."""
        self._stream.close()

    def _append(self, obj: dict[str, Any]) -> None:
        if self._stream.closed:
            raise ValueError("the trace is closed")
        stream = self._stream
        # The stream stands where the last end line begins: overwrite it.
        stream.write(_line(obj))
        mark = stream.tell()
        stream.write(_line({"event": "end", "steps": self._steps}))
        stream.truncate()
        stream.flush()
        stream.seek(mark)


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def read_trace(path: str | Path) -> Trace:
    name = str(path)
    try:
        if name.endswith(".gz"):
            with gzip.open(path, "rt") as stream:
                lines = stream.read().splitlines()
        else:
            lines = Path(path).read_text().splitlines()
    except (OSError, EOFError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise TraceError(f"trace {name!r}: cannot read: {reason}") from None
    except UnicodeDecodeError:
        raise TraceError(f"trace {name!r}: not a text file") from None
    objects = _json_lines(name, lines)
    header = _header(name, next(objects, None))
    entries: list[Entry] = []
    request_settings: dict[str, dict[str, Json]] = {}
    # Before version 3 a prefix-cached trace holds no hashes: read, but never replayed.
    hashed = header.enable_prefix_caching and header.version >= HASHES_FROM
    chain = _HashChain(name, header.config.block_size, hashed, _hash_lookahead(header))
    steps = 0
    for lineno, obj in objects:
        kind = obj.get("event")
        if kind == "end":
            if obj.get("steps") != steps:
                raise TraceError(
                    f"trace {name!r} line {lineno}: end says {obj.get('steps')!r} steps,"
                    f" the trace holds {steps}"
                )
            if next(objects, None) is not None:
                raise TraceError(f"trace {name!r}: lines after the end line")
            return Trace(name, header, tuple(entries), request_settings)
        entry = _entry(name, lineno, obj, header.version, steps)
        chain.check(lineno, entry)
        steps += isinstance(entry, StepRecord)
        if isinstance(entry, AddRequest) and "settings" in obj:
            if header.version < 2:
                raise TraceError(f"trace {name!r} line {lineno}: settings need version 2")
            request_settings[entry.request_id] = _settings(
                name, f"line {lineno}: settings", obj["settings"], REQUEST_SETTINGS, ()
            )
        entries.append(entry)
    raise TraceError(f"trace {name!r}: truncated: no end line after {len(lines)} lines")


def _json_lines(name: str, lines: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            raise TraceError(f"trace {name!r} line {lineno}: empty line")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise TraceError(f"trace {name!r} line {lineno}: corrupt JSON: {err.msg}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"trace {name!r} line {lineno}: not a JSON object")
        yield lineno, obj


def _header(name: str, first: tuple[int, dict[str, Any]] | None) -> TraceHeader:
    if first is None:
        raise TraceError(f"trace {name!r}: empty")
    _, obj = first
    if obj.get("format") != FORMAT:
        raise TraceError(f"trace {name!r}: not a {FORMAT} file (format {obj.get('format')!r})")
    version = obj.get("version")
    if version not in READS or isinstance(version, bool):
        raise TraceError(
            f"trace {name!r}: {FORMAT} version {version!r}, this reads versions"
            f" {', '.join(map(str, READS[:-1]))} and {READS[-1]} only"
        )
    source = obj.get("source")
    if source not in SOURCES:
        raise TraceError(f"trace {name!r}: source {source!r} is not one of {SOURCES}")
    vllm_version = obj.get("vllm_version")
    if not isinstance(vllm_version, str):
        raise TraceError(f"trace {name!r}: header.vllm_version must be a string")
    try:
        config = parse_config(obj.get("config"))
    except ScenarioError as err:
        raise TraceError(f"trace {name!r}: header.{err}") from None
    if version == 1:
        # Version 1 kept these two as top-level flags and recorded no other setting.
        settings = assumed_settings()
        settings["enable_prefix_caching"] = _flag(name, obj, "enable_prefix_caching")
        config = replace(config, async_scheduling=_flag(name, obj, "async_scheduling"))
    else:
        in_config = isinstance(obj.get("config"), dict) and "enable_prefix_caching" in obj["config"]
        if "async_scheduling" in obj or "enable_prefix_caching" in obj or in_config:
            raise TraceError(
                f"trace {name!r}: version 2 keeps async_scheduling in header.config and"
                " enable_prefix_caching in header.settings, and so does every later version"
            )
        required = ENGINE_SETTINGS if version > 2 else ENGINE_SETTINGS_OF_VERSION_2
        given = _settings(name, "header.settings", obj.get("settings"), ENGINE_SETTINGS, required)
        settings = {**assumed_settings(), **given}
        settings["enable_prefix_caching"] = _flag(
            name, settings, "enable_prefix_caching", "header.settings"
        )
    config = replace(config, enable_prefix_caching=bool(settings["enable_prefix_caching"]))
    notes = obj.get("notes", {})
    return TraceHeader(
        vllm_version=vllm_version,
        source=source,
        config=config,
        scheduler_class=str(obj.get("scheduler_class", "")),
        settings=settings,
        notes=notes if isinstance(notes, dict) else {},
        version=version,
    )


def _settings(
    name: str, where: str, value: object, names: tuple[str, ...], required: tuple[str, ...]
) -> dict[str, Json]:
    """A ``settings`` object: known names only, and every ``required`` one of them."""
    if not isinstance(value, dict):
        raise TraceError(f"trace {name!r}: {where} must be an object, got {value!r}")
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise TraceError(f"trace {name!r}: {where}: unknown setting {unknown[0]!r}")
    missing = [key for key in required if key not in value]
    if missing:
        raise TraceError(f"trace {name!r}: {where}: missing setting {missing[0]!r}")
    return dict(value)


def _flag(name: str, obj: dict[str, Any], key: str, where: str = "header") -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        raise TraceError(f"trace {name!r}: {where}.{key} must be true or false, got {value!r}")
    return value


def _counts(name: str, lineno: int, value: object, key: str) -> dict[str, int]:
    if not isinstance(value, dict) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in value.values()
    ):
        raise TraceError(f"trace {name!r} line {lineno}: {key} must map ids to integers")
    return {str(k): int(v) for k, v in value.items()}


def _model_output(
    name: str, lineno: int, obj: dict[str, Any], version: int, steps: int
) -> ModelOutput:
    sampled = _counts(name, lineno, obj["num_sampled"], "num_sampled")
    if version < 2:
        return ModelOutput(sampled)
    step = obj["step"]
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < steps:
        raise TraceError(
            f"trace {name!r} line {lineno}: model_output.step must name a step already"
            f" recorded (0..{steps - 1}), got {step!r}"
        )
    stopped = _counts(name, lineno, obj["stopped"], "stopped")
    for rid, kept in stopped.items():
        if not 1 <= kept <= sampled.get(rid, 0):
            raise TraceError(
                f"trace {name!r} line {lineno}: stopped[{rid!r}] must be in"
                f" 1..num_sampled ({sampled.get(rid, 0)}), got {kept}"
            )
    gained: dict[str, tuple[str, ...]] = {}
    if "block_hashes" in obj:
        where = "model_output.block_hashes"
        value = _since(name, lineno, obj["block_hashes"], where, version)
        if not isinstance(value, dict):
            raise TraceError(f"trace {name!r} line {lineno}: {where} must map ids to lists")
        gained = {
            str(rid): _hashes(name, lineno, h, f"{where}[{rid!r}]") for rid, h in value.items()
        }
    return ModelOutput(sampled, stopped, step, block_hashes=gained)


def _since(name: str, lineno: int, value: object, where: str, version: int) -> object:
    if version < HASHES_FROM:
        raise TraceError(f"trace {name!r} line {lineno}: {where} needs version {HASHES_FROM}")
    return value


def _hashes(name: str, lineno: int, value: object, where: str) -> tuple[str, ...]:
    """Block hashes as the trace holds them: vLLM's, as hex strings (opaque: only their
    equality matters)."""
    if not isinstance(value, list) or not all(
        isinstance(h, str) and h and all(c in _HEX for c in h) for h in value
    ):
        raise TraceError(f"trace {name!r} line {lineno}: {where} must be a list of hex strings")
    return tuple(value)


_HEX = frozenset("0123456789abcdef")


def _hash_lookahead(header: TraceHeader) -> int:
    """The tokens past each block its hash covers in the vLLM that recorded the trace
    (0.33's lookahead hashes for EAGLE-style drafters: each hash made that much later)."""
    if header.settings.get("disable_lookahead_block_hashes"):
        return 0
    spec = header.config.speculative_config
    release = ".".join(header.vllm_version.split(".")[:2])
    rule = HitRule.of(release, None if spec is None else spec.method)
    return rule.num_hash_lookahead_tokens


class _HashChain:
    """Checks a trace's block hashes against its own block size and chain.

    A request holds at most one hash per full block of its tokens so far (its prompt and
    every token it kept; vLLM hashes a block once it is full, and with ``lookahead`` once
    that many tokens follow it). Hashes chain: one hash stands for one prefix, so it sits
    at one block position and follows one parent, whichever requests hold it.
    """

    def __init__(self, name: str, block_size: int, prefix_caching: bool, lookahead: int) -> None:
        self._name = name
        self._block_size = block_size
        self._prefix_caching = prefix_caching
        self._lookahead = lookahead
        self._tokens: dict[str, int] = {}
        self._held: dict[str, list[str]] = {}
        self._seen: dict[str, tuple[int, str | None, str]] = {}
        """hash -> (block position, parent hash, the first request holding it)."""

    def check(self, lineno: int, entry: Entry) -> None:
        if isinstance(entry, AddRequest):
            if self._prefix_caching and entry.block_hashes is None:
                raise TraceError(
                    f"trace {self._name!r} line {lineno}: request {entry.request_id!r} carries"
                    " no block_hashes, which every request of a trace recorded with"
                    " enable_prefix_caching needs"
                )
            self._tokens[entry.request_id] = entry.prompt_len
            self._held[entry.request_id] = []
            if entry.block_hashes is not None:
                self._extend(lineno, entry.request_id, entry.block_hashes)
        elif isinstance(entry, ModelOutput):
            for rid, n in entry.num_sampled.items():
                if rid in self._tokens:
                    self._tokens[rid] += entry.stopped.get(rid, n)
            for rid, hashes in entry.block_hashes.items():
                if rid not in self._held:
                    raise TraceError(
                        f"trace {self._name!r} line {lineno}: block_hashes for {rid!r},"
                        " a request the trace never added"
                    )
                self._extend(lineno, rid, hashes)

    def _extend(self, lineno: int, rid: str, hashes: tuple[str, ...]) -> None:
        held = self._held[rid]
        where = f"trace {self._name!r} line {lineno}: request {rid!r}"
        tokens = self._tokens[rid]
        full = max(tokens - self._lookahead, 0) // self._block_size
        if len(held) + len(hashes) > full:
            past = f", hashed once {self._lookahead} more follow" if self._lookahead else ""
            raise TraceError(
                f"{where} holds {len(held) + len(hashes)} block hashes, more than the {full}"
                f" full blocks of block_size {self._block_size} in its {tokens} tokens so"
                f" far{past}"
            )
        for block_hash in hashes:
            position, parent = len(held), held[-1] if held else None
            seen = self._seen.setdefault(block_hash, (position, parent, rid))
            if seen[0] != position:
                raise TraceError(
                    f"{where}: block hash {block_hash} at block {position}, and at block"
                    f" {seen[0]} of request {seen[2]!r}: one hash, two positions in the chain"
                )
            if seen[1] != parent:
                raise TraceError(
                    f"{where}: block hash {block_hash} follows {parent}, and {seen[1]} in"
                    f" request {seen[2]!r}: a shared hash whose preceding hashes differ"
                )
            held.append(block_hash)


def _entry(name: str, lineno: int, obj: dict[str, Any], version: int, steps: int) -> Entry:
    kind = obj.get("event")
    try:
        if kind == "add_request":
            hashes = None
            if "block_hashes" in obj:
                where = "add_request.block_hashes"
                value = _since(name, lineno, obj["block_hashes"], where, version)
                hashes = _hashes(name, lineno, value, where)
            return AddRequest(
                request_id=str(obj["request_id"]),
                prompt_len=int(obj["prompt_len"]),
                max_tokens=int(obj["max_tokens"]),
                priority=int(obj.get("priority", 0)),
                arrival_time=float(obj.get("arrival_time", 0.0)),
                block_hashes=hashes,
            )
        if kind == "abort":
            return Abort(str(obj["request_id"]))
        if kind == "model_output":
            return _model_output(name, lineno, obj, version, steps)
        if kind == "draft_proposals":
            return DraftProposals(_counts(name, lineno, obj["num_drafts"], "num_drafts"))
        if kind == "step":
            return StepRecord(
                step=int(obj["step"]),
                num_scheduled_tokens=_counts(
                    name, lineno, obj["num_scheduled_tokens"], "num_scheduled_tokens"
                ),
                scheduled_spec_tokens=_counts(
                    name, lineno, obj.get("scheduled_spec_tokens", {}), "scheduled_spec_tokens"
                ),
                preempted=[str(r) for r in obj.get("preempted", [])],
                finished=[str(r) for r in obj.get("finished", [])],
                target_tokens=int(obj.get("target_tokens", 0)),
                draft_rows=int(obj.get("draft_rows", 0)),
                budgets_left=dict(obj.get("budgets_left", {})),
            )
    except (KeyError, TypeError, ValueError) as err:
        raise TraceError(f"trace {name!r} line {lineno}: bad {kind} event: {err}") from None
    raise TraceError(f"trace {name!r} line {lineno}: unknown event {kind!r}")


def scenario_from_trace(trace: Trace, profile: str, seed: int = 0) -> Scenario:
    """A what-if workload from a recorded trace: its config, its requests arriving at the
    steps they arrived (aborts likewise), and the acceptance it measured.

    Acceptance is kept as empirical per-position rates (position ``j`` accepted given
    ``j-1`` was), not as a per-step table: under another profile the same step schedules
    other requests, so only the rates carry over. The simulated drafter proposes ``K``
    every step; a decode step after the recorded drafter proposed nothing counts as a
    rejection at position 0, and padded placeholders (which no target accepts) as
    rejections, so the rates fold in how often real drafts were there. What does not
    carry over is the verify width: a step the trace ran at width 1 is simulated at
    ``1 + K``, so step counts of a what-if are model results, not replays.

    A prefix-cached trace (version 3) keeps what its prompts shared: each request gets
    prompt ids made from its recorded block hashes (``prompt_ids_from_hashes``), so two
    prompts share a block in the what-if exactly where vLLM found them sharing one. Its
    outputs are the simulation's own ids, so a later turn's blocks over an earlier reply
    are shared no more.
    """
    arrivals: dict[str, tuple[AddRequest, int]] = {}
    aborts: dict[str, int] = {}
    reached: list[int] = []
    accepted: list[int] = []
    steps = 0
    # The drafts each step verified, by step: under async an output answers an earlier step.
    spec_of: dict[int, dict[str, int]] = {}
    last = -1
    proposed_none: set[str] = set()
    for entry in trace.entries:
        if isinstance(entry, StepRecord):
            steps += 1
            last = entry.step
            spec_of[last] = entry.scheduled_spec_tokens
        elif isinstance(entry, AddRequest):
            arrivals[entry.request_id] = (entry, steps)
        elif isinstance(entry, Abort):
            aborts.setdefault(entry.request_id, steps)
        elif isinstance(entry, DraftProposals):
            proposed_none = {rid for rid, n in entry.num_drafts.items() if n == 0}
        elif isinstance(entry, ModelOutput):
            spec = spec_of.get(last if entry.step is None else entry.step, {})
            for rid, sampled in entry.num_sampled.items():
                drafts = spec.get(rid, 0)
                if sampled <= 0 or (drafts <= 0 and rid not in proposed_none):
                    continue
                # A decode step after the drafter proposed nothing (n-gram without a
                # match) counts as a rejection at the first position: the simulation
                # proposes K every step, so the trace's silence must lower the rates.
                drafts = max(drafts, 1)
                taken = sampled - 1
                while len(reached) < drafts:
                    reached.append(0)
                    accepted.append(0)
                for position in range(min(taken + 1, drafts)):
                    reached[position] += 1
                    accepted[position] += position < taken
    if not arrivals:
        raise TraceError(f"trace {trace.path!r}: holds no request to simulate")
    rates = tuple(a / r if r else 0.0 for a, r in zip(accepted, reached, strict=True))
    block_size = trace.header.config.block_size
    requests = tuple(
        RequestSpec(
            id=rid,
            prompt_len=event.prompt_len,
            max_tokens=event.max_tokens,
            arrival_step=step,
            priority=event.priority,
            abort_step=max(aborts[rid], step) if rid in aborts else None,
            prompt_token_ids=None
            if event.block_hashes is None
            else prompt_ids_from_hashes(rid, event.prompt_len, event.block_hashes, block_size),
        )
        for rid, (event, step) in arrivals.items()
    )
    acceptance = Acceptance(fixed=None, per_position=rates, seed=seed)
    return validate(Scenario(profile, trace.header.config, requests, acceptance))


def prompt_ids_from_hashes(
    request_id: str, prompt_len: int, block_hashes: Sequence[str], block_size: int
) -> tuple[int, ...]:
    """Prompt ids that share a block with another prompt's exactly where their recorded
    hashes are equal: each hashed block the ids of its hash, the rest the request's own.
    Because a hash stands for its whole prefix, equal ids chain back to equal hashes."""
    ids = [i for h in block_hashes for i in segment(f"block:{h}", block_size)]
    return (*ids, *segment(f"tail:{request_id}", prompt_len - len(ids)))
