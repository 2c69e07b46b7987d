"""The kinds of KV group the reference models, each a record, and the one map from a
group's kind (its serialized name, ``KVGroup.kind``) to that record: vLLM's
``spec_manager_map`` with what the coordinators ask of a kind beside its manager."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dualbudget.spec.config import EngineConfig, KVGroup

from .blocks import cdiv
from .chunked_local import ChunkedLocalAttentionManager
from .mamba import MambaAlignManager, MambaManager
from .single_type import FullAttentionManager, SingleTypeKVCacheManager
from .sliding_window import SlidingWindowManager

ManagerFactory = Callable[[KVGroup, EngineConfig], SingleTypeKVCacheManager]


@dataclass(frozen=True, slots=True)
class KVKind:
    """What a kind of KV group is to the coordinators: how its manager is built
    (``get_manager_for_kv_cache_spec``) and the facts vLLM keys on its spec class."""

    name: str
    """The kind's serialized name (``KVGroup.kind``, vLLM's ``KVCacheSpecKind``)."""
    manager: ManagerFactory
    """The group's manager, with the admission cap a recycling kind's spec computes
    (``max_admission_blocks_per_request``)."""
    full_attention: bool = False
    """Scheduled as full attention (``MLAAttentionSpec`` is a ``FullAttentionSpec``): one
    such group runs on the single-group managers, and such groups are looked up first."""
    caches_beside_other_block_sizes: bool = False
    """Its prefix caching is modelled beside groups of other block sizes (hashes of the
    sizes' GCD, hits on their LCM); vLLM asserts a chunked-local group's block is the
    scheduler block, and a Mamba group's would need partial hash hits."""
    hit_may_drop: bool = True
    """Its hit may drop its last block for a drafter (vLLM asserts a chunked-local hit
    never does)."""
    caches_in_align_mode_only: bool = False
    """vLLM caches its blocks only in ``mamba_cache_mode`` ``align`` (``MambaManager``
    asserts it)."""
    holds_recurrent_state: bool = False
    """Its blocks hold a recurrent state, finalised as a step's output comes rather than
    as its tokens are computed (a release with ``caches_output_beside_mamba`` caches them
    then, spec tokens or not)."""

    def caching_modelled(self, group: KVGroup) -> bool:
        """Whether the caching coordinator models prefix caching on ``group``."""
        return not self.caches_in_align_mode_only or group.mamba_cache_mode == "align"


def max_in_flight_tokens(config: EngineConfig) -> int:
    """``VllmConfig.max_in_flight_tokens``: one batch per concurrent step (two with
    ``async_scheduling``, vLLM's batch queue)."""
    return (2 if config.async_scheduling else 1) * config.max_num_batched_tokens


def _full_attention(group: KVGroup, config: EngineConfig) -> SingleTypeKVCacheManager:
    return FullAttentionManager(group.block_size)


def _sliding_window(group: KVGroup, config: EngineConfig) -> SingleTypeKVCacheManager:
    assert group.sliding_window is not None
    size, window = group.block_size, group.sliding_window
    extra = config.num_reprefillable_tokens
    in_flight = max_in_flight_tokens(config)
    # +1: the window need not start at a block's start (SlidingWindowSpec).
    cap = cdiv(min(window - 1 + extra + in_flight, config.max_model_len), size) + 1
    return SlidingWindowManager(size, True, cap, window, extra)


def _chunked_local(group: KVGroup, config: EngineConfig) -> SingleTypeKVCacheManager:
    assert group.attention_chunk_size is not None
    size, chunk = group.block_size, group.attention_chunk_size
    cap = cdiv(min(chunk + max_in_flight_tokens(config), config.max_model_len), size)
    return ChunkedLocalAttentionManager(size, True, cap, chunk)


def _mamba(group: KVGroup, config: EngineConfig) -> SingleTypeKVCacheManager:
    mamba = MambaAlignManager if group.mamba_cache_mode == "align" else MambaManager
    return mamba(group.block_size, False, None, config.num_speculative_tokens)


KV_KINDS: Mapping[str, KVKind] = {
    kind.name: kind
    for kind in (
        KVKind("full_attention", _full_attention, True, True),
        KVKind("mla_attention", _full_attention, True, True),
        KVKind("sliding_window", _sliding_window, caches_beside_other_block_sizes=True),
        KVKind("sliding_window_mla", _sliding_window, caches_beside_other_block_sizes=True),
        KVKind("chunked_local_attention", _chunked_local, hit_may_drop=False),
        KVKind("mamba", _mamba, caches_in_align_mode_only=True, holds_recurrent_state=True),
    )
}
"""The one map from a kind's name to its record: ``spec/config.py``'s ``KV_GROUP_KINDS``,
each with its manager."""


def kind_of(group: KVGroup) -> KVKind:
    """``group``'s kind (``check_engine_config`` refused any other name)."""
    return KV_KINDS[group.kind]


def caching_modelled(group: KVGroup) -> bool:
    """Whether the caching coordinator models prefix caching on ``group``: vLLM caches
    Mamba states only in ``align`` mode (its ``MambaManager`` asserts it)."""
    return kind_of(group).caching_modelled(group)


def single_type_manager(group: KVGroup, config: EngineConfig) -> SingleTypeKVCacheManager:
    """``get_manager_for_kv_cache_spec``: the manager of ``group``'s kind."""
    return kind_of(group).manager(group, config)
