"""The vLLM settings outside the engine config that can change a scheduling decision: one
table of each one's vLLM default and whether the reference models it.

The trace recorder writes every engine-scope setting into a trace header (and a
request-scope one on the request's ``add_request`` line), read from the live vLLM;
``replay`` and ``simulate --trace`` refuse a trace that holds a value the reference does
not replay, naming the setting (``replay.check_settings``, the one check), and
``dualbudget settings`` prints the table for users. The reference replays an
unmodelled setting only at the value it assumes, vLLM's default. Prefix caching is modelled
(every value replays) and stays in the header's settings, where version 2 put it; the
reader copies it into the engine config, which the reference runs on
(``reference/formats/trace.py``).
What the engine config carries otherwise (``async_scheduling``,
``long_prefill_token_threshold``, ``scheduling_policy``, the budgets) is modelled and
travels in the trace's ``config``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from dualbudget.spec.config import KV_GROUP_KINDS, EngineConfig
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import Profile
from dualbudget.spec.releases import RELEASE_VERSIONS, RELEASES, Release

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
    optional: bool = False
    """A header of a version that records it may still lack it: traces written before the
    table gained the row. Its absence reads as vLLM's default in the trace's release."""
    exists_in: Callable[[Release], bool] | None = None
    """Whether a release's vLLM has the setting (None: every release); one without it
    always runs at ``default``."""
    engine_default: Json = None
    """What vLLM's engine hands the scheduler when the user sets nothing, where that is
    not ``default`` (a config the engine fills in from another one); None: ``default``.
    A deployment's trace (``reference/formats/deployments.py``) carries it."""

    def home_in(self, version: str) -> str | None:
        """Where release ``version``'s vLLM reads it; None where it has no such setting."""
        exists = self.exists_in is None or self.exists_in(RELEASES[version])
        return self.home if exists else None

    @property
    def status(self) -> str:
        """``modelled``, ``refused`` or ``partly`` (some values other than the assumed
        one replay)."""
        if self.modelled:
            return "modelled"
        return "partly" if self.also_replays is not None else "refused"

    def replays(self, value: Json, config: EngineConfig, profile: Profile) -> bool:
        if self.modelled or value == self.assumed:
            return True
        return self.also_replays is not None and self.also_replays(value, config, profile)


def _profile_active_cap(value: Json, config: EngineConfig, profile: Profile) -> bool:
    # vLLM 0.33 writes its own DFlash/DSpark admission cap into max_num_active_seqs; the
    # profile derives the same cap, so a value equal to it is no user setting.
    return bool(value == profile.policy.max_active_requests(StepParams.of(config)))


def _no_prefix_caching(value: Json, config: EngineConfig, profile: Profile) -> bool:
    # Without prefix caching there is no hit to skip.
    return not config.enable_prefix_caching


def _hits_uncapped(value: Json, config: EngineConfig, profile: Profile) -> bool:
    # Only a release whose waiting loop asks the routed-experts connector for a hit cap
    # decides otherwise with the output on.
    return not profile.release.caps_hits_for_routed_experts


def _hashes_ahead(release: Release) -> bool:
    # A release whose EAGLE-style block hashes never look ahead has no switch for them.
    return bool(release.hash_lookahead_methods)


def _has_cache_aware_admission(release: Release) -> bool:
    return release.has_cache_aware_admission


KV_SPEC_KINDS = {
    "FullAttentionSpec": "full_attention",
    "MLAAttentionSpec": "mla_attention",
    "SlidingWindowSpec": "sliding_window",
    "SlidingWindowMLASpec": "sliding_window_mla",
    "ChunkedLocalAttentionSpec": "chunked_local_attention",
    "MambaSpec": "mamba",
}
"""vLLM's KV cache spec classes of the kinds the reference models (``KV_GROUP_KINDS``),
by class name, as ``kv_cache_groups`` records them. ``UniformTypeKVCacheSpecs`` (layers of
one kind whose specs did not merge) and every other class are refused by name."""


def _groups_in_config(value: Json, config: EngineConfig, profile: Profile) -> bool:
    # The reference runs on config.kv_groups, which the recorder writes from the same
    # KVCacheConfig: the recorded classes must be the kinds of exactly those groups.
    groups = config.groups
    return (
        isinstance(value, list)
        and len(value) == len(groups)
        and all(
            KV_SPEC_KINDS.get(name) == group.kind and group.kind in KV_GROUP_KINDS
            for name, group in zip(value, groups, strict=True)
        )
    )


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "enable_prefix_caching", "cache_config.enable_prefix_caching", True, True, False,
        "admitted requests start at their cached prefix",
    ),
    Setting(
        "max_num_active_seqs", "scheduler_config.max_num_active_seqs", None, False, None,
        "caps the running requests below max_num_seqs",
        also_replays=_profile_active_cap, also="or the profile's own admission cap",
    ),
    Setting(
        "watermark", "scheduler_config.watermark", 0.0, False, 0.0,
        "KV blocks kept free at admission",
    ),
    Setting(
        "cache_aware_admission_window",
        "scheduler_config.cache_aware_admission_window", 0, False, 0,
        "under FCFS with prefix caching and a busy KV pool, the first waiting requests of"
        " the window are admitted deepest cached prefix first, not in arrival order",
        recorded_since=3, optional=True, exists_in=_has_cache_aware_admission,
    ),
    Setting(
        "scheduler_reserve_full_isl", "scheduler_config.scheduler_reserve_full_isl", True,
        False, True,
        "admission checks KV room for the whole prompt",
    ),
    Setting(
        "long_prefill_token_threshold_adaptive",
        "scheduler_config.long_prefill_token_threshold_adaptive", False, False, False,
        "the long-prefill chunk cap follows the load",
    ),
    Setting(
        "prefill_schedule_interval", "scheduler_config.prefill_schedule_interval", 1, False, 1,
        "steps between prefill admissions (0.33 on one engine; 0.32 data-parallel only)",
    ),
    Setting(
        "num_speculative_tokens_per_batch_size",
        "speculative_config.num_speculative_tokens_per_batch_size", None, False, None,
        "K varies with the batch size (dynamic speculative decoding)",
    ),
    Setting(
        "num_nextn_predict_layers",
        "speculative_config.draft_model_config.hf_config.num_nextn_predict_layers",
        None, True, None,
        "multi-module MTP ends no prefill chunk within K of the prompt's end, leaves a"
        " chunk's last K - 1 tokens uncached until the next chunk (one group, or a group"
        " that drops a hit's last block) and below a sliding window kept, and (0.33)"
        " hashes each block with the K tokens after it",
    ),
    Setting(
        "disable_eagle_block_drop", "speculative_config.disable_eagle_block_drop", False,
        False, False,
        "an EAGLE-family prefix-cache hit keeps its last block",
        recorded_since=3,
    ),
    Setting(
        "disable_lookahead_block_hashes",
        "speculative_config.disable_lookahead_block_hashes", False, False, False,
        "0.33's EAGLE-family block hashes stop covering the token after each block",
        recorded_since=3, exists_in=_hashes_ahead,
    ),
    Setting(
        "kv_cache_groups", "kv_cache_config.kv_cache_groups[].kv_cache_spec",
        ["FullAttentionSpec"], False, ["FullAttentionSpec"],
        "sliding-window, Mamba or hybrid groups allocate KV blocks otherwise",
        also_replays=_groups_in_config,
        also="or the groups of config.kv_groups, each of a kind the reference models",
    ),
    Setting(
        "prefix_cache_retention_interval",
        "kv_cache_config.prefix_cache_retention_interval (the engine copies"
        " cache_config.prefix_cache_retention_interval there, default 0)",
        None, True, None,
        "sliding-window and Mamba groups cache only the blocks at replay boundaries (0) or"
        " one tail per interval tokens, not every block (None): fewer prefix hits",
        recorded_since=3, optional=True, engine_default=0,
    ),
    Setting(
        "mamba_prefill_checkpoint_blocks",
        "kv_cache_config.kv_cache_groups[].kv_cache_spec.num_prefill_checkpoint_blocks"
        " (MambaSpec; 1 where Qwen's gated delta net layers run FlashInfer's prefill"
        " kernel, Hopper's default)",
        0, True, 0,
        "a Mamba group in align mode saves the prompt's reusable state inside a prefill"
        " chunk, in a block it reserves, instead of the scheduler ending the chunk there"
        " (modelled with prefix caching on or off, the checkpoint aligned on the Mamba"
        " block)",
        recorded_since=3, optional=True,
    ),
    Setting(
        "prefix_replay_tokens",
        "kv_cache_config.kv_cache_groups[].kv_cache_spec.prefix_replay_tokens (a"
        " SlidingWindowMLASpec with bounded_replay, DeepSeek V4.1's sliding-window layers:"
        " its window)",
        0, False, 0,
        "a prefix hit recomputes its last window of tokens and one no longer than the"
        " window is dropped; the replaying group takes no part in prefix caching",
        recorded_since=3, optional=True,
    ),
    Setting(
        "prefix_match_unit", "cache_config.prefix_match_unit (the hash block size of"
        " several KV groups)", None, False, None,
        "prefix hits land on a hash block finer than the groups' block: a Mamba group's"
        " partial hits copy its tail state",
        recorded_since=3, optional=True,
    ),
    Setting(
        "enable_mamba_shared_prefix_checkpoint",
        "cache_config.enable_mamba_shared_prefix_checkpoint", False, False, False,
        "with partial hash hits, a Mamba prefill chunk also ends at a shared-prefix junction"
        " that is not on a block boundary",
        recorded_since=3, optional=True,
    ),
    Setting(
        "enable_lora", "lora_config (set: not None)", False, False, False,
        "max_loras caps the distinct adapters of a step",
    ),
    Setting(
        "kv_connector", "kv_transfer_config.kv_connector (also set by"
        " cache_config.kv_offloading_size)", None, False, None,
        "external prefix hits, asynchronous KV loads and delayed block frees (P/D"
        " disaggregation, KV offloading); in 0.33 also no lookahead block hashes, so the"
        " EAGLE last-block drop comes back",
        recorded_since=3, optional=True,
    ),
    Setting(
        "pipeline_parallel_size", "parallel_config.pipeline_parallel_size", 1, False, 1,
        "the engine keeps pp (or pp + 1) batches in flight: steps are scheduled ahead of"
        " the outputs they would wait for",
        recorded_since=3, optional=True,
    ),
    Setting(
        "decode_context_parallel_size", "parallel_config.decode_context_parallel_size", 1,
        False, 1,
        "the scheduler's KV blocks hold block_size x DCP tokens",
        recorded_since=3, optional=True,
    ),
    Setting(
        "disable_chunked_mm_input", "scheduler_config.disable_chunked_mm_input", False,
        True, False,
        "a request's encoder input is scheduled whole or not at all (every value replays:"
        " it acts only on requests with encoder inputs, each refused)",
        recorded_since=3, optional=True,
    ),
    Setting(
        "enable_return_routed_experts", "aux_output_config.enable_return_routed_experts",
        False, False, False,
        "0.33 caps a prefix-cache hit at what the routed-experts output holds",
        also_replays=_hits_uncapped, also="or any value on a release that caps no hit for it",
        recorded_since=3, optional=True,
    ),
    Setting(
        "structured_outputs", "Request.structured_output_request", False, False, False,
        "drafts are cut to what the grammar accepts; a request waits for its grammar",
        scope="request",
    ),
    Setting(
        "skip_reading_prefix_cache", "Request.skip_reading_prefix_cache", False, False, False,
        "the request takes no prefix-cache hit (vLLM sets it for prompt logprobs)",
        scope="request",
        also_replays=_no_prefix_caching, also="or any value with prefix caching off",
    ),
    Setting(
        "mm_encoder_inputs", "Request.mm_features (non-empty)", False, False, False,
        "the encoder budget and cache cut a request's prefill chunks",
        scope="request", recorded_since=3,
    ),
    Setting(
        "repetition_detection", "Request.sampling_params.repetition_detection (set)", False,
        False, False,
        "check_stop finishes a request on a repeated pattern (FINISHED_REPETITION), a stop"
        " the trace does not mark",
        scope="request", recorded_since=3,
    ),
)  # fmt: skip
"""Every setting outside the engine config that can change a decision."""

SETTING_NAMES = tuple(setting.name for setting in SETTINGS)
SETTINGS_IN_CONFIG = tuple(
    s.name for s in SETTINGS if s.name in {item.name for item in fields(EngineConfig)}
)
"""The settings the engine config holds, the reference's home of them in memory; a trace
keeps them in its header's ``settings``, never in its ``config``."""
ENGINE_SETTINGS = tuple(s.name for s in SETTINGS if s.scope == "engine")
REQUEST_SETTINGS = tuple(s.name for s in SETTINGS if s.scope == "request")


def assumed_settings() -> dict[str, Json]:
    """Every engine-scope setting at the value the reference assumes."""
    return {s.name: s.assumed for s in SETTINGS if s.scope == "engine"}


def assumed_request_settings() -> dict[str, Json]:
    """Every request-scope setting at the value the reference assumes."""
    return {s.name: s.assumed for s in SETTINGS if s.scope == "request"}


def engine_defaults() -> dict[str, Json]:
    """The settings vLLM's engine runs at other than their ``default`` when the user sets
    nothing (``Setting.engine_default``)."""
    return {s.name: s.engine_default for s in SETTINGS if s.engine_default is not None}


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


def setting_json(setting: Setting) -> dict[str, Json]:
    """One row of ``dualbudget settings --json``: where each release's vLLM reads the
    setting and its default there, and whether the reference replays it."""
    return {
        "name": setting.name,
        "scope": setting.scope,
        "status": setting.status,
        "releases": {
            release: {"home": setting.home_in(release), "default": setting.default}
            for release in RELEASE_VERSIONS
        },
        "engine_default": setting.engine_default,
        "replays": setting.assumed if not setting.modelled else None,
        "also": setting.also or None,
        "changes": setting.changes,
        "recorded_since": setting.recorded_since,
    }


def _cell(value: Json) -> str:
    return f"`{json.dumps(value)}`"


def replayed_words(setting: Setting) -> str:
    """The values the reference replays, in words."""
    if setting.modelled:
        return "every value"
    return " ".join(filter(None, (_cell(setting.assumed), setting.also)))


def settings_markdown() -> str:
    """The table as a Markdown table (docs/traces.md renders it)."""
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
        absent = "".join(f" (none in {v})" for v in RELEASE_VERSIONS if s.home_in(v) is None)
        lines.append(
            f"| `{s.name}` | `{s.home}`{absent} | {_cell(s.default)} | {replayed_words(s)}"
            f"{' (modelled)' * s.modelled}"
            f" | {s.changes} | version {s.recorded_since}{' (absent: the default)' * s.optional} |"
        )
    return "\n".join(lines) + "\n"
