"""The shipped traces of Qwen3-Next + MTP's KV layout at vLLM's defaults (three Mamba groups
in ``align`` mode beside full attention, prefix caching on, the engine's retention 0),
recorded from each release's own ``AsyncScheduler``, with Triton's prefill (no prefill
checkpoint blocks) and FlashInfer's (one): each replays with hits, and each pins a Mamba
rule of the coordinator with caching: taken out, the replay diverges."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from dualbudget import TRACES
from dualbudget.reference.formats.trace import read_trace
from dualbudget.reference.kv import coordinator as kv_coordinator
from dualbudget.reference.kv.hybrid_caching import HybridPrefixCachingKVCacheManager
from dualbudget.reference.kv.mamba import MambaAlignManager
from dualbudget.reference.runs.replay import replay_trace
from dualbudget.spec.releases import RELEASE_VERSIONS

TRACE = "scheduler-async-{}-qwen3-next-mtp.ndjson.gz"
CHECKPOINTS = "scheduler-async-{}-qwen3-next-mtp-checkpoints.ndjson.gz"
TRACES_OF = {0: TRACE, 1: CHECKPOINTS}
"""The trace per ``mamba_prefill_checkpoint_blocks``."""


def first_divergence(
    version: str, trace: str = TRACE, checkpoints: int | None = None
) -> int | None:
    """Where the replay of ``trace`` diverges (None: nowhere), in a decision or in the
    pool's free blocks, at the recorded checkpoint blocks or at ``checkpoints``."""
    read = read_trace(TRACES / trace.format(version))
    if checkpoints is not None:
        config = dataclasses.replace(
            read.header.config, mamba_prefill_checkpoint_blocks=checkpoints
        )
        read = dataclasses.replace(read, header=dataclasses.replace(read.header, config=config))
    result = replay_trace(read)
    assert result.violations == []
    if result.divergence is not None:
        return result.divergence[0]
    return None if result.free_blocks_divergence is None else result.free_blocks_divergence[0]


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
@pytest.mark.parametrize("checkpoints", sorted(TRACES_OF))
def test_it_holds_a_mamba_group_in_align_mode_with_prefix_caching(
    version: str, checkpoints: int
) -> None:
    header = read_trace(TRACES / TRACES_OF[checkpoints].format(version)).header
    # Three Mamba groups per full-attention one, as vLLM splits Qwen3-Next's layers.
    assert header.settings["kv_cache_groups"] == ["MambaSpec"] * 3 + ["FullAttentionSpec"]
    assert header.enable_prefix_caching
    assert header.config.kv_groups[0].mamba_cache_mode == "align"
    assert header.config.prefix_cache_retention_interval == 0
    assert header.settings["mamba_prefill_checkpoint_blocks"] == checkpoints
    assert header.config.mamba_prefill_checkpoint_blocks == checkpoints


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
@pytest.mark.parametrize("checkpoints", sorted(TRACES_OF))
def test_it_replays_with_hits(version: str, checkpoints: int) -> None:
    result = replay_trace(read_trace(TRACES / TRACES_OF[checkpoints].format(version)))
    assert result.divergence is None and result.violations == []
    assert result.free_blocks_divergence is None and result.free_blocks_checked == 300
    assert result.steps_checked == 300 and result.prefix_hits > 0 and result.natural_stops > 0


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
@pytest.mark.parametrize("checkpoints", sorted(TRACES_OF))
def test_replayed_at_the_other_checkpoint_blocks_it_diverges(
    version: str, checkpoints: int
) -> None:
    """A chunk that saves the prompt's state inside it is not cut there and asks one
    block more: each trace pins the setting."""
    assert first_divergence(version, TRACES_OF[checkpoints], 1 - checkpoints) is not None


def _never_pending(self: HybridPrefixCachingKVCacheManager, state: object, hits: object) -> bool:
    return False


def _dense(self: MambaAlignManager, *args: object) -> None:
    return None


PLANTS: dict[str, tuple[type, str, Callable[..., object]]] = {
    "a hit on a state cached this step no longer waits": (
        HybridPrefixCachingKVCacheManager,
        "_hit_state_pending",
        _never_pending,
    ),
    "the Mamba group caches every state (retention None)": (
        MambaAlignManager,
        "reachable_block_mask",
        _dense,
    ),
}


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_mamba_rule_taken_out_diverges(
    monkeypatch: pytest.MonkeyPatch, plant: str, version: str
) -> None:
    owner, name, replacement = PLANTS[plant]
    assert first_divergence(version) is None
    monkeypatch.setattr(owner, name, replacement)
    assert first_divergence(version) is not None


def test_0_33_leaves_a_keyed_tail_state_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given 0.32's ``rekeys_cached_mamba_tail``, the 0.33 trace diverges: a sibling's hit
    on the prompt's last state waits a step 0.33 does not (the hand-worked cases of
    ``tests/kv_group_cases.py`` show 0.32's side, live)."""
    built = kv_coordinator.hybrid_caching_manager

    def rekeying(*args: object, **kwargs: object) -> HybridPrefixCachingKVCacheManager:
        manager = built(*args, **kwargs)  # type: ignore[arg-type]
        return dataclasses.replace(manager, rekeys_cached_mamba_tail=True)

    monkeypatch.setattr(kv_coordinator, "hybrid_caching_manager", rekeying)
    assert first_divergence("0.33") is not None
