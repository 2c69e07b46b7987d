"""The scenario format (``dualbudget-scenario``, version 1): its name, version and writer.

A scenario is what ``dualbudget schedule`` runs, what the proofs write as witnesses and
what the fuzzer writes on a divergence (docs/design.md §4.1 describes it). The reference
reads it against its schema (``reference/formats/scenario.py``, the home of every key) and writes
it with this writer, which the proofs, which may not import the reference, use for their
witnesses too; it takes plain values and the spec's config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields
from typing import Any

from .config import EngineConfig, KVGroup, SpeculativeConfig

FORMAT = "dualbudget-scenario"
VERSION = 1


def config_to_json(config: EngineConfig) -> dict[str, Any]:
    """The ``config`` object, in vLLM's names: every field of ``EngineConfig`` in its order,
    defaults included, but one whose default is None or False only when set (so that every
    file written before ``max_num_scheduled_tokens``, ``async_scheduling`` and
    ``enable_prefix_caching`` existed reads as before)."""
    out: dict[str, Any] = {}
    for item in fields(config):
        value = getattr(config, item.name)
        if (item.default is None or item.default is False) and value is item.default:
            continue
        if item.name == "kv_groups":
            if value:
                out[item.name] = [kv_group_to_json(group) for group in value]
            continue
        out[item.name] = speculative_to_json(value) if item.name == "speculative_config" else value
    return out


def kv_group_to_json(group: KVGroup) -> dict[str, Any]:
    """One KV group: its kind and block size, every other field only when set."""
    out: dict[str, Any] = {}
    for item in fields(group):
        value = getattr(group, item.name)
        if item.default is MISSING or value != item.default:
            out[item.name] = value
    return out


def speculative_to_json(spec: SpeculativeConfig) -> dict[str, Any]:
    """The ``speculative_config`` object; ``dspark_layout`` only when set."""
    out: dict[str, Any] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "parallel_drafting": spec.parallel_drafting,
    }
    if spec.dspark_layout is not None:
        out["dspark_layout"] = spec.dspark_layout
    return out


def request_json(
    request_id: str,
    prompt_len: int,
    max_tokens: int,
    arrival_step: int = 0,
    priority: int = 0,
    abort_step: int | None = None,
    prompt_token_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """One request; ``prompt_token_ids`` (its prompt's ids, for prefix caching) only when
    it has them."""
    out: dict[str, Any] = {
        "id": request_id,
        "prompt_len": prompt_len,
        "max_tokens": max_tokens,
        "arrival_step": arrival_step,
        "priority": priority,
    }
    if abort_step is not None:
        out["abort_step"] = abort_step
    if prompt_token_ids is not None:
        out["prompt_token_ids"] = list(prompt_token_ids)
    return out


def table_json(table: Mapping[int, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """A ``{step: {request id: n}}`` table, steps as JSON keys in order."""
    return {str(step): dict(row) for step, row in sorted(table.items())}


def acceptance_json(
    fixed: int | None = 0,
    per_position: Sequence[float] | None = None,
    seed: int = 0,
    explicit: Mapping[int, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    if per_position is not None:
        return {"per_position": list(per_position), "seed": seed}
    if explicit is not None:
        return {"explicit": table_json(explicit)}
    return {"fixed": fixed}


def drafts_json(
    fixed: int | None = None, explicit: Mapping[int, Mapping[str, int]] | None = None
) -> dict[str, Any]:
    return {"fixed": fixed} if fixed is not None else {"explicit": table_json(explicit or {})}


def scenario_json(
    profile: str,
    config: EngineConfig,
    requests: Sequence[Mapping[str, Any]],
    acceptance: Mapping[str, Any],
    drafts: Mapping[str, Any] | None = None,
    stops: Mapping[int, Mapping[str, int]] | None = None,
    resets: Mapping[int, bool] | None = None,
    pauses: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """The whole scenario object; ``requests``, ``acceptance`` and ``drafts`` as their
    writers above make them; ``stops`` (natural stops: ``{step: {id: kept tokens}}``)
    only when there is one; ``resets`` (``{step: reset_running_requests}``) and ``pauses``
    (``{step: pause state}``), the engine's calls before a step's schedule, likewise."""
    out: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "profile": profile,
        "config": config_to_json(config),
        "requests": [dict(request) for request in requests],
        "acceptance": dict(acceptance),
    }
    if drafts is not None:
        out["drafts"] = dict(drafts)
    if stops:
        out["stops"] = table_json(stops)
    if resets:
        out["resets"] = {str(step): value for step, value in sorted(resets.items())}
    if pauses:
        out["pauses"] = {str(step): value for step, value in sorted(pauses.items())}
    return out
