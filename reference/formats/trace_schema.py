"""The trace format's schema: what each line of a ``dualbudget-trace`` may hold, by version.

One model per line kind and version: the header (the first line) and the event lines,
each of which turns into the event or step record it stands for (``reference/events.py``).
A later version extends the one before it. Their fields, defaults and descriptions are the
one home of the trace's keys: ``reference/formats/trace.py`` reads every line against them, and
docs/design.md §4.2-§4.3 renders its tables from them. The engine-scope and request-scope
``settings`` objects are made from ``reference/formats/settings.py``'s table, the one home of the
settings.
"""

from __future__ import annotations

import functools
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, Self, TypeAlias, get_args

from pydantic import Field, TypeAdapter, create_model, model_validator

from dualbudget.spec.config import EngineConfig

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
from .scenario import ConfigJson, PauseStateName
from .schemas import FieldError, Schema, dataclass_default, schema_heading, schema_table
from .settings import SETTINGS, SETTINGS_IN_CONFIG, Json, Setting

FORMAT = "dualbudget-trace"
Source = Literal["engine", "scheduler", "synthetic"]
SOURCES: tuple[str, ...] = get_args(Source)

Counts = dict[str, Annotated[int, Field(ge=0)]]
"""``{id: n}``."""
BlockHashes = list[Annotated[str, Field(pattern="^[0-9a-f]+$")]]
"""vLLM's block hashes as lowercase hex: opaque, only their equality matters."""


# -- the settings objects ------------------------------------------------------------------
def settings_schema(scope: str, version: int) -> type[Schema]:
    """The ``settings`` object of ``scope`` in a trace of ``version``, one key per setting
    of the table: the header's (``engine``) holds every engine-scope setting the version
    records, an ``add_request``'s (``request``) only the request-scope settings that differ
    from what the reference assumes. A header may lack an ``optional`` setting (written
    before the table gained it): absent, it reads as vLLM's default. A setting the engine
    config also holds takes the config's type."""
    config_types = typing.get_type_hints(EngineConfig)

    def default(setting: Setting) -> Json:
        if scope == "request":
            return None
        return setting.default if setting.optional else ...

    fields: dict[str, Any] = {
        s.name: (config_types.get(s.name, Json), Field(default=default(s)))
        for s in SETTINGS
        if s.scope == scope and s.recorded_since <= version
    }
    return create_model(f"{scope.title()}SettingsV{version}", __base__=Schema, **fields)


if TYPE_CHECKING:
    # Made from the settings table at run time; to a type checker, objects of a schema.
    EngineSettingsV2: TypeAlias = Schema
    EngineSettings: TypeAlias = Schema
    RequestSettings: TypeAlias = Schema
else:
    EngineSettingsV2 = settings_schema("engine", 2)
    EngineSettings = settings_schema("engine", 3)
    RequestSettings = settings_schema("request", 3)


# -- the header ----------------------------------------------------------------------------
class _Header(Schema):
    """What the header of every version holds."""

    format: str = Field(description=f'`"{FORMAT}"`')
    version: int = Field(
        description="the format version: `5` is written, `1` to `4` are read (a version-4"
        " trace is a version-5 one without `reset_prefix_cache` and `set_pause_state` lines,"
        " a version-3 one also without `num_free_blocks`)"
    )
    vllm_version: str = Field(description="the vLLM release that recorded it, e.g. `0.33.0`")
    source: Source = Field(
        description="`engine` (a whole engine), `scheduler` (vLLM's scheduler alone, driven"
        " by a workload) or `synthetic` (the reference's own run)"
    )
    scheduler_class: str = Field(default="", description="the recording scheduler's class")
    config: ConfigJson = Field(
        description="the engine config, as in a scenario (§4.1): `async_scheduling` in it"
        " when on, `enable_prefix_caching` and `prefix_cache_retention_interval` never"
        " (settings, below)"
    )
    notes: dict[str, Json] = Field(
        default_factory=dict, description="free-form facts about the recording"
    )


class HeaderV1(_Header):
    """The header of version 1: two flags, no settings."""

    async_scheduling: bool = Field(description="whether scheduling was async")
    enable_prefix_caching: bool = Field(description="whether prefix caching was on")


class HeaderV2(_Header):
    """The header, the first line: the recording vLLM, its engine config and every setting
    outside it that can change a decision."""

    settings: EngineSettingsV2 = Field(
        description="every engine-scope setting of `reference/formats/settings.py` the version"
        " records, by name (docs/traces.md); `enable_prefix_caching` is kept here"
    )

    @model_validator(mode="after")
    def _prefix_caching_is_a_setting(self) -> Self:
        for name in SETTINGS_IN_CONFIG:
            if name in self.config.model_fields_set:
                raise FieldError(f"config.{name}", "kept in header.settings from version 2 on")
        return self


class Header(HeaderV2):
    __doc__ = HeaderV2.__doc__

    settings: EngineSettings = Field(description=HeaderV2.model_fields["settings"].description)


# -- the event lines -----------------------------------------------------------------------
class AddRequestLineV1(Schema):
    """A request arrives (vLLM's ``add_request``)."""

    event: Literal["add_request"]
    request_id: str = Field(description="vLLM's request id")
    prompt_len: int = Field(ge=1, description="the prompt's tokens")
    max_tokens: int = Field(ge=1, description="the request's `max_tokens`")
    priority: int = Field(
        default=dataclass_default(AddRequest, "priority"), description="its scheduling priority"
    )
    arrival_time: float = Field(
        default=dataclass_default(AddRequest, "arrival_time"),
        description="vLLM's `arrival_time`; priority scheduling breaks ties on it",
    )

    def entry(self) -> Event:
        return AddRequest(
            self.request_id, self.prompt_len, self.max_tokens, self.priority, self.arrival_time
        )


class AddRequestLineV2(AddRequestLineV1):
    __doc__ = AddRequestLineV1.__doc__

    settings: RequestSettings | None = Field(
        default=None,
        description="the request-scope settings (docs/traces.md), only those that differ"
        " from what the reference assumes",
    )


class AddRequestLine(AddRequestLineV2):
    __doc__ = AddRequestLineV1.__doc__

    block_hashes: BlockHashes | None = Field(
        default=None,
        description="required with prefix caching on: vLLM's hashes of the prompt's full"
        " blocks as the request held them, lowercase hex",
    )

    def entry(self) -> Event:
        hashes = self.block_hashes
        return AddRequest(
            self.request_id,
            self.prompt_len,
            self.max_tokens,
            self.priority,
            self.arrival_time,
            block_hashes=None if hashes is None else tuple(hashes),
        )


class AbortLine(Schema):
    """A request is aborted (vLLM's ``finish_requests`` with ``FINISHED_ABORTED``)."""

    event: Literal["abort"]
    request_id: str = Field(description="the request's id")

    def entry(self) -> Event:
        return Abort(self.request_id)


class ResetPrefixCacheLine(Schema):
    """The engine resets the prefix cache (vLLM's ``reset_prefix_cache``), from version 5."""

    event: Literal["reset_prefix_cache"]
    reset_running_requests: bool = Field(
        default=dataclass_default(ResetPrefixCache, "reset_running_requests"),
        description="whether every running request was preempted first, its output in flight"
        " dropped (else the pool forgets its cached hashes only if no block is held)",
    )

    def entry(self) -> Event:
        return ResetPrefixCache(self.reset_running_requests)


class SetPauseStateLine(Schema):
    """The engine pauses or resumes scheduling (vLLM's ``set_pause_state``), from version 5."""

    event: Literal["set_pause_state"]
    state: PauseStateName = Field(
        description="vLLM's `PauseState`, lowercased: `paused_new` admits no waiting request,"
        " `paused_all` schedules nothing, `unpaused` resumes"
    )

    def entry(self) -> Event:
        return SetPauseState(self.state)


class StepLineV1(Schema):
    """A step record (``reference/events.py`` ``StepRecord``): one scheduling decision."""

    event: Literal["step"]
    step: int = Field(
        ge=0,
        description="the step's index, from 0, one per `ScheduleStep` (steps that"
        " schedule nothing count)",
    )
    num_scheduled_tokens: Counts = Field(
        description="`{id: q}`: target tokens scheduled per request, drafts to verify included"
    )
    scheduled_spec_tokens: Counts = Field(
        default_factory=dict,
        description="`{id: n}`: of those, the draft tokens scheduled for verification",
    )
    preempted: list[str] = Field(default_factory=list, description="the ids preempted in this step")
    finished: list[str] = Field(
        default_factory=list,
        description="the ids that finished since the previous step record (vLLM's"
        " `finished_req_ids`)",
    )
    target_tokens: int = Field(default=0, description="`T`, the target rows of the step")
    draft_rows: int = Field(
        default=0,
        description="`D = Σ C(q_i)`, the method's true draft rows, never a policy's charge",
    )
    budgets_left: dict[str, int] = Field(
        default_factory=dict,
        description="the policy's ledger at the end of the step: `token_budget`, `input_budget`",
    )

    def entry(self) -> StepRecord:
        return StepRecord(
            self.step,
            self.num_scheduled_tokens,
            self.scheduled_spec_tokens,
            self.preempted,
            self.finished,
            self.target_tokens,
            self.draft_rows,
            self.budgets_left,
        )


class StepLine(StepLineV1):
    """A step record, and the state of vLLM's KV pool once the step is scheduled."""

    num_free_blocks: int | None = Field(
        default=None,
        ge=0,
        description="vLLM's free KV blocks right after the step was scheduled"
        " (`BlockPool.get_num_free_blocks`); replay compares the reference's pool with it,"
        " so a block held or freed a step early shows where it happens, not only once the"
        " pool runs short",
    )


class ModelOutputLineV1(Schema):
    """The tokens sampled in the step just scheduled (version 1)."""

    event: Literal["model_output"]
    num_sampled: Counts = Field(
        description="`{id: n}`: tokens sampled per scheduled request (0 for a prefill chunk"
        " short of the prompt's end, else 1 plus the accepted drafts)"
    )

    def entry(self) -> Event:
        return ModelOutput(self.num_sampled)


class ModelOutputLineV2(ModelOutputLineV1):
    """The tokens a step sampled (vLLM's ``update_from_output``)."""

    step: int = Field(
        description="the step it answers, one already recorded: under async scheduling step"
        " n's output comes after step n+1's line"
    )
    stopped: Counts = Field(
        description="`{id: n}`: the requests vLLM stopped on EOS or a stop token"
        " (`FINISHED_STOPPED`) and the tokens each kept, `1 <= n <= num_sampled[id]`, the"
        " last the stop token"
    )

    @model_validator(mode="after")
    def _stops_within_the_sampled(self) -> Self:
        for rid, kept in self.stopped.items():
            sampled = self.num_sampled.get(rid, 0)
            if not 1 <= kept <= sampled:
                raise FieldError(
                    f"stopped.{rid}", f"must be in 1..num_sampled ({sampled}), got {kept}"
                )
        return self

    def entry(self) -> Event:
        return ModelOutput(self.num_sampled, self.stopped, self.step)


class ModelOutputLine(ModelOutputLineV2):
    __doc__ = ModelOutputLineV2.__doc__

    block_hashes: dict[str, BlockHashes] = Field(
        default_factory=dict,
        description="with prefix caching on: `{id: [hex, ...]}`, for every request that"
        " sampled, the hashes its `block_hashes` gained in that update",
    )

    def entry(self) -> Event:
        gained = {rid: tuple(hashes) for rid, hashes in self.block_hashes.items()}
        return ModelOutput(self.num_sampled, self.stopped, self.step, block_hashes=gained)


class DraftProposalsLine(Schema):
    """The drafts proposed for the next step (vLLM's ``update_draft_token_ids``)."""

    event: Literal["draft_proposals"]
    num_drafts: Counts = Field(description="`{id: n}`: drafts proposed per request")

    def entry(self) -> Event:
        return DraftProposals(self.num_drafts)


class EndLine(Schema):
    """The last line: a trace without it was cut short."""

    event: Literal["end"]
    steps: int = Field(description="how many step lines the trace holds")


AnyLine = (
    AddRequestLineV1
    | AbortLine
    | ResetPrefixCacheLine
    | SetPauseStateLine
    | StepLineV1
    | ModelOutputLineV1
    | DraftProposalsLine
    | EndLine
)
"""A line after the header, of any version (a later version's line extends the earlier)."""
LinesV1 = Annotated[
    AddRequestLineV1 | AbortLine | StepLineV1 | ModelOutputLineV1 | DraftProposalsLine | EndLine,
    Field(discriminator="event"),
]
LinesV2 = Annotated[
    AddRequestLineV2 | AbortLine | StepLineV1 | ModelOutputLineV2 | DraftProposalsLine | EndLine,
    Field(discriminator="event"),
]
LinesV3 = Annotated[
    AddRequestLine | AbortLine | StepLineV1 | ModelOutputLine | DraftProposalsLine | EndLine,
    Field(discriminator="event"),
]
LinesV4 = Annotated[
    AddRequestLine | AbortLine | StepLine | ModelOutputLine | DraftProposalsLine | EndLine,
    Field(discriminator="event"),
]
Lines = Annotated[
    AddRequestLine
    | AbortLine
    | ResetPrefixCacheLine
    | SetPauseStateLine
    | StepLine
    | ModelOutputLine
    | DraftProposalsLine
    | EndLine,
    Field(discriminator="event"),
]


class FormatVersion(NamedTuple):
    """One version of the format: its header and the lines after it."""

    header: type[HeaderV1] | type[HeaderV2]
    lines: Any
    """The union of its line models, told apart by ``event``."""


VERSIONS: dict[int, FormatVersion] = {
    1: FormatVersion(HeaderV1, LinesV1),
    2: FormatVersion(HeaderV2, LinesV2),
    3: FormatVersion(Header, LinesV3),
    4: FormatVersion(Header, LinesV4),
    5: FormatVersion(Header, Lines),
}
"""Every version read; the last is the one written."""


@functools.cache
def line_adapter(version: int) -> TypeAdapter[AnyLine]:
    """Reads one line after the header of a trace of ``version`` from its JSON text."""
    return TypeAdapter(VERSIONS[version].lines)


# -- the documentation ---------------------------------------------------------------------
def step_record_markdown() -> str:
    """The step record's table (docs/design.md §4.2 renders it)."""
    return schema_table(StepLineV1, skip=("event",))


def trace_markdown() -> str:
    """The table of the header and of each event line (of the step line, what it holds
    beyond the step record of §4.2), as the version written holds them (docs/design.md
    §4.3 renders them)."""
    parts = [f"{schema_heading(Header)}\n\n{schema_table(Header)}"]
    lines = (
        AddRequestLine,
        AbortLine,
        ResetPrefixCacheLine,
        SetPauseStateLine,
        StepLine,
        ModelOutputLine,
        DraftProposalsLine,
        EndLine,
    )
    for line in lines:
        (event,) = get_args(line.model_fields["event"].annotation)
        heading = f'`{{"event": "{event}"}}`: {schema_heading(line)}'
        # A step line is the step record (§4.2) and what the version adds to it.
        skip = ("event", *StepLineV1.model_fields) if line is StepLine else ("event",)
        if line is StepLine:
            heading += " The step record's keys (§4.2), and:"
        parts.append(f"{heading}\n\n{schema_table(line, skip=skip)}")
    return "\n".join(parts)
