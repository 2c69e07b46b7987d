"""The trace format ``dualbudget-trace``: NDJSON, one object per line, written at version 5
and read at versions 1 to 5.

What each line may hold, per version, is its schema (``reference/formats/trace_schema.py``;
docs/design.md §4.3 renders its tables): the header first, then, in the order they
happened, the events that came from outside the scheduler (``add_request``, ``abort``,
``reset_prefix_cache``, ``set_pause_state``, ``model_output``, ``draft_proposals``) and
the decisions it made (``step``), and last ``{"event": "end", "steps": N}``: a trace
without it was cut short. Only budget-relevant fields are kept: no token ids, no prompts.
Prefix caching's hits are reproduced from vLLM's own block hashes (``Request.block_hashes``,
as hex): only their equality matters, so they carry no token content. From version 4 each
step line may also hold vLLM's free KV blocks once the step was scheduled, which replay
compares with the reference's pool. From version 5 the engine's own calls on the scheduler
between steps (a prefix-cache reset, a pause or a resume) have lines of their own: a reader
of versions up to 4 refuses such a trace at its header, not at a line it cannot read. A
file named ``*.gz`` is read through gzip (a burst of thousands of arrivals compresses well).

Beyond each line's schema the reader checks what takes the whole trace: the end line's
count, the step a model output answers, and the block hashes against the trace's own
block size and chain. A version-2 trace recorded with prefix caching holds no block hashes:
it is read but not replayed.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from dualbudget.spec.config import EngineConfig
from dualbudget.spec.errors import BadInput
from dualbudget.spec.releases import release_of

from ..events import (
    Abort,
    AddRequest,
    DraftProposals,
    Event,
    ModelOutput,
    ResetPrefixCache,
    SetPauseState,
    StepRecord,
)
from .scenario import config_to_json
from .schemas import first_error
from .settings import SETTINGS_IN_CONFIG, Json, assumed_request_settings, assumed_settings
from .trace_schema import (
    FORMAT,
    VERSIONS,
    AddRequestLineV2,
    EndLine,
    HeaderV1,
    StepLine,
    line_adapter,
)

VERSION = max(VERSIONS)
"""The version written."""
READS = tuple(VERSIONS)
"""The versions read."""
HASHES_FROM = 3
"""The first version that carries block hashes (prefix caching replays from it on)."""

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
    """Every engine-scope setting of ``reference/formats/settings.py`` ``SETTINGS``, as recorded."""
    notes: dict[str, Any] = field(default_factory=dict)
    """Free-form facts about the recording (e.g. a method substituted on CPU)."""
    version: int = VERSION
    """The format version the trace was read from (written: always ``VERSION``)."""

    def __post_init__(self) -> None:
        # In memory the engine config is the home of the settings it holds (the reference
        # runs on it); the file keeps them in settings: the two never disagree.
        in_config = {name: getattr(self.config, name) for name in SETTINGS_IN_CONFIG}
        object.__setattr__(self, "settings", {**self.settings, **in_config})

    @property
    def async_scheduling(self) -> bool:
        return self.config.async_scheduling

    @property
    def enable_prefix_caching(self) -> bool:
        return self.config.enable_prefix_caching

    def to_json(self) -> dict[str, Any]:
        config = config_to_json(self.config)
        for name in SETTINGS_IN_CONFIG:
            config.pop(name, None)
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
    free_blocks: dict[int, int] = field(default_factory=dict)
    """vLLM's free KV blocks once each step was scheduled, by step index, for the steps
    that recorded them (none before version 4)."""

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
    if isinstance(entry, ResetPrefixCache):
        return {
            "event": "reset_prefix_cache",
            "reset_running_requests": entry.reset_running_requests,
        }
    if isinstance(entry, SetPauseState):
        return {"event": "set_pause_state", "state": entry.state}
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

    def write(
        self,
        entry: Entry,
        settings: Mapping[str, Json] | None = None,
        *,
        num_free_blocks: int | None = None,
    ) -> None:
        """Append ``entry``; ``settings`` are an ``AddRequest``'s request-scope settings
        (written only when one differs from what the reference assumes),
        ``num_free_blocks`` a ``StepRecord``'s free KV blocks once it was scheduled."""
        if self._prefix_caching and isinstance(entry, AddRequest) and entry.block_hashes is None:
            # Token ids are never written: without its hashes a request's hits are lost.
            raise ValueError(
                f"request {entry.request_id!r}: a trace with prefix caching needs its block_hashes"
            )
        obj = entry_to_json(entry)
        if isinstance(entry, StepRecord):
            self._steps += 1
            self._last_step = entry.step
            if num_free_blocks is not None:
                obj["num_free_blocks"] = num_free_blocks
        elif num_free_blocks is not None:
            raise TypeError("only a step carries num_free_blocks")
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
    if not lines:
        raise TraceError(f"trace {name!r}: empty")
    header = _header(name, lines[0])
    read_line = line_adapter(header.version).validate_json
    entries: list[Entry] = []
    request_settings: dict[str, dict[str, Json]] = {}
    free_blocks: dict[int, int] = {}
    # Before version 3 a prefix-cached trace holds no hashes: read, but never replayed.
    hashed = header.enable_prefix_caching and header.version >= HASHES_FROM
    chain = _HashChain(name, header.config.hash_block_size, hashed, _hash_lookahead(header))
    steps = 0
    for lineno, text in enumerate(lines[1:], start=2):
        where = f"trace {name!r} line {lineno}"
        if not text.strip():
            raise TraceError(f"{where}: empty line")
        try:
            line = read_line(text)
        except ValidationError as err:
            field_path, message = first_error(err)
            # A key or a line kind a later version added: say which version was read.
            later = message == "unknown key" or field_path == "event"
            if later and header.version < VERSION:
                message += f" in a version-{header.version} trace"
            raise TraceError(f"{where}: {': '.join(filter(None, (field_path, message)))}") from None
        if isinstance(line, EndLine):
            if line.steps != steps:
                raise TraceError(f"{where}: end says {line.steps} steps, the trace holds {steps}")
            if lineno != len(lines):
                raise TraceError(f"trace {name!r}: lines after the end line")
            return Trace(name, header, tuple(entries), request_settings, free_blocks)
        entry = line.entry()
        if isinstance(entry, ModelOutput) and entry.step is not None and entry.step >= steps:
            raise TraceError(
                f"{where}: model_output.step: must name a step already recorded"
                f" (0..{steps - 1}), got {entry.step}"
            )
        chain.check(lineno, entry)
        steps += isinstance(entry, StepRecord)
        if isinstance(line, AddRequestLineV2) and line.settings is not None:
            request_settings[line.request_id] = line.settings.model_dump(exclude_unset=True)
        if isinstance(line, StepLine) and line.num_free_blocks is not None:
            free_blocks[line.step] = line.num_free_blocks
        entries.append(entry)
    raise TraceError(f"trace {name!r}: truncated: no end line after {len(lines)} lines")


def _header(name: str, text: str) -> TraceHeader:
    """The header line: its format and version say which schema reads the rest of it."""
    if not text.strip():
        raise TraceError(f"trace {name!r} line 1: empty line")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceError(f"trace {name!r} line 1: corrupt JSON: {err.msg}") from None
    found = obj.get("format") if isinstance(obj, dict) else None
    if found != FORMAT:
        raise TraceError(f"trace {name!r}: not a {FORMAT} file (format {found!r})")
    version = obj.get("version")
    known = VERSIONS.get(version) if type(version) is int else None
    if known is None:
        raise TraceError(
            f"trace {name!r}: {FORMAT} version {version!r}, this reads versions"
            f" {', '.join(map(str, READS[:-1]))} and {READS[-1]} only"
        )
    try:
        read = known.header.model_validate(obj)
    except ValidationError as err:
        raise TraceError(f"trace {name!r}: {': '.join(first_error(err, 'header'))}") from None
    config = read.config.engine_config()
    settings = assumed_settings()
    if isinstance(read, HeaderV1):
        # Version 1 kept these two as top-level flags and recorded no other setting.
        settings["enable_prefix_caching"] = read.enable_prefix_caching
        config = replace(config, async_scheduling=read.async_scheduling)
    else:
        settings.update(read.settings.model_dump())
    return TraceHeader(
        vllm_version=read.vllm_version,
        source=read.source,
        config=replace(config, **{name: settings[name] for name in SETTINGS_IN_CONFIG}),
        scheduler_class=read.scheduler_class,
        settings=settings,
        notes=dict(read.notes),
        version=version,
    )


def _hash_lookahead(header: TraceHeader) -> int:
    """The tokens past each block its hash covers in the vLLM that recorded the trace
    (0.33's lookahead hashes for EAGLE-style drafters: each hash made that much later);
    0 for a release without a record, which replay refuses by name."""
    release = release_of(header.vllm_version)
    if release is None or header.settings.get("disable_lookahead_block_hashes"):
        return 0
    spec = header.config.speculative_config
    return release.num_hash_lookahead_tokens(
        None if spec is None else spec.method, header.config.num_prefill_lookahead_tokens
    )


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
                f" full blocks of the hash block size {self._block_size} in its {tokens}"
                f" tokens so far{past}"
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
