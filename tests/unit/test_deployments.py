"""The deployment table (``reference/formats/deployments.py``, rendered into docs/reference.md):
what a trace of each served family replays, judged as replay judges a trace."""

from __future__ import annotations

import pytest

from dualbudget.reference.formats.deployments import DEPLOYMENTS, Deployment
from dualbudget.reference.formats.settings import engine_defaults
from dualbudget.spec.releases import RELEASE_VERSIONS


def family(name: str) -> Deployment:
    (deployment,) = [d for d in DEPLOYMENTS if d.family == name]
    return deployment


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
@pytest.mark.parametrize("served", [True, False], ids=["engine", "scheduler"])
def test_gpt_oss_at_vllms_defaults_replays(version: str, served: bool) -> None:
    """Served, vLLM's engine hands the sliding-window group retention 0; recorded at the
    scheduler's level it runs at the ``KVCacheConfig`` default None. The reference
    models both."""
    gpt_oss = family("gpt-oss + EAGLE3")
    recorded = gpt_oss.recorded_settings(served=served)
    assert recorded["prefix_cache_retention_interval"] == (0 if served else None)
    assert engine_defaults()["prefix_cache_retention_interval"] == 0
    assert gpt_oss.verdict(version, served=served) == "replays"


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
def test_qwen3_next_replays_whether_its_mamba_layers_checkpoint_inside_a_chunk(
    version: str,
) -> None:
    """Mamba in align mode with prefix caching is modelled, with the prefill checkpoint
    blocks FlashInfer's gated-delta-net prefill reserves and without (Triton's)."""
    assert family("Qwen3-Next + MTP, Triton prefill").verdict(version) == "replays"
    hopper = family("Qwen3-Next + MTP on Hopper (FlashInfer prefill)")
    assert hopper.recorded_settings()["mamba_prefill_checkpoint_blocks"] == 1
    assert hopper.verdict(version) == "replays"


@pytest.mark.parametrize("version", RELEASE_VERSIONS)
def test_llama_4_replays_with_prefix_caching_on_its_chunked_local_group(version: str) -> None:
    """Chunked local attention beside full attention, the drafter's layers in the
    full-attention group: no release drops the chunked group's last hit block."""
    assert family("Llama 4 + EAGLE3").verdict(version) == "replays"


def test_a_family_at_a_retention_vllm_refuses_is_refused_by_name() -> None:
    """A positive interval that is no multiple of the block size: vLLM's coordinator
    raises, and so does the engine config check, naming the setting."""
    gpt_oss = family("gpt-oss + EAGLE3")
    odd = Deployment(
        gpt_oss.family,
        gpt_oss.method,
        gpt_oss.num_speculative_tokens,
        gpt_oss.groups,
        {"prefix_cache_retention_interval": 24},
    )
    assert odd.verdict("0.33") == (
        "refused: prefix_cache_retention_interval: (24) must be >= 0 and a multiple of the"
        " scheduler block size (16)"
    )
