"""The recorder reads every setting of the table from the live vLLM (needs vLLM;
docs/vllm-environments.md): each engine-scope row from a real ``VllmConfig`` and
``KVCacheConfig``, each request-scope row from a real ``Request``, at vLLM's default and
at a value other than it, and the trace it writes names them.

The CPU build cannot start an engine with pipeline parallelism, decode context
parallelism, a KV connector or routed-experts output (they need several devices, a
transfer backend or an MoE model), nor LoRA or multimodal inputs without such a model: for
those rows the value is set on the config (or request) vLLM built, the very objects the
recorder reads, so the test pins the field each release keeps it in, not vLLM's check of
it. Without vLLM these tests fail under CI=true, else skip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dualbudget.reference.replay import check_settings
from dualbudget.reference.scenario import Acceptance, RequestSpec, Scenario, validate
from dualbudget.reference.settings import (
    ENGINE_SETTINGS,
    KV_SPEC_KINDS,
    REQUEST_SETTINGS,
    SETTINGS,
    assumed_request_settings,
    first_unreplayed,
)
from dualbudget.reference.trace import TraceError, read_trace
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.profiles import profile_named

pytestmark = pytest.mark.live

CONFIG = EngineConfig(
    max_num_batched_tokens=64,
    max_num_seqs=4,
    max_model_len=64,
    block_size=16,
    num_gpu_blocks=32,
    speculative_config=SpeculativeConfig("ngram", 2),
    enable_prefix_caching=True,
)


def _kv_transfer(vllm_config: Any) -> None:
    from vllm.config import KVTransferConfig

    vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both"
    )


def _setter(path: str, value: Any) -> Callable[[Any], None]:
    def set_it(vllm_config: Any) -> None:
        owner, _, name = path.rpartition(".")
        target = vllm_config
        for part in owner.split("."):
            target = getattr(target, part)
        object.__setattr__(target, name, value)

    return set_it


ENGINE_CHANGES: dict[str, tuple[Callable[[Any], None], Any]] = {
    "enable_prefix_caching": (_setter("cache_config.enable_prefix_caching", False), False),
    "max_num_active_seqs": (_setter("scheduler_config.max_num_active_seqs", 3), 3),
    "watermark": (_setter("scheduler_config.watermark", 0.01), 0.01),
    "scheduler_reserve_full_isl": (
        _setter("scheduler_config.scheduler_reserve_full_isl", False),
        False,
    ),
    "long_prefill_token_threshold_adaptive": (
        _setter("scheduler_config.long_prefill_token_threshold_adaptive", True),
        True,
    ),
    "prefill_schedule_interval": (_setter("scheduler_config.prefill_schedule_interval", 2), 2),
    "num_speculative_tokens_per_batch_size": (
        _setter("speculative_config.num_speculative_tokens_per_batch_size", [[1, 8, 2]]),
        [[1, 8, 2]],
    ),
    "disable_eagle_block_drop": (
        _setter("speculative_config.disable_eagle_block_drop", True),
        True,
    ),
    "kv_connector": (_kv_transfer, "OffloadingConnector"),
    "pipeline_parallel_size": (_setter("parallel_config.pipeline_parallel_size", 2), 2),
    "decode_context_parallel_size": (
        _setter("parallel_config.decode_context_parallel_size", 2),
        2,
    ),
    "disable_chunked_mm_input": (_setter("scheduler_config.disable_chunked_mm_input", True), True),
    "enable_return_routed_experts": (
        _setter("aux_output_config.enable_return_routed_experts", True),
        True,
    ),
}
"""Per engine-scope row the recorder reads from the ``VllmConfig``: how to set it to a
value other than vLLM's default, and the value the header must then hold."""

ELSEWHERE = {
    "num_nextn_predict_layers": "an MTP drafter's hf_config: no MTP model builds on CPU",
    "disable_lookahead_block_hashes": "0.33's speculative_config only: set below per release",
    "kv_cache_groups": "the KVCacheConfig, not the VllmConfig: HYBRID below",
    "enable_lora": "lora_config is a whole LoRAConfig: set below",
}


@pytest.fixture(scope="module")
def live() -> Any:
    from dualbudget.integration.live import LiveScheduler

    return LiveScheduler(CONFIG)


def test_every_engine_row_is_read_here() -> None:
    assert set(ENGINE_CHANGES) | set(ELSEWHERE) == set(ENGINE_SETTINGS)


def test_at_vllms_defaults_the_recorder_reads_the_defaults(live: Any) -> None:
    from dualbudget.integration.recorder import settings_of

    values = settings_of(live.vllm_config, live.kv_cache_config)
    for setting in SETTINGS:
        if setting.scope == "engine" and setting.name != "enable_prefix_caching":
            assert values[setting.name] == setting.default, setting.name


@pytest.mark.parametrize("name", sorted(ENGINE_CHANGES))
def test_the_recorder_reads_each_engine_row(live: Any, name: str) -> None:
    from dualbudget.integration.live import build_vllm_config
    from dualbudget.integration.recorder import settings_of

    vllm_config, _ = build_vllm_config(CONFIG)
    change, wanted = ENGINE_CHANGES[name]
    change(vllm_config)
    assert settings_of(vllm_config, live.kv_cache_config)[name] == wanted


def test_the_recorder_reads_lora_and_the_lookahead_switch(live: Any) -> None:
    from vllm.config import LoRAConfig

    from dualbudget.integration.live import build_vllm_config
    from dualbudget.integration.recorder import settings_of

    vllm_config, _ = build_vllm_config(CONFIG)
    vllm_config.lora_config = LoRAConfig(max_loras=2)
    speculative = vllm_config.speculative_config
    has_switch = hasattr(speculative, "disable_lookahead_block_hashes")
    assert has_switch == (not live.version.startswith("0.32"))
    if has_switch:
        object.__setattr__(speculative, "disable_lookahead_block_hashes", True)
    values = settings_of(vllm_config, live.kv_cache_config)
    assert values["enable_lora"] is True
    assert values["disable_lookahead_block_hashes"] is has_switch


def _request(**sampling: Any) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(
        request_id="r",
        prompt_token_ids=[1, 2, 3, 4],
        sampling_params=SamplingParams(max_tokens=4, **sampling),
        pooling_params=None,
    )


def test_the_recorder_reads_each_request_row() -> None:
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import RepetitionDetectionParams, StructuredOutputsParams

    from dualbudget.integration.recorder import request_settings_of

    assert request_settings_of(_request()) == assumed_request_settings()
    repeated = RepetitionDetectionParams(max_pattern_size=4, min_pattern_size=1, min_count=3)
    changed = {
        "structured_outputs": _request(structured_outputs=StructuredOutputsParams(json={})),
        "skip_reading_prefix_cache": _request(prompt_logprobs=1),
        "repetition_detection": _request(repetition_detection=repeated),
        "mm_encoder_inputs": _request(),
    }
    changed["mm_encoder_inputs"].mm_features = [
        MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier="i",
            mm_position=PlaceholderRange(offset=0, length=2),
        )
    ]
    assert set(changed) == set(REQUEST_SETTINGS)
    for name, request in changed.items():
        assert request_settings_of(request)[name] is True, name


def test_a_recorded_trace_is_refused_naming_a_request_row(tmp_path: Path) -> None:
    from vllm.sampling_params import RepetitionDetectionParams

    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.recorder import TRACE_ENV, RecordingScheduler

    path = tmp_path / "t.ndjson"
    config = dataclasses.replace(CONFIG, enable_prefix_caching=False)
    repeated = RepetitionDetectionParams(max_pattern_size=4, min_pattern_size=1, min_count=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TRACE_ENV, str(path))
        live = LiveScheduler(config, scheduler_cls=RecordingScheduler)
        live.scheduler.add_request(_request(repetition_detection=repeated))
        live.scheduler.shutdown()
    trace = read_trace(path)
    assert tuple(trace.header.settings) == ENGINE_SETTINGS
    assert trace.request_settings == {"r": {"repetition_detection": True}}
    with pytest.raises(TraceError, match="repetition_detection = true \\(request 'r'\\)"):
        check_settings(trace, profile_named(f"vllm-{live.version[:4]}"))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_ngram_gpu_schedules_as_the_ngram_row(async_scheduling: bool) -> None:
    """vLLM builds ``ngram_gpu`` natively on CPU too; its scheduler treats it as n-gram
    (no lookahead slots, no drafting slots, async-capable): lockstep on the n-gram row."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.lockstep import run_in_lockstep
    from dualbudget.integration.testing import live_profile_name

    config = dataclasses.replace(
        CONFIG,
        speculative_config=SpeculativeConfig("ngram_gpu", 2),
        async_scheduling=async_scheduling,
        enable_prefix_caching=False,
    )
    requests = tuple(RequestSpec(str(i), 20 + 7 * i, 12, i) for i in range(5))
    scenario = validate(Scenario(live_profile_name(), config, requests, Acceptance(fixed=1)))
    live = LiveScheduler(config)
    assert live.vllm_config.speculative_config.method == "ngram_gpu"
    assert live.vllm_config.num_lookahead_tokens == 0
    steps, divergence = run_in_lockstep(scenario, live=live, max_steps=40)
    assert divergence is None and steps > 10


HYBRID = {
    "sliding window + full": (
        KVGroup("sliding_window", 16, sliding_window=32),
        KVGroup("full_attention", 16),
    ),
    "MLA": (KVGroup("mla_attention", 16),),
    "Mamba align + full": (
        KVGroup("mamba", 16, mamba_cache_mode="align"),
        KVGroup("full_attention", 16),
    ),
}


@pytest.mark.parametrize("name", sorted(HYBRID))
def test_the_recorder_writes_the_kv_groups_vllm_built(name: str) -> None:
    """From a ``KVCacheConfig`` of several groups, as vLLM's scheduler is built on it, the
    recorder writes the same ``config.kv_groups`` and the spec classes, which replay reads
    as one layout it models."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.recorder import engine_config_of, kv_groups_of, settings_of
    from dualbudget.integration.testing import live_profile_name

    config = dataclasses.replace(CONFIG, num_gpu_blocks=64, kv_groups=HYBRID[name])
    live = LiveScheduler(config)
    groups = kv_groups_of(live.vllm_config, live.kv_cache_config)
    assert groups == config.kv_groups
    settings = settings_of(live.vllm_config, live.kv_cache_config)
    assert [KV_SPEC_KINDS[spec] for spec in settings["kv_cache_groups"]] == [
        group.kind for group in groups
    ]
    recorded = engine_config_of(live.vllm_config, 64, False, groups)
    assert first_unreplayed(settings, recorded, profile_named(live_profile_name())) is None
