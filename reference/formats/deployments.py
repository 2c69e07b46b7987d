"""The deployments people serve with speculative decoding, as the trace recorder would
write them, and whether each release's trace of one replays: the settings table
(``reference/formats/settings.py``), the engine config checks and the scheduler's own refusals
decide, nothing here does.

Each family is its vLLM defaults (async scheduling, prefix caching, and what the engine
fills in: ``Setting.engine_default``) plus what sets it
apart: its KV cache groups, as vLLM's ``KVCacheConfig`` holds them and the recorder writes
them (``kv_cache_groups`` in the settings, ``config.kv_groups``), and the settings its
usual deployment turns on. docs/reference.md renders the table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from dualbudget.spec.config import (
    EngineConfig,
    KVGroup,
    SpeculativeConfig,
    check_async_scheduling,
    check_engine_config,
    check_parallel_drafting,
    runs_async,
)
from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import release_profile
from dualbudget.spec.releases import RELEASES, Release

from ..async_scheduler import make_scheduler
from .settings import (
    KV_SPEC_KINDS,
    SETTINGS_IN_CONFIG,
    Json,
    assumed_settings,
    engine_defaults,
    first_unreplayed,
)

_CLASS_OF_KIND = {kind: name for name, kind in KV_SPEC_KINDS.items()}


@dataclass(frozen=True)
class Deployment:
    family: str
    method: str
    num_speculative_tokens: int
    groups: tuple[tuple[str, KVGroup], ...]
    """vLLM's spec class and the group, per KV cache group."""
    settings: dict[str, Json] = field(default_factory=dict)
    """Settings the deployment runs at other than vLLM's default."""

    def config(self, release: Release) -> EngineConfig:
        """Its engine config on ``release``, at vLLM's defaults: async scheduling where
        the release runs the method's drafter async, prefix caching on."""
        spec = SpeculativeConfig(self.method, self.num_speculative_tokens)
        kv_groups = tuple(group for _, group in self.groups)
        if [name for name, _ in self.groups] == ["FullAttentionSpec"]:
            kv_groups = ()  # as the recorder writes one full-attention group
        return EngineConfig(
            max_num_batched_tokens=8192,
            max_num_seqs=1024,
            max_model_len=32768,
            block_size=self.groups[0][1].block_size,
            num_gpu_blocks=100_000,
            speculative_config=spec,
            async_scheduling=runs_async(spec, release),
            enable_prefix_caching=True,
            kv_groups=kv_groups,
        )

    def recorded_settings(self, *, served: bool = True) -> dict[str, Json]:
        """The settings its trace carries. A served deployment runs vLLM's engine, which
        fills in some of the scheduler's settings itself (sparse sliding-window caching);
        a scheduler-level recording (``served=False``) builds the scheduler's configs
        directly and carries their own defaults."""
        groups = {"kv_cache_groups": [name for name, _ in self.groups]}
        engine = engine_defaults() if served else {}
        return {**assumed_settings(), **engine, **groups, **self.settings}

    def verdict(self, version: str, *, served: bool = True) -> str:
        """``replays`` or ``refused: why`` for a trace of this deployment from ``version``
        (``served``: recorded from vLLM's engine; else at the scheduler's level)."""
        release = RELEASES[version]
        base = self.config(release)
        # The settings the engine config holds reach it as a trace's header hands them
        # to the config it replays on (``reference/formats/trace.py``).
        settings = {
            **self.recorded_settings(served=served),
            "enable_prefix_caching": base.enable_prefix_caching,
        }
        config = replace(base, **{name: settings[name] for name in SETTINGS_IN_CONFIG})
        profile = release_profile(release)
        try:
            check_engine_config(config)
            check_parallel_drafting(config, release)
            check_async_scheduling(config, release)
        except BadInput as err:
            return f"refused: {err}"
        found = first_unreplayed(settings, config, profile)
        if found is not None:
            setting, value = found
            return f"refused: `{setting.name}` = `{json.dumps(value)}` ({setting.changes})"
        try:
            # The KV manager's own refusals (a layout whose prefix caching it does not
            # model), met where replay meets them: building the scheduler.
            make_scheduler(config, profile)
        except BadInput as err:
            return f"refused: {err}"
        return "replays"


def _group(kind: str, block_size: int = 16, **fields: object) -> tuple[str, KVGroup]:
    return _CLASS_OF_KIND.get(kind, kind), KVGroup(kind, block_size, **fields)  # type: ignore[arg-type]


_FULL = _group("full_attention")
# vLLM splits a model's layers into KV groups of equal size: three linear-attention
# (Mamba) layers per full-attention one make three Mamba groups, looked up together.
_QWEN3_NEXT_MAMBA = (_group("mamba", 16, mamba_cache_mode="align"),) * 3
# DeepSeek V3.2's indexer layers are MLA specs of another head size at the MLA block
# size: vLLM's get_kv_cache_groups puts them with the MLA layers in one
# UniformTypeKVCacheSpecs group, whose first layer spec the scheduler's KVCacheConfig
# keeps (generate_scheduler_kv_cache_config), so its scheduler sees V3's one MLA group.
_MLA = _group("mla_attention", 64)
# DeepSeek V4's layers, as its model code asks for them: compressed MLA at the cache block
# (256, its sparse backend's preferred block) in states of 4 or 128 tokens, and the
# indexer's keys, MLA specs that differ in fields deciding no blocks, so vLLM looks their
# groups up apart and each further spec carries a spec_variant (two listed here); a
# sliding-window MLA cache per layer in blocks of 64; the compressors' states,
# sliding-window MLA in blocks of 4 (window 8) and of 8 (window 128). How many groups of
# each vLLM's planner makes follows the layer counts and the GPU's KV layout, which a
# trace records; the verdict reads the kinds, block sizes and variants only. The layers'
# window is the model config's (128 here).
_DEEPSEEK_V4 = (
    _group("mla_attention", 256),
    _group("mla_attention", 256, spec_variant=1),
    _group("sliding_window_mla", 64, sliding_window=128),
    _group("sliding_window_mla", 4, sliding_window=8),
    _group("sliding_window_mla", 8, sliding_window=128),
)

DEPLOYMENTS: tuple[Deployment, ...] = (
    Deployment(
        "gpt-oss + EAGLE3", "eagle3", 3,
        (_group("sliding_window", sliding_window=128), _FULL),
    ),
    Deployment("DeepSeek V3 / V3.1 + MTP", "mtp", 1, (_MLA,)),
    Deployment(
        "DeepSeek V3 + MTP, P/D disaggregated", "mtp", 1, (_MLA,),
        {"kv_connector": "NixlConnector"},
    ),
    Deployment(
        "DeepSeek V3 + MTP, long context (DCP 8)", "mtp", 1, (_MLA,),
        {"decode_context_parallel_size": 8},
    ),
    Deployment("DeepSeek V3.2 + MTP (indexer layers in the MLA group)", "mtp", 1, (_MLA,)),
    Deployment("DeepSeek V4 + MTP", "mtp", 1, _DEEPSEEK_V4),
    Deployment(
        "Qwen3-Next + MTP on Hopper (FlashInfer prefill)", "mtp", 2,
        (*_QWEN3_NEXT_MAMBA, _FULL),
        {"mamba_prefill_checkpoint_blocks": 1},
    ),
    Deployment("Qwen3-Next + MTP, Triton prefill", "mtp", 2, (*_QWEN3_NEXT_MAMBA, _FULL)),
    # A drafter's full-attention layers of another head size than the target's join its
    # group as the indexer joins MLA's (one UniformTypeKVCacheSpecs group).
    Deployment(
        "Qwen3 dense + DFlash (drafter layers in the target's group)", "dflash", 7, (_FULL,)
    ),
    Deployment(
        "Llama 4 + EAGLE3", "eagle3", 3,
        (
            *(_group("chunked_local_attention", attention_chunk_size=8192),) * 3,
            _group("full_attention", is_eagle_group=True),
        ),
    ),
    Deployment("Llama 3.x + EAGLE3", "eagle3", 3, (_FULL,)),
    Deployment(
        "Llama 3.x + EAGLE3, KV offloading", "eagle3", 3, (_FULL,),
        {"kv_connector": "OffloadingConnector"},
    ),
    Deployment("n-gram on a full-attention coder", "ngram", 4, (_FULL,)),
)  # fmt: skip
"""The families of the deployment table, oldest model first."""


def deployments_markdown() -> str:
    """The deployment table (docs/reference.md renders it)."""
    versions = tuple(RELEASES)
    header = ("deployment", "KV cache groups", *(f"vLLM {v}" for v in versions))
    lines = [f"| {' | '.join(header)} |", f"|{' --- |' * len(header)}"]
    for deployment in DEPLOYMENTS:
        groups = " + ".join(f"`{name}`" for name, _ in deployment.groups)
        verdicts = [deployment.verdict(version) for version in versions]
        cells = [deployment.family, groups, *verdicts]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
