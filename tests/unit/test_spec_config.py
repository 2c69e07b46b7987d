"""What vLLM's SchedulerConfig/SpeculativeConfig refuse, refused here with the field named."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dualbudget.spec.config import ConfigError, EngineConfig, SpeculativeConfig, check_engine_config

BASE = EngineConfig(
    max_num_batched_tokens=32,
    max_num_seqs=4,
    max_model_len=64,
    block_size=16,
    num_gpu_blocks=32,
    speculative_config=SpeculativeConfig("eagle3", 3),
)


def test_base_is_accepted() -> None:
    check_engine_config(BASE)
    assert BASE.scheduled_tokens_cap == 32  # vLLM's default: max_num_batched_tokens


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"max_num_batched_tokens": -5}, "max_num_batched_tokens"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
        ({"block_size": -1}, "block_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_num_scheduled_tokens": 0}, "max_num_scheduled_tokens"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
        ({"long_prefill_token_threshold": 65}, "long_prefill_token_threshold"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy"),
        ({"max_num_seqs": 33}, "max_num_batched_tokens"),  # B >= max_num_seqs
        ({"enable_chunked_prefill": False}, "max_num_batched_tokens"),  # B < max_model_len
        (
            {"speculative_config": SpeculativeConfig("eagle3", 0)},
            "speculative_config.num_speculative_tokens",
        ),
        ({"speculative_config": SpeculativeConfig("medusa", 2)}, "speculative_config.method"),
    ],
)
def test_refused_with_the_field_named(change: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_engine_config(replace(BASE, **change))  # type: ignore[arg-type]
    assert caught.value.field == field
