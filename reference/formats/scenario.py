"""The Scenario format (``dualbudget-scenario``, version 1): its schema, load, validate, write.

A scenario is what ``dualbudget schedule`` runs, what proofs write as witnesses and what
the fuzzer writes on a divergence. Its schema (``ScenarioJson`` and the models below it)
is the one home of the keys a scenario may hold, their defaults and what they mean
(docs/design.md §4.1 renders its tables from it); its writer lives in
``spec/scenario_format.py``, since the proofs write witnesses with it too. An unknown key
is an error (a typo must not become a silent default), and every error names the field it
is about.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dualbudget.spec.config import ConfigError, EngineConfig, SpeculativeConfig, check_engine_config
from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import UnknownProfile, profile_named
from dualbudget.spec.scenario_format import (
    FORMAT,
    VERSION,
    acceptance_json,
    drafts_json,
    request_json,
    scenario_json,
)

# Re-exported: the trace header and the simulator write the config alone.
from dualbudget.spec.scenario_format import config_to_json as config_to_json

from ..events import PAUSE_STATES
from ..kv.blocks import cdiv, usable_blocks
from .schemas import (
    FieldError,
    KVGroupJson,
    Schema,
    dataclass_default,
    first_error,
    schemas_markdown,
)


class ScenarioError(BadInput):
    """A scenario the reference cannot run; the message starts with the field."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path


@dataclass(frozen=True)
class RequestSpec:
    id: str
    prompt_len: int
    max_tokens: int
    arrival_step: int = 0
    priority: int = 0
    abort_step: int | None = None
    """Optional: the request is aborted before this step's schedule."""
    prompt_token_ids: tuple[int, ...] | None = None
    """Optional: the prompt's ids (``prompt_len`` of them), read only by the prefix cache;
    with ``enable_prefix_caching`` on, a request without them gets ids shared with no other
    request (``reference.token_ids.unique_prompt``)."""


@dataclass(frozen=True)
class Acceptance:
    """How many of the drafts scheduled for verification the target accepts.

    ``fixed``: ``min(N, drafts)``. ``per_position``: an accepted prefix, position ``j``
    accepted with probability ``p_j`` (0 past the list), drawn from a generator seeded by
    ``(seed, step, request id)`` so the draw does not depend on iteration order.
    ``explicit``: ``{step: {id: n}}``, ``min(n, drafts)``; absent entries accept 0.
    """

    fixed: int | None = 0
    per_position: tuple[float, ...] | None = None
    seed: int = 0
    explicit: Mapping[int, Mapping[str, int]] | None = None


@dataclass(frozen=True)
class Drafts:
    """How many drafts each decoding request proposes after a step. Absent from the
    scenario: ``K``. ``fixed``: N every step. ``explicit``: ``{step: {id: n}}``, absent 0."""

    fixed: int | None = None
    explicit: Mapping[int, Mapping[str, int]] | None = None


@dataclass(frozen=True)
class Scenario:
    profile: str
    config: EngineConfig
    requests: tuple[RequestSpec, ...]
    acceptance: Acceptance = field(default_factory=Acceptance)
    drafts: Drafts | None = None
    stops: Mapping[int, Mapping[str, int]] | None = None
    """Natural stops (EOS or a stop token): ``{step: {id: n}}``, the request stops at the
    n-th token it samples in that step (``ModelOutput.stopped``); absent, none stops."""
    resets: Mapping[int, bool] | None = None
    """``reset_prefix_cache`` before a step's schedule: ``{step: reset_running_requests}``."""
    pauses: Mapping[int, str] | None = None
    """``set_pause_state`` before a step's schedule: ``{step: state}`` (``PAUSE_STATES``)."""

    def with_profile(self, name: str) -> Scenario:
        """The same scenario under another profile, validated for it."""
        return validate(replace(self, profile=name))

    def to_json(self) -> dict[str, Any]:
        return scenario_to_json(self)


# -- the schema --------------------------------------------------------------------------
_engine = partial(dataclass_default, EngineConfig)
_speculative = partial(dataclass_default, SpeculativeConfig)
_request = partial(dataclass_default, RequestSpec)


def _step_key(value: str) -> str:
    if not value.isdigit():
        raise ValueError("step keys must be non-negative integers")
    return value


def _id_from_int(value: object) -> object:
    # A request id written as a JSON integer is read as its decimal string (never a bool).
    return str(value) if type(value) is int else value


StepKey = Annotated[str, AfterValidator(_step_key)]
RequestId = Annotated[str, BeforeValidator(_id_from_int)]
Probability = Annotated[float, Field(ge=0, le=1)]


def _pause_state(value: str) -> str:
    if value not in PAUSE_STATES:
        raise ValueError(f"must be one of {', '.join(PAUSE_STATES)}")
    return value


PauseStateName = Annotated[str, AfterValidator(_pause_state)]
StepTable = dict[StepKey, dict[str, Annotated[int, Field(ge=0)]]]
"""``{"<step>": {"<id>": n}}``."""


def _table(table: StepTable) -> dict[int, dict[str, int]]:
    return {int(step): dict(row) for step, row in table.items()}


class SpeculativeJson(Schema):
    """``config.speculative_config``: vLLM's speculative config, reduced to what decides
    budgets; absent, no speculative decoding."""

    method: str = Field(description="vLLM's drafter, a method of the method table (§1.2)")
    num_speculative_tokens: int = Field(description="`K`, `>= 1`")
    parallel_drafting: bool = Field(
        default=_speculative("parallel_drafting"),
        description="P-EAGLE's one-pass drafting; vLLM forces it on for DFlash and DSpark",
    )
    dspark_layout: str | None = Field(
        default=_speculative("dspark_layout"),
        description="for `dspark`: `anchor` (vLLM's default, `sample_from_anchor: true`)"
        " or `fill-in`",
    )

    def speculative_config(self) -> SpeculativeConfig:
        return SpeculativeConfig(**dict(self))


class ConfigJson(Schema):
    """``config``: the engine config, in vLLM's names and with vLLM's defaults
    (``spec/config.py`` ``EngineConfig``). Signs and ranges are vLLM's own checks
    (``check_engine_config``), made once the whole scenario is read."""

    max_num_batched_tokens: int = Field(description="`B`, the model runner's input buffer rows")
    max_num_seqs: int = Field(description="the most requests running at once")
    max_model_len: int = Field(description="the longest a request's tokens may grow")
    block_size: int = Field(description="tokens per KV block")
    num_gpu_blocks: int = Field(description="the KV pool's blocks, vLLM's null block included")
    enable_chunked_prefill: bool = Field(
        default=_engine("enable_chunked_prefill"), description="a prompt may be split across steps"
    )
    long_prefill_token_threshold: int = Field(
        default=_engine("long_prefill_token_threshold"),
        description="caps a prefill chunk once the prompt is longer (`0`: off)",
    )
    scheduling_policy: str = Field(
        default=_engine("scheduling_policy"), description="`fcfs` or `priority`"
    )
    max_num_scheduled_tokens: int | None = Field(
        default=_engine("max_num_scheduled_tokens"),
        description="the step's token cap; absent, `max_num_batched_tokens`",
    )
    speculative_config: SpeculativeJson | None = Field(
        default=_engine("speculative_config"), description="the drafter (below)"
    )
    async_scheduling: bool = Field(
        default=_engine("async_scheduling"),
        description="vLLM's `AsyncScheduler`: step n+1 is scheduled before step n's output"
        " is back; written only when `true`",
    )
    enable_prefix_caching: bool = Field(
        default=_engine("enable_prefix_caching"),
        description="vLLM's prefix caching (§6; vLLM's own default is on); written only when"
        " `true`",
    )
    kv_groups: list[KVGroupJson] = Field(
        default=_engine("kv_groups"),
        description="vLLM's KV cache groups (below); absent, one `full_attention` group of"
        " `block_size`",
    )
    prefix_cache_retention_interval: int | None = Field(
        default=_engine("prefix_cache_retention_interval"),
        description="which full blocks a sliding-window group caches with prefix caching:"
        " absent or `null` every block (vLLM's `KVCacheConfig` default), `0` only those a"
        " replay resumes at (the engine's default), `N` also one tail per `N` tokens",
    )
    mamba_prefill_checkpoint_blocks: int = Field(
        default=_engine("mamba_prefill_checkpoint_blocks"),
        description="the Mamba groups' prefill checkpoint blocks (align mode): absent or `0`"
        " none, the scheduler ends a prefill chunk at the prompt's reusable state; `1` the"
        " state is saved inside the chunk, in a reserved block",
    )
    num_nextn_predict_layers: int | None = Field(
        default=_engine("num_nextn_predict_layers"),
        description="for `mtp`: the drafter's modules; absent, one. With more than one"
        " and `K > 1` each reads one prompt token further past a prefill chunk",
    )

    def engine_config(self) -> EngineConfig:
        fields = dict(self)
        spec = self.speculative_config
        fields["speculative_config"] = None if spec is None else spec.speculative_config()
        fields["kv_groups"] = tuple(group.kv_group() for group in self.kv_groups)
        return EngineConfig(**fields)


class RequestJson(Schema):
    """``requests[i]``: one request. The ids it samples are not in the file: they follow
    from its id (``reference/token_ids.py``)."""

    id: RequestId = Field(description="a string (an integer is read as its decimal string), unique")
    prompt_len: int = Field(ge=1, description="`>= 1` and `< max_model_len`")
    max_tokens: int = Field(ge=1, description="`>= 1`")
    arrival_step: int = Field(
        default=_request("arrival_step"), ge=0, description="added before that step's schedule"
    )
    priority: int = Field(
        default=_request("priority"),
        description="lower is served first under `priority` scheduling",
    )
    abort_step: int | None = Field(
        default=_request("abort_step"),
        ge=0,
        description="aborted before that step's schedule; at least its `arrival_step`",
    )
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=_request("prompt_token_ids"),
        description="the prompt's ids, `prompt_len` integers `>= 0`, read only by the prefix"
        " cache; with `enable_prefix_caching` on, a request without them gets ids of its"
        " own, shared with no other request",
    )

    @model_validator(mode="after")
    def _ids_fit_the_prompt(self) -> Self:
        ids = self.prompt_token_ids
        if ids is not None and len(ids) != self.prompt_len:
            raise FieldError(
                "prompt_token_ids", f"has {len(ids)} ids, but prompt_len is {self.prompt_len}"
            )
        return self

    def request(self) -> RequestSpec:
        ids = self.prompt_token_ids
        return RequestSpec(
            **{**dict(self), "prompt_token_ids": None if ids is None else tuple(ids)}
        )


class AcceptanceJson(Schema):
    """``acceptance``: exactly one of ``fixed``, ``per_position`` (with ``seed``) and
    ``explicit``. Only real drafts are accepted, never the placeholders a padded decode
    verifies."""

    fixed: int | None = Field(
        default=None, ge=0, description="`N`: a request accepts `min(N, drafts)`"
    )
    per_position: list[Probability] | None = Field(
        default=None,
        min_length=1,
        description="`[p_1, ...]`: an accepted prefix, position `j` accepted with probability"
        " `p_j` once `j - 1` was, `0` past the list",
    )
    seed: int | None = Field(
        default=None,
        description="with `per_position`: the draws come from a generator seeded by it, the"
        " step and the request id, so they do not depend on iteration order",
    )
    explicit: StepTable | None = Field(
        default=None,
        description='`{"<step>": {"<id>": n}}`: `min(n, drafts)`, absent entries `0`',
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        kinds = [self.fixed, self.per_position, self.explicit]
        if sum(kind is not None for kind in kinds) != 1:
            raise ValueError("must have exactly one of 'fixed', 'per_position', 'explicit'")
        if self.per_position is not None and self.seed is None:
            raise FieldError("seed", "missing")
        if self.per_position is None and self.seed is not None:
            raise FieldError("seed", "only with per_position")
        return self

    def acceptance(self) -> Acceptance:
        if self.per_position is not None:
            return Acceptance(None, tuple(self.per_position), self.seed or 0)
        if self.explicit is not None:
            return Acceptance(None, explicit=_table(self.explicit))
        return Acceptance(self.fixed)


class DraftsJson(Schema):
    """``drafts``: exactly one of ``fixed`` and ``explicit``; it needs a
    ``speculative_config``."""

    fixed: int | None = Field(default=None, ge=0, description="`N <= K` drafts every step")
    explicit: StepTable | None = Field(
        default=None,
        description='`{"<step>": {"<id>": n}}`: `n <= K` proposed after that step, absent'
        " entries `0`",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.fixed is None) == (self.explicit is None):
            raise ValueError("must have exactly one of 'fixed', 'explicit'")
        return self

    def drafts(self) -> Drafts:
        if self.explicit is not None:
            return Drafts(explicit=_table(self.explicit))
        return Drafts(fixed=self.fixed)


class ScenarioJson(Schema):
    """A scenario: one JSON object."""

    format: str = Field(default=FORMAT, description=f'`"{FORMAT}"`; when present it must be that')
    version: int = Field(default=VERSION, description=f"`{VERSION}`; when present it must be that")
    profile: str = Field(
        description="a profile name (§1.3); `--profile` on the command line overrides it"
    )
    config: ConfigJson = Field(description="the engine config, in vLLM's names (below)")
    requests: list[RequestJson] = Field(
        min_length=1, description="a non-empty list of requests (below)"
    )
    acceptance: AcceptanceJson = Field(
        default=AcceptanceJson(fixed=dataclass_default(Acceptance, "fixed")),
        description="how many verified drafts are accepted (below)",
    )
    drafts: DraftsJson | None = Field(
        default=None,
        description="how many drafts each decoding request proposes; absent, `K` each step",
    )
    stops: dict[StepKey, dict[str, Annotated[int, Field(ge=1)]]] | None = Field(
        default=None,
        description='natural stops (EOS or a stop token), `{"<step>": {"<id>": n}}`: the'
        " request stops at the n-th token it samples in that step (`n >= 1`, at most what it"
        " sampled); absent, none",
    )
    resets: dict[StepKey, bool] | None = Field(
        default=None,
        description="the engine's `reset_prefix_cache` before a step's schedule, `{\"<step>\":"
        " reset_running_requests}` (true: every running request is preempted first, its"
        " output in flight dropped); absent, none",
    )
    pauses: dict[StepKey, PauseStateName] | None = Field(
        default=None,
        description="the engine's `set_pause_state` before a step's schedule, `{\"<step>\":"
        " state}`: `paused_new` admits no waiting request, `paused_all` schedules nothing,"
        " `unpaused` resumes; absent, none",
    )

    @field_validator("format", "version")
    @classmethod
    def _this_format(cls, value: object, info: ValidationInfo) -> object:
        expected = {"format": FORMAT, "version": VERSION}[info.field_name or ""]
        if value != expected:
            raise ValueError(f"must be {expected!r}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _tables_name_its_requests(self) -> Self:
        ids: set[str] = set()
        for i, request in enumerate(self.requests):
            if request.id in ids:
                raise FieldError(f"requests[{i}].id", f"duplicate request id {request.id!r}")
            ids.add(request.id)
        spec = self.config.speculative_config
        k = 0 if spec is None else spec.num_speculative_tokens
        if self.drafts is not None:
            if spec is None:
                raise FieldError("drafts", "drafts need config.speculative_config")
            if self.drafts.fixed is not None and self.drafts.fixed > k:
                raise FieldError("drafts.fixed", f"must be <= K={k}, got {self.drafts.fixed}")
        tables = (
            ("acceptance.explicit", self.acceptance.explicit, None),
            ("drafts.explicit", self.drafts and self.drafts.explicit, k),
            ("stops", self.stops, None),
        )
        for where, table, most in tables:
            for step, row in (table or {}).items():
                for rid, n in row.items():
                    if rid not in ids:
                        raise FieldError(f"{where}.{step}.{rid}", "no request has this id")
                    if most is not None and n > most:
                        raise FieldError(f"{where}.{step}.{rid}", f"must be <= K={most}")
        return self

    def scenario(self) -> Scenario:
        return Scenario(
            self.profile,
            self.config.engine_config(),
            tuple(request.request() for request in self.requests),
            self.acceptance.acceptance(),
            None if self.drafts is None else self.drafts.drafts(),
            None if self.stops is None else _table(self.stops),
            None if self.resets is None else {int(s): v for s, v in self.resets.items()},
            None if self.pauses is None else {int(s): v for s, v in self.pauses.items()},
        )


def scenario_markdown() -> str:
    """The scenario's tables, one per object (docs/design.md §4.1 renders them)."""
    models = (
        ScenarioJson,
        ConfigJson,
        SpeculativeJson,
        KVGroupJson,
        RequestJson,
        AcceptanceJson,
        DraftsJson,
    )
    return schemas_markdown(models)


# -- reading ---------------------------------------------------------------------------
def load_scenario(path: str | Path) -> Scenario:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise BadInput(f"scenario {str(path)!r}: cannot read: {err.strerror}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput(
            f"scenario {str(path)!r}: malformed JSON at line {err.lineno} column {err.colno}:"
            f" {err.msg}"
        ) from None
    return parse_scenario(obj)


def parse_scenario(obj: object) -> Scenario:
    try:
        scenario = ScenarioJson.model_validate(obj).scenario()
    except ValidationError as err:
        raise ScenarioError(*first_error(err, root="scenario")) from None
    return validate(scenario)


def parse_config(value: object) -> EngineConfig:
    """Read a ``config`` object (vLLM's names), checking keys and types."""
    try:
        return ConfigJson.model_validate(value).engine_config()
    except ValidationError as err:
        raise ScenarioError(*first_error(err, prefix="config")) from None


def validate(scenario: Scenario) -> Scenario:
    """The checks that need the whole scenario: the profile, vLLM's config checks, the
    profile's admission rules, the KV pool, and each prompt against max_model_len."""
    try:
        profile = profile_named(scenario.profile)
    except UnknownProfile as err:
        raise ScenarioError("profile", str(err)) from None
    config = scenario.config
    try:
        check_engine_config(config)
    except ConfigError as err:
        raise ScenarioError(f"config.{err.field}", err.message) from None
    try:
        profile.policy.validate(config)
    except ConfigError as err:
        raise ScenarioError(
            f"config.{err.field}", f"refused under profile {profile.name}: {err.message}"
        ) from None
    # vLLM's check_enough_kv_cache_memory: the pool, less the null block, must hold one
    # request of max_model_len tokens; without it a lone request can never finish.
    needed = cdiv(config.max_model_len, config.block_size)
    if usable_blocks(config.num_gpu_blocks) < needed:
        raise ScenarioError(
            "config.num_gpu_blocks",
            f"{config.num_gpu_blocks} blocks (one is vLLM's null block) cannot hold one"
            f" request of max_model_len={config.max_model_len} tokens ({needed} blocks of"
            f" {config.block_size})",
        )
    for i, request in enumerate(scenario.requests):
        if request.abort_step is not None and request.abort_step < request.arrival_step:
            raise ScenarioError(
                f"requests[{i}].abort_step",
                f"{request.abort_step} is before the request's arrival_step {request.arrival_step}",
            )
        if request.prompt_len >= config.max_model_len:
            raise ScenarioError(
                f"requests[{i}].prompt_len",
                f"{request.prompt_len} leaves no room for an output token within"
                f" max_model_len={config.max_model_len} (vLLM refuses prompt_len >="
                " max_model_len)",
            )
    return scenario


# -- writing ---------------------------------------------------------------------------
def scenario_to_json(scenario: Scenario) -> dict[str, Any]:
    """The JSON object ``parse_scenario`` reads back into an equal scenario."""
    a, d = scenario.acceptance, scenario.drafts
    return scenario_json(
        scenario.profile,
        scenario.config,
        [
            request_json(
                r.id,
                r.prompt_len,
                r.max_tokens,
                r.arrival_step,
                r.priority,
                r.abort_step,
                r.prompt_token_ids,
            )
            for r in scenario.requests
        ],
        acceptance_json(a.fixed, a.per_position, a.seed, a.explicit),
        None if d is None else drafts_json(d.fixed, d.explicit),
        scenario.stops,
        scenario.resets,
        scenario.pauses,
    )


def dump_scenario(scenario: Scenario, path: str | Path) -> None:
    Path(path).write_text(json.dumps(scenario_to_json(scenario), indent=2) + "\n")
