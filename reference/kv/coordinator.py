"""Which KV manager runs a config: vLLM's ``get_kv_cache_coordinator``.

By caching and group count: one full-attention group (MLA alike) keeps the single-group
managers (``counting.py``, with prefix caching ``prefix_caching.py``), whose counts the
shipped traces replay; any other layout runs on the hybrid coordinator (``hybrid.py``;
with prefix caching ``hybrid_caching.py``, which is also vLLM's
``UnitaryKVCacheCoordinator`` for one group of another kind), and what neither models is
refused by name.
"""

from __future__ import annotations

from dualbudget.spec.config import ConfigError, EngineConfig, KVGroup
from dualbudget.spec.releases import Release

from ..prefix_cache import HitRule
from .counting import KVCacheManager
from .hybrid import (
    group_managers,
    has_checkpoint_blocks,
    hybrid_manager,
    max_prefill_tokens,
    split_block_size,
)
from .hybrid_caching import HybridPrefixCachingKVCacheManager
from .kinds import KV_KINDS, kind_of
from .prefix_caching import PrefixCachingKVCacheManager


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
    spec = config.speculative_config
    method = spec.method if spec is not None else None
    lookahead = config.num_prefill_lookahead_tokens
    rule = HitRule.of(release, method, lookahead)
    check_prefill_lookahead(config, rule)
    caching = config.enable_prefix_caching
    if len(groups) == 1 and kind_of(groups[0]).full_attention:
        # KVCacheCoordinatorNoPrefixCache, or UnitaryKVCacheCoordinator with caching.
        block_size = groups[0].block_size
        if not caching:
            return KVCacheManager(
                block_size=block_size,
                max_model_len=config.max_model_len,
                num_lookahead_tokens=num_lookahead_tokens,
            )
        return PrefixCachingKVCacheManager(
            block_size=block_size,
            max_model_len=config.max_model_len,
            num_lookahead_tokens=num_lookahead_tokens,
            rule=rule,
            observed=observed,
            num_reprefillable_tokens=config.num_reprefillable_tokens,
        )
    check_hybrid_layout(config)
    if caching:
        return hybrid_caching_manager(config, release, rule, num_lookahead_tokens, observed)
    # Prefix caching off, no lookahead hashes: the drafter's drop is the speculative
    # config's use_eagle_block_drop, the drop of either hit rule a release has.
    drop = release.drops_last_hit_block(method) or release.num_hash_lookahead_tokens(method) > 0
    return hybrid_manager(config, num_lookahead_tokens, observed, drop)


def check_prefill_lookahead(config: EngineConfig, rule: HitRule) -> None:
    """Refuse what vLLM's coordinator refuses: with prefix caching, groups that drop
    their hit's last block (every group where the release drops it, else those holding
    the drafter's layers) cannot drop a multi-module MTP lookahead longer than a
    scheduler block."""
    lookahead = config.num_prefill_lookahead_tokens
    if not config.enable_prefix_caching or config.scheduler_block_size >= lookahead:
        return
    if rule.drop_last_block or any(group.is_eagle_group for group in config.groups):
        raise ConfigError(
            "num_nextn_predict_layers",
            f"multi-module MTP with prefix caching needs a scheduler block"
            f" ({config.scheduler_block_size}) of at least K ({lookahead}) tokens",
        )


def check_hybrid_layout(config: EngineConfig) -> None:
    """Refuse, by name, what the coordinator does not model of a layout of several groups
    or of a kind other than full attention."""
    if config.enable_prefix_caching:
        check_hybrid_caching_layout(config)
    elif config.mamba_prefill_checkpoint_blocks:
        scheduler_block_size = config.scheduler_block_size
        if scheduler_block_size != config.block_size:
            # Without caching vLLM hashes at the scheduler block size, where the Mamba
            # layers' checkpoint then falls; the reference's is on the Mamba block.
            raise ConfigError(
                "mamba_prefill_checkpoint_blocks",
                "Mamba prefill checkpoint blocks with prefix caching off and kv_groups whose"
                f" block sizes' LCM ({scheduler_block_size}) is not the Mamba block"
                f" ({config.block_size}) are not modelled",
            )
    for index, group in enumerate(config.groups):
        if group.mamba_cache_mode == "align" and group.block_size != config.block_size:
            # vLLM aligns chunks on cache_config.block_size, the Mamba block in align mode.
            raise ConfigError(
                f"kv_groups[{index}].block_size",
                f"a Mamba group in 'align' mode has block_size {config.block_size}"
                f" (cache_config.block_size), got {group.block_size}",
            )


def check_hybrid_caching_layout(config: EngineConfig) -> None:
    """Refuse, by name, a layout whose prefix caching the hybrid coordinator does not
    model: another kind's hit rules (Mamba out of ``align`` mode), or groups of several
    block sizes beside a chunked-local group (vLLM asserts its block is the scheduler
    block) or a Mamba one (partial hash hits)."""
    groups = config.groups
    mixed_sizes = len({group.block_size for group in groups}) > 1
    for index, group in enumerate(groups):
        kind = KV_KINDS.get(group.kind)
        if kind is None:
            raise ConfigError(
                f"kv_groups[{index}].kind",
                f"prefix caching with a {group.kind!r} group is not modelled",
            )
        if not kind.caching_modelled(group):
            raise ConfigError(
                f"kv_groups[{index}].mamba_cache_mode",
                f"prefix caching with a Mamba group in {group.mamba_cache_mode!r} mode:"
                " vLLM caches Mamba states only in 'align' mode",
            )
        if mixed_sizes and not kind.caches_beside_other_block_sizes:
            raise ConfigError(
                f"kv_groups[{index}].block_size",
                f"prefix caching with kv_groups of different block sizes beside a"
                f" {group.kind!r} group is not modelled (only full-attention, MLA and"
                " sliding-window groups of different block sizes are)",
            )


def hybrid_caching_manager(
    config: EngineConfig,
    release: Release,
    rule: HitRule,
    num_lookahead_tokens: int,
    observed: dict[str, int],
) -> HybridPrefixCachingKVCacheManager:
    """The coordinator with ``enable_caching``: the release's hit ``rule`` for the
    drafter, and the groups whose hit drops its last block (``drop_groups``)."""
    # A group's block is keyed by the hashes it spans.
    block_size = config.hash_block_size
    # Only the requests' hashes: the coordinator caches each group's blocks itself.
    hashing = PrefixCachingKVCacheManager(
        block_size=block_size,
        max_model_len=config.max_model_len,
        num_lookahead_tokens=num_lookahead_tokens,
        rule=rule,
        observed=observed,
    )
    types = lookup_types(config.groups)
    return HybridPrefixCachingKVCacheManager(
        block_size=block_size,
        max_model_len=config.max_model_len,
        num_lookahead_tokens=num_lookahead_tokens,
        groups=group_managers(config),
        observed=observed,
        split_block_size=split_block_size(config),
        max_prefill_tokens=max_prefill_tokens(config),
        # With caching on, lookahead hashes replace the drop (0.33's use_eagle_block_drop
        # is off where num_hash_lookahead_tokens is on).
        drop_eagle_block=rule.drop_last_block,
        checkpoint_blocks=has_checkpoint_blocks(config),
        retention_interval=config.prefix_cache_retention_interval,
        # get_mamba_prefill_checkpoint_position leaves the tokens a hash covers past its
        # block (0.33: K for multi-module MTP), at least one.
        checkpoint_recompute_tokens=max(1, rule.num_hash_lookahead_tokens),
        hashing=hashing,
        drop_groups=drop_groups(config, release, rule, types),
        lookup_types=types,
        retains_block_below_junction=release.retains_block_below_junction,
        scheduler_block_size=config.scheduler_block_size,
        num_reprefillable_tokens=config.num_reprefillable_tokens,
        rekeys_cached_mamba_tail=release.rekeys_cached_mamba_tail,
    )


def drop_groups(
    config: EngineConfig, release: Release, rule: HitRule, types: tuple[tuple[int, ...], ...]
) -> tuple[bool, ...]:
    """Per group, whether its hit drops its last block: those marked ``is_eagle_group``,
    or every group where none is marked and the drafter drops one (refused on a kind
    whose hit never drops)."""
    groups = config.groups
    flagged = [group.is_eagle_group for group in groups]
    if not any(flagged):
        flagged = [rule.drop_last_block] * len(groups)
    drops = rule.drop_last_block or release.eagle_groups_drop_without_use_eagle
    # verify_and_split_kv_cache_groups: one drafter's group among a spec's makes every
    # group of that spec drop (the spec group's use_eagle reaches each of its managers).
    dropping = [False] * len(groups)
    for group_ids in types:
        drop = drops and any(flagged[index] for index in group_ids)
        for index in group_ids:
            dropping[index] = drop
    for index, group in enumerate(groups):
        if dropping[index] and not kind_of(group).hit_may_drop:
            # ChunkedLocalAttentionManager.find_longest_cache_hit asserts it never drops.
            raise ConfigError(
                f"kv_groups[{index}].is_eagle_group",
                f"prefix caching with a {group.kind!r} group whose hit drops its last block"
                " (the drafter's group) is not modelled: vLLM asserts against it",
            )
    return tuple(dropping)


def lookup_types(groups: tuple[KVGroup, ...]) -> tuple[tuple[int, ...], ...]:
    """``verify_and_split_kv_cache_groups``: the groups of one spec (equal
    ``KVGroup.kv_cache_spec``) in the order their first group comes, then full attention
    first."""
    types: dict[KVGroup, list[int]] = {}
    for index, group in enumerate(groups):
        types.setdefault(group.kv_cache_spec, []).append(index)
    return tuple(
        tuple(group_ids)
        for group_ids in sorted(
            types.values(),
            key=lambda group_ids: not kind_of(groups[group_ids[0]]).full_attention,
        )
    )
