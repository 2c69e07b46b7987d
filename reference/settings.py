"""The vLLM settings outside the engine config that can change a scheduling decision: one
table of each one's vLLM default and whether the reference models it.

The trace recorder writes every engine-scope setting into a trace header (and a
request-scope one on the request's ``add_request`` line); replay refuses a trace that holds
a value the reference does not replay, naming the setting. The reference replays an
unmodelled setting only at the value it assumes, vLLM's default. Prefix caching is modelled
(every value replays) and stays in the header's settings, where version 2 put it; the
reader copies it into the engine config, which the reference runs on (``reference/trace.py``).
What the engine config carries otherwise (``async_scheduling``,
``long_prefill_token_threshold``, ``scheduling_policy``, the budgets) is modelled and
travels in the trace's ``config``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dualbudget.spec.config import EngineConfig
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import Profile

Json = Any
"""A JSON value: a setting as the trace holds it."""


@dataclass(frozen=True)
class Setting:
    name: str
    """vLLM's name (``kv_cache_groups``: the spec class of each KV cache group)."""
    home: str
    """Where vLLM keeps it."""
    default: Json
    """vLLM's default."""
    modelled: bool
    """The reference replays every value of it."""
    assumed: Json
    """The value the reference replays when it does not model the setting."""
    changes: str
    """What it changes in vLLM's scheduler."""
    scope: str = "engine"
    """``engine`` (the trace header's ``settings``) or ``request`` (on ``add_request``)."""
    also_replays: Callable[[Json, EngineConfig, Profile], bool] | None = None
    """Other values the reference replays, as a function of the config and profile."""
    also: str = ""
    """Those other values, in words (for the docs)."""
    recorded_since: int = 2
    """The first trace format version that records it; a trace of an older version is read
    with it at ``assumed``."""

    def replays(self, value: Json, config: EngineConfig, profile: Profile) -> bool:
        if self.modelled or value == self.assumed:
            return True
        return self.also_replays is not None and self.also_replays(value, config, profile)


def _profile_active_cap(value: Json, config: EngineConfig, profile: Profile) -> bool:
    # vLLM 0.33 writes its own DFlash/DSpark admission cap into max_num_active_seqs; the
    # profile derives the same cap, so a value equal to it is no user setting.
    return bool(value == profile.policy.max_active_requests(StepParams.of(config)))


def _single_mtp_module(value: Json, config: EngineConfig, profile: Profile) -> bool:
    # vLLM's use_multi_module_mtp: more than one module read ahead only when
    # min(num_nextn_predict_layers, K) > 1.
    return isinstance(value, int) and min(value, config.num_speculative_tokens) <= 1


def _no_prefix_caching(value: Json, config: EngineConfig, profile: Profile) -> bool:
    # Without prefix caching there is no hit to skip.
    return not config.enable_prefix_caching


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "enable_prefix_caching", "cache_config", True, True, False,
        "admitted requests start at their cached prefix",
    ),
    Setting(
        "max_num_active_seqs", "scheduler_config", None, False, None,
        "caps the running requests below max_num_seqs",
        also_replays=_profile_active_cap, also="or the profile's own admission cap",
    ),
    Setting(
        "watermark", "scheduler_config", 0.0, False, 0.0,
        "KV blocks kept free at admission",
    ),
    Setting(
        "scheduler_reserve_full_isl", "scheduler_config", True, False, True,
        "admission checks KV room for the whole prompt",
    ),
    Setting(
        "long_prefill_token_threshold_adaptive", "scheduler_config", False, False, False,
        "the long-prefill chunk cap follows the load",
    ),
    Setting(
        "prefill_schedule_interval", "scheduler_config", 1, False, 1,
        "steps between prefill admissions (0.33 on one engine; 0.32 data-parallel only)",
    ),
    Setting(
        "num_speculative_tokens_per_batch_size", "speculative_config", None, False, None,
        "K varies with the batch size (dynamic speculative decoding)",
    ),
    Setting(
        "num_nextn_predict_layers", "speculative_config.draft_model_config.hf_config",
        None, False, None,
        "multi-module MTP ends no prefill chunk within K of the prompt's end",
        also_replays=_single_mtp_module, also="or any value when K = 1 or it is 1",
    ),
    Setting(
        "disable_eagle_block_drop", "speculative_config", False, False, False,
        "an EAGLE-family prefix-cache hit keeps its last block",
        recorded_since=3,
    ),
    Setting(
        "disable_lookahead_block_hashes", "speculative_config", False, False, False,
        "0.33's EAGLE-family block hashes stop covering the token after each block",
        recorded_since=3,
    ),
    Setting(
        "kv_cache_groups", "kv_cache_config", ["FullAttentionSpec"], False,
        ["FullAttentionSpec"],
        "sliding-window, Mamba or hybrid groups allocate KV blocks otherwise",
    ),
    Setting(
        "enable_lora", "lora_config", False, False, False,
        "max_loras caps the distinct adapters of a step",
    ),
    Setting(
        "structured_outputs", "a request's structured_output_request", False, False, False,
        "drafts are cut to what the grammar accepts; a request waits for its grammar",
        scope="request",
    ),
    Setting(
        "skip_reading_prefix_cache", "a request's sampling_params", False, False, False,
        "the request takes no prefix-cache hit (vLLM sets it for prompt logprobs)",
        scope="request",
        also_replays=_no_prefix_caching, also="or any value with prefix caching off",
    ),
)  # fmt: skip
"""Every setting outside the engine config that can change a decision."""

SETTING_NAMES = tuple(setting.name for setting in SETTINGS)
ENGINE_SETTINGS = tuple(s.name for s in SETTINGS if s.scope == "engine")
REQUEST_SETTINGS = tuple(s.name for s in SETTINGS if s.scope == "request")


def assumed_settings() -> dict[str, Json]:
    """Every engine-scope setting at the value the reference assumes."""
    return {s.name: s.assumed for s in SETTINGS if s.scope == "engine"}


def assumed_request_settings() -> dict[str, Json]:
    """Every request-scope setting at the value the reference assumes."""
    return {s.name: s.assumed for s in SETTINGS if s.scope == "request"}


def first_unreplayed(
    settings: Mapping[str, Json], config: EngineConfig, profile: Profile
) -> tuple[Setting, Json] | None:
    """The first setting (in table order) whose value the reference does not replay."""
    for setting in SETTINGS:
        if setting.name in settings:
            value = settings[setting.name]
            if not setting.replays(value, config, profile):
                return setting, value
    return None


def settings_markdown() -> str:
    """The table as a Markdown table (docs/traces.md renders it)."""

    def cell(value: Json) -> str:
        return f"`{json.dumps(value)}`"

    header = (
        "setting",
        "vLLM keeps it in",
        "vLLM default",
        "replayed",
        "what it changes",
        "in traces from",
    )
    lines = [f"| {' | '.join(header)} |", f"|{' --- |' * len(header)}"]
    for s in SETTINGS:
        if s.modelled:
            replayed = "every value (modelled)"
        else:
            replayed = " ".join(filter(None, (cell(s.assumed), s.also)))
        lines.append(
            f"| `{s.name}` | `{s.home}` | {cell(s.default)} | {replayed} | {s.changes}"
            f" | version {s.recorded_since} |"
        )
    return "\n".join(lines) + "\n"
