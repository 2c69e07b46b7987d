"""The Scenario format (``dualbudget-scenario``, version 1): load, validate, write.

A scenario is what ``dualbudget schedule`` runs, what proofs write as witnesses and what
the fuzzer writes on a divergence. See docs/reference.md for the format; its keys and its
writer live in ``spec/scenario_format.py`` (the proofs write witnesses with it too). Every
key is checked: an unknown key is an error (a typo must not become a silent default), and
every error names the field it is about.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Set
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dualbudget.spec.config import ConfigError, EngineConfig, SpeculativeConfig, check_engine_config
from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import UnknownProfile, profile_named
from dualbudget.spec.scenario_format import (
    ACCEPTANCE_KINDS,
    FORMAT,
    REQUEST_OPTIONAL,
    REQUEST_REQUIRED,
    SCENARIO_OPTIONAL,
    SCENARIO_REQUIRED,
    SPECULATIVE_OPTIONAL,
    SPECULATIVE_REQUIRED,
    VERSION,
    acceptance_json,
    drafts_json,
    request_json,
    scenario_json,
)

# Re-exported: the trace header and the simulator read and write the config alone.
from dualbudget.spec.scenario_format import CONFIG_INTS as CONFIG_INTS
from dualbudget.spec.scenario_format import CONFIG_OPTIONAL as CONFIG_OPTIONAL
from dualbudget.spec.scenario_format import config_to_json as config_to_json

from .kv import cdiv, usable_blocks


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

    def with_profile(self, name: str) -> Scenario:
        """The same scenario under another profile, validated for it."""
        return validate(replace(self, profile=name))

    def to_json(self) -> dict[str, Any]:
        return scenario_to_json(self)


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
    top = _object(obj, "scenario")
    _keys(top, "scenario", SCENARIO_REQUIRED, SCENARIO_OPTIONAL)
    if "format" in top and top["format"] != FORMAT:
        raise ScenarioError("format", f"expected {FORMAT!r}, got {top['format']!r}")
    if "version" in top and top["version"] != VERSION:
        raise ScenarioError("version", f"unsupported version {top['version']!r} (known: 1)")
    profile = top.get("profile")
    if not isinstance(profile, str):
        raise ScenarioError("profile", f"must be a profile name, got {profile!r}")
    config = _config(top.get("config"))
    requests = _requests(top.get("requests"))
    ids = {r.id for r in requests}
    k = config.num_speculative_tokens
    scenario = Scenario(
        profile,
        config,
        requests,
        _acceptance(top.get("acceptance", {"fixed": 0}), ids),
        _drafts(top["drafts"], ids, k) if "drafts" in top else None,
        _stops(top["stops"], ids) if "stops" in top else None,
    )
    return validate(scenario)


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


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(where, f"must be a JSON object, got {type(value).__name__}")
    return value


def _keys(obj: Mapping[str, Any], where: str, required: Set[str], optional: Set[str]) -> None:
    unknown = sorted(set(obj) - required - optional)
    if unknown:
        raise ScenarioError(
            f"{where}.{unknown[0]}" if where != "scenario" else unknown[0],
            f"unknown key (known: {', '.join(sorted(required | optional))})",
        )
    missing = sorted(required - set(obj))
    if missing:
        raise ScenarioError(
            f"{where}.{missing[0]}" if where != "scenario" else missing[0], "missing"
        )


def _int(value: object, where: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(where, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ScenarioError(where, f"must be >= {minimum}, got {value}")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(where, f"must be true or false, got {value!r}")
    return value


def _config(value: object) -> EngineConfig:
    obj = _object(value, "config")
    _keys(obj, "config", set(CONFIG_INTS), CONFIG_OPTIONAL)
    # Sign and range checks are vLLM's (check_engine_config); here only the types.
    ints = [_int(obj[name], f"config.{name}") for name in CONFIG_INTS]
    cap = obj.get("max_num_scheduled_tokens")
    policy = obj.get("scheduling_policy", "fcfs")
    if not isinstance(policy, str):
        raise ScenarioError("config.scheduling_policy", f"must be a string, got {policy!r}")
    return EngineConfig(
        max_num_batched_tokens=ints[0],
        max_num_seqs=ints[1],
        max_model_len=ints[2],
        block_size=ints[3],
        num_gpu_blocks=ints[4],
        enable_chunked_prefill=_bool(
            obj.get("enable_chunked_prefill", True), "config.enable_chunked_prefill"
        ),
        long_prefill_token_threshold=_int(
            obj.get("long_prefill_token_threshold", 0), "config.long_prefill_token_threshold"
        ),
        scheduling_policy=policy,
        max_num_scheduled_tokens=None
        if cap is None
        else _int(cap, "config.max_num_scheduled_tokens"),
        speculative_config=_speculative(obj.get("speculative_config")),
        async_scheduling=_bool(obj.get("async_scheduling", False), "config.async_scheduling"),
        enable_prefix_caching=_bool(
            obj.get("enable_prefix_caching", False), "config.enable_prefix_caching"
        ),
    )


def _speculative(value: object) -> SpeculativeConfig | None:
    if value is None:
        return None
    where = "config.speculative_config"
    obj = _object(value, where)
    _keys(obj, where, SPECULATIVE_REQUIRED, SPECULATIVE_OPTIONAL)
    method = obj["method"]
    if not isinstance(method, str):
        raise ScenarioError(f"{where}.method", f"must be a string, got {method!r}")
    layout = obj.get("dspark_layout")
    if layout is not None and not isinstance(layout, str):
        raise ScenarioError(f"{where}.dspark_layout", f"must be a string, got {layout!r}")
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=_int(
            obj["num_speculative_tokens"], f"{where}.num_speculative_tokens"
        ),
        parallel_drafting=_bool(obj.get("parallel_drafting", False), f"{where}.parallel_drafting"),
        dspark_layout=layout,
    )


def _requests(value: object) -> tuple[RequestSpec, ...]:
    if not isinstance(value, list) or not value:
        raise ScenarioError("requests", "must be a non-empty list of requests")
    requests: list[RequestSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"requests[{i}]"
        obj = _object(item, where)
        _keys(obj, where, REQUEST_REQUIRED, REQUEST_OPTIONAL)
        rid = obj["id"]
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise ScenarioError(f"{where}.id", f"must be a string, got {rid!r}")
        rid = str(rid)
        if rid in seen:
            raise ScenarioError(f"{where}.id", f"duplicate request id {rid!r}")
        seen.add(rid)
        abort = obj.get("abort_step")
        prompt_len = _int(obj["prompt_len"], f"{where}.prompt_len", minimum=1)
        requests.append(
            RequestSpec(
                id=rid,
                prompt_len=prompt_len,
                max_tokens=_int(obj["max_tokens"], f"{where}.max_tokens", minimum=1),
                arrival_step=_int(obj.get("arrival_step", 0), f"{where}.arrival_step", minimum=0),
                priority=_int(obj.get("priority", 0), f"{where}.priority"),
                abort_step=None if abort is None else _int(abort, f"{where}.abort_step", minimum=0),
                prompt_token_ids=_token_ids(obj, where, prompt_len),
            )
        )
    return tuple(requests)


def _token_ids(obj: Mapping[str, Any], where: str, prompt_len: int) -> tuple[int, ...] | None:
    if "prompt_token_ids" not in obj:
        return None
    where = f"{where}.prompt_token_ids"
    ids = obj["prompt_token_ids"]
    if not isinstance(ids, list):
        raise ScenarioError(where, f"must be a list of token ids, got {type(ids).__name__}")
    if len(ids) != prompt_len:
        raise ScenarioError(where, f"has {len(ids)} ids, but prompt_len is {prompt_len}")
    return tuple(_int(token, f"{where}[{j}]", minimum=0) for j, token in enumerate(ids))


def _per_step(
    value: object, where: str, ids: set[str], maximum: int | None
) -> dict[int, dict[str, int]]:
    obj = _object(value, where)
    table: dict[int, dict[str, int]] = {}
    for step_key, counts in obj.items():
        if not (isinstance(step_key, str) and step_key.isdigit()):
            raise ScenarioError(f"{where}.{step_key}", "step keys must be non-negative integers")
        row = _object(counts, f"{where}.{step_key}")
        table[int(step_key)] = {}
        for rid, n in row.items():
            if rid not in ids:
                raise ScenarioError(f"{where}.{step_key}.{rid}", "no request has this id")
            n = _int(n, f"{where}.{step_key}.{rid}", minimum=0)
            if maximum is not None and n > maximum:
                raise ScenarioError(f"{where}.{step_key}.{rid}", f"must be <= K={maximum}")
            table[int(step_key)][rid] = n
    return table


def _acceptance(value: object, ids: set[str]) -> Acceptance:
    obj = _object(value, "acceptance")
    kinds = [kind for kind in ACCEPTANCE_KINDS if kind in obj]
    if len(kinds) != 1:
        raise ScenarioError(
            "acceptance", "must have exactly one of 'fixed', 'per_position', 'explicit'"
        )
    kind = kinds[0]
    if kind == "fixed":
        _keys(obj, "acceptance", {"fixed"}, set())
        return Acceptance(fixed=_int(obj["fixed"], "acceptance.fixed", minimum=0))
    if kind == "explicit":
        _keys(obj, "acceptance", {"explicit"}, set())
        return Acceptance(
            fixed=None, explicit=_per_step(obj["explicit"], "acceptance.explicit", ids, None)
        )
    _keys(obj, "acceptance", {"per_position", "seed"}, set())
    probs = obj["per_position"]
    if not isinstance(probs, list) or not probs:
        raise ScenarioError("acceptance.per_position", "must be a non-empty list of probabilities")
    checked: list[float] = []
    for j, prob in enumerate(probs):
        ok = isinstance(prob, (int, float)) and not isinstance(prob, bool)
        if not ok or not math.isfinite(prob) or not 0 <= prob <= 1:
            raise ScenarioError(f"acceptance.per_position[{j}]", f"must be in [0, 1], got {prob!r}")
        checked.append(float(prob))
    return Acceptance(
        fixed=None, per_position=tuple(checked), seed=_int(obj["seed"], "acceptance.seed")
    )


def _drafts(value: object, ids: set[str], k: int) -> Drafts:
    obj = _object(value, "drafts")
    if k == 0:
        raise ScenarioError("drafts", "drafts need config.speculative_config")
    if "fixed" in obj:
        _keys(obj, "drafts", {"fixed"}, set())
        n = _int(obj["fixed"], "drafts.fixed", minimum=0)
        if n > k:
            raise ScenarioError("drafts.fixed", f"must be <= K={k}, got {n}")
        return Drafts(fixed=n)
    _keys(obj, "drafts", {"explicit"}, set())
    return Drafts(explicit=_per_step(obj["explicit"], "drafts.explicit", ids, k))


def _stops(value: object, ids: set[str]) -> dict[int, dict[str, int]]:
    table = _per_step(value, "stops", ids, None)
    for step, row in table.items():
        for rid, n in row.items():
            if n < 1:
                raise ScenarioError(f"stops.{step}.{rid}", f"must be >= 1, got {n}")
    return table


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
    )


def dump_scenario(scenario: Scenario, path: str | Path) -> None:
    Path(path).write_text(json.dumps(scenario_to_json(scenario), indent=2) + "\n")


# -- the config alone (traces carry it in their header) ---------------------------------
def parse_config(value: object) -> EngineConfig:
    """Read a ``config`` object (vLLM's names), checking keys and types."""
    return _config(value)
