"""The scenario format (``dualbudget-scenario``, version 1): its keys and its writer.

A scenario is what ``dualbudget schedule`` runs, what the proofs write as witnesses and
what the fuzzer writes on a divergence (docs/reference.md describes it). The reference
reads it (``reference/scenario.py`` checks every key named here) and writes it; the
proofs, which may not import the reference, write their witnesses with the same writer.
So the shape has this one home; the writer takes plain values and the spec's config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .config import EngineConfig

FORMAT = "dualbudget-scenario"
VERSION = 1

SCENARIO_REQUIRED = frozenset({"profile", "config", "requests"})
SCENARIO_OPTIONAL = frozenset({"format", "version", "acceptance", "drafts", "stops"})
CONFIG_INTS = (
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "block_size",
    "num_gpu_blocks",
)
"""The config's required keys, every one an integer."""
CONFIG_OPTIONAL = frozenset(
    {
        "enable_chunked_prefill",
        "long_prefill_token_threshold",
        "scheduling_policy",
        "max_num_scheduled_tokens",
        "speculative_config",
        "async_scheduling",
        "enable_prefix_caching",
    }
)
SPECULATIVE_REQUIRED = frozenset({"method", "num_speculative_tokens"})
SPECULATIVE_OPTIONAL = frozenset({"parallel_drafting", "dspark_layout"})
REQUEST_REQUIRED = frozenset({"id", "prompt_len", "max_tokens"})
REQUEST_OPTIONAL = frozenset({"arrival_step", "priority", "abort_step", "prompt_token_ids"})
ACCEPTANCE_KINDS = ("fixed", "per_position", "explicit")
"""Exactly one of these keys makes an ``acceptance`` object (``per_position`` with a
``seed``)."""
DRAFTS_KINDS = ("fixed", "explicit")


def config_to_json(config: EngineConfig) -> dict[str, Any]:
    """The ``config`` object, in vLLM's names: every key written, defaults included, but
    ``max_num_scheduled_tokens`` only when set, ``speculative_config``,
    ``async_scheduling`` and ``enable_prefix_caching`` only when on (so that every file
    written before they existed reads as before)."""
    out: dict[str, Any] = {name: getattr(config, name) for name in CONFIG_INTS}
    out.update(
        enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        scheduling_policy=config.scheduling_policy,
    )
    if config.max_num_scheduled_tokens is not None:
        out["max_num_scheduled_tokens"] = config.max_num_scheduled_tokens
    spec = config.speculative_config
    if spec is not None:
        speculative: dict[str, Any] = {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "parallel_drafting": spec.parallel_drafting,
        }
        if spec.dspark_layout is not None:
            speculative["dspark_layout"] = spec.dspark_layout
        out["speculative_config"] = speculative
    if config.async_scheduling:
        out["async_scheduling"] = True
    if config.enable_prefix_caching:
        out["enable_prefix_caching"] = True
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
) -> dict[str, Any]:
    """The whole scenario object; ``requests``, ``acceptance`` and ``drafts`` as their
    writers above make them; ``stops`` (natural stops: ``{step: {id: kept tokens}}``)
    only when there is one."""
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
    return out
