"""The one map from a KV group's kind to its record covers exactly the kinds the spec
accepts, and builds each kind's own manager."""

from __future__ import annotations

from dualbudget.reference.kv.chunked_local import ChunkedLocalAttentionManager
from dualbudget.reference.kv.kinds import KV_KINDS, single_type_manager
from dualbudget.reference.kv.mamba import MambaAlignManager, MambaManager
from dualbudget.reference.kv.single_type import FullAttentionManager, SingleTypeKVCacheManager
from dualbudget.reference.kv.sliding_window import SlidingWindowManager
from dualbudget.spec.config import KV_GROUP_KINDS, EngineConfig, KVGroup

GROUPS: dict[KVGroup, type[SingleTypeKVCacheManager]] = {
    KVGroup("full_attention", 16): FullAttentionManager,
    KVGroup("mla_attention", 16): FullAttentionManager,
    KVGroup("sliding_window", 16, sliding_window=128): SlidingWindowManager,
    KVGroup("sliding_window_mla", 16, sliding_window=128): SlidingWindowManager,
    KVGroup("chunked_local_attention", 16, attention_chunk_size=64): (ChunkedLocalAttentionManager),
    KVGroup("mamba", 16): MambaManager,
    KVGroup("mamba", 16, mamba_cache_mode="align"): MambaAlignManager,
}


def test_the_kind_map_is_the_spec_kinds() -> None:
    assert set(KV_KINDS) == set(KV_GROUP_KINDS)
    assert all(name == kind.name for name, kind in KV_KINDS.items())


def test_each_kind_builds_its_own_manager() -> None:
    config = EngineConfig(
        max_num_batched_tokens=256,
        max_num_seqs=8,
        max_model_len=1024,
        block_size=16,
        num_gpu_blocks=64,
    )
    for group, manager in GROUPS.items():
        assert type(single_type_manager(group, config)) is manager, group
    assert {group.kind for group in GROUPS} == set(KV_GROUP_KINDS)
