"""Which KV manager runs a config: vLLM's ``get_kv_cache_coordinator``.

One full-attention group (MLA alike) keeps the single-group managers of ``kv.py``, whose
counts the shipped traces replay; any other layout runs on the hybrid coordinator
(``kv_hybrid.py``), which refuses by name what it does not model.
"""

from __future__ import annotations

from dualbudget.spec.config import ConfigError, EngineConfig
from dualbudget.spec.releases import Release

from .kv import KVCacheManager, PrefixCachingKVCacheManager
from .kv_hybrid import hybrid_manager
from .prefix_cache import HitRule

FULL_ATTENTION_KINDS = ("full_attention", "mla_attention")
"""Kinds vLLM schedules as full attention (``MLAAttentionSpec`` is a ``FullAttentionSpec``)."""


def manager_for(
    config: EngineConfig,
    release: Release,
    num_lookahead_tokens: int,
    observed: dict[str, int],
) -> KVCacheManager:
    """The manager of a config on ``release``: one full-attention group (MLA alike) keeps
    the single-group managers, with prefix caching the caching one with the release's hit
    rule for the config's drafter; other layouts the hybrid coordinator."""
    groups = config.groups
    if len(groups) > 1 or groups[0].kind not in FULL_ATTENTION_KINDS:
        check_hybrid_layout(config)
        spec = config.speculative_config
        method = spec.method if spec is not None else None
        # Prefix caching off, no lookahead hashes: the drafter's drop is the speculative
        # config's use_eagle_block_drop, the drop of either hit rule a release has.
        drop = release.drops_last_hit_block(method) or release.num_hash_lookahead_tokens(method) > 0
        return hybrid_manager(config, num_lookahead_tokens, observed, drop)
    block_size = groups[0].block_size
    if not config.enable_prefix_caching:
        return KVCacheManager(block_size, config.max_model_len, num_lookahead_tokens)
    spec = config.speculative_config
    rule = HitRule.of(release, spec.method if spec is not None else None)
    return PrefixCachingKVCacheManager(
        block_size, config.max_model_len, num_lookahead_tokens, rule, observed
    )


def check_hybrid_layout(config: EngineConfig) -> None:
    """Refuse, by name, what the coordinator does not model of a layout of several groups
    or of a kind other than full attention."""
    if config.enable_prefix_caching:
        raise ConfigError(
            "enable_prefix_caching",
            "prefix caching with kv_groups other than one full-attention group is not modelled",
        )
    for index, group in enumerate(config.groups):
        if group.mamba_cache_mode == "align" and group.block_size != config.block_size:
            # vLLM aligns chunks on cache_config.block_size, the Mamba block in align mode.
            raise ConfigError(
                f"kv_groups[{index}].block_size",
                f"a Mamba group in 'align' mode has block_size {config.block_size}"
                f" (cache_config.block_size), got {group.block_size}",
            )
