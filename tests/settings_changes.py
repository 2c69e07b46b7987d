"""How a live vLLM holds each row of the settings table at a value other than its default:
the changes tests/live/test_settings_live.py makes to the objects vLLM built, and that
tests/unit/test_settings.py holds to the table, so that a new row without one fails outside
the vLLM environments too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig

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


def _lora(vllm_config: Any) -> None:
    from vllm.config import LoRAConfig

    vllm_config.lora_config = LoRAConfig(max_loras=2)


def _mtp_modules(vllm_config: Any) -> None:
    # No MTP model builds on CPU: the EAGLE drafter's config, relabelled as vLLM labels
    # an MTP drafter's, holds the field the recorder reads.
    speculative = vllm_config.speculative_config
    object.__setattr__(speculative, "method", "mtp")
    speculative.draft_model_config.hf_config.num_nextn_predict_layers = 3


def _setter(path: str, value: Any) -> Callable[[Any], None]:
    def set_it(vllm_config: Any) -> None:
        owner, _, name = path.rpartition(".")
        target = vllm_config
        for part in owner.split("."):
            target = getattr(target, part)
        object.__setattr__(target, name, value)

    return set_it


@dataclasses.dataclass(frozen=True)
class EngineChange:
    """How to set an engine-scope row on a ``VllmConfig`` vLLM built from ``config``, and
    the value the header must then hold."""

    change: Callable[[Any], None]
    value: Any
    config: EngineConfig = CONFIG


@dataclasses.dataclass(frozen=True)
class RequestChange:
    """A ``Request`` holding a request-scope row at a value other than vLLM's default."""

    request: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class GroupsChange:
    """A live scheduler built on the KV groups ``config`` names, and the spec classes the
    header must then hold."""

    config: EngineConfig
    value: Any


@dataclasses.dataclass(frozen=True)
class KVCacheChange:
    """The live ``KVCacheConfig`` with a row at ``value``, as vLLM's engine sets it from
    its cache config."""

    value: Any


@dataclasses.dataclass(frozen=True)
class SpecChange:
    """A live scheduler on ``config``'s groups whose first group's spec has ``field`` at
    ``to``, as a model's layers set it (the CPU build's layers set none), and the value
    the header must then hold."""

    config: EngineConfig
    field: str
    to: Any
    value: Any


MAMBA = dataclasses.replace(
    CONFIG,
    num_gpu_blocks=64,
    kv_groups=(KVGroup("mamba", 16, mamba_cache_mode="align"), KVGroup("full_attention", 16)),
)
SLIDING_MLA = dataclasses.replace(
    CONFIG,
    num_gpu_blocks=64,
    kv_groups=(
        KVGroup("sliding_window_mla", 16, sliding_window=32),
        KVGroup("mla_attention", 16),
    ),
)


def live_request(**sampling: Any) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(
        request_id="r",
        prompt_token_ids=[1, 2, 3, 4],
        sampling_params=SamplingParams(max_tokens=4, **sampling),
        pooling_params=None,
    )


def _structured() -> Any:
    from vllm.sampling_params import StructuredOutputsParams

    return live_request(structured_outputs=StructuredOutputsParams(json={}))


def _repeating() -> Any:
    from vllm.sampling_params import RepetitionDetectionParams

    repeated = RepetitionDetectionParams(max_pattern_size=4, min_pattern_size=1, min_count=3)
    return live_request(repetition_detection=repeated)


def _with_image() -> Any:
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    request = live_request()
    request.mm_features = [
        MultiModalFeatureSpec(
            data=None, modality="image", identifier="i", mm_position=PlaceholderRange(0, 2)
        )
    ]
    return request


EAGLE = dataclasses.replace(CONFIG, speculative_config=SpeculativeConfig("eagle", 2))

CHANGES: dict[str, EngineChange | RequestChange | GroupsChange | KVCacheChange | SpecChange] = {
    "enable_prefix_caching": EngineChange(
        _setter("cache_config.enable_prefix_caching", False), False
    ),
    "max_num_active_seqs": EngineChange(_setter("scheduler_config.max_num_active_seqs", 3), 3),
    "watermark": EngineChange(_setter("scheduler_config.watermark", 0.01), 0.01),
    "cache_aware_admission_window": EngineChange(
        _setter("scheduler_config.cache_aware_admission_window", 8), 8
    ),
    "scheduler_reserve_full_isl": EngineChange(
        _setter("scheduler_config.scheduler_reserve_full_isl", False), False
    ),
    "long_prefill_token_threshold_adaptive": EngineChange(
        _setter("scheduler_config.long_prefill_token_threshold_adaptive", True), True
    ),
    "prefill_schedule_interval": EngineChange(
        _setter("scheduler_config.prefill_schedule_interval", 2), 2
    ),
    "num_speculative_tokens_per_batch_size": EngineChange(
        _setter("speculative_config.num_speculative_tokens_per_batch_size", [[1, 8, 2]]),
        [[1, 8, 2]],
    ),
    "num_nextn_predict_layers": EngineChange(_mtp_modules, 3, EAGLE),
    "disable_eagle_block_drop": EngineChange(
        _setter("speculative_config.disable_eagle_block_drop", True), True, EAGLE
    ),
    "disable_lookahead_block_hashes": EngineChange(
        _setter("speculative_config.disable_lookahead_block_hashes", True), True, EAGLE
    ),
    "kv_cache_groups": GroupsChange(
        dataclasses.replace(
            CONFIG,
            num_gpu_blocks=64,
            kv_groups=(
                KVGroup("sliding_window", 16, sliding_window=32),
                KVGroup("full_attention", 16),
            ),
        ),
        ["SlidingWindowSpec", "FullAttentionSpec"],
    ),
    "prefix_cache_retention_interval": KVCacheChange(0),
    "mamba_prefill_checkpoint_blocks": SpecChange(MAMBA, "num_prefill_checkpoint_blocks", 1, 1),
    "prefix_replay_tokens": SpecChange(SLIDING_MLA, "bounded_replay", True, 32),
    "prefix_match_unit": EngineChange(_setter("cache_config.prefix_match_unit", 8), 8),
    "enable_mamba_shared_prefix_checkpoint": EngineChange(
        _setter("cache_config.enable_mamba_shared_prefix_checkpoint", True), True
    ),
    "enable_lora": EngineChange(_lora, True),
    "kv_connector": EngineChange(_kv_transfer, "OffloadingConnector"),
    "pipeline_parallel_size": EngineChange(_setter("parallel_config.pipeline_parallel_size", 2), 2),
    "decode_context_parallel_size": EngineChange(
        _setter("parallel_config.decode_context_parallel_size", 2), 2
    ),
    "disable_chunked_mm_input": EngineChange(
        _setter("scheduler_config.disable_chunked_mm_input", True), True
    ),
    "enable_return_routed_experts": EngineChange(
        _setter("aux_output_config.enable_return_routed_experts", True), True
    ),
    "structured_outputs": RequestChange(_structured),
    "skip_reading_prefix_cache": RequestChange(lambda: live_request(prompt_logprobs=1)),
    "mm_encoder_inputs": RequestChange(_with_image),
    "repetition_detection": RequestChange(_repeating),
}
"""Per row of the table, how a live vLLM holds it at a value other than its default. A
row missing here fails its test below."""
