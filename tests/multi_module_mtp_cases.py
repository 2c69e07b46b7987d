"""Multi-module MTP's worked inputs, shared by its reference tests
(``test_multi_module_mtp.py``) and its live ones (``test_multi_module_mtp_live.py``): the
configuration at K = 3, the prompts that put a chunk's end within K of a prompt's end, and
the sibling run that reads which blocks a second request hits."""

from __future__ import annotations

import dataclasses

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.profiles import profile_named

K = 3
PROMPT = tuple(range(100, 110))
"""Ten prompt tokens: a chunk of 8 leaves 2, within K = 3 of the end."""


def mtp_config(modules: int, **changes: object) -> EngineConfig:
    """MTP with K = 3 and ``modules`` modules; chunks of at most 8 tokens
    (``long_prefill_token_threshold``), blocks of 4 tokens."""
    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=64,
        long_prefill_token_threshold=8,
        speculative_config=SpeculativeConfig("mtp", K),
        num_nextn_predict_layers=modules,
    )
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


SHARED = tuple(range(20))
"""A prompt two requests share: chunks of 8 leave 12, then 4, never within K."""


def sibling_run(modules: int, profile: str) -> list[int]:
    """SHARED and a long prompt start (step 1: 8 tokens each); SHARED again arrives
    before step 2, when the first has cached its first chunk's blocks and is caching its
    second's: the second one's tokens in steps 2 and 3. No drafts are proposed."""
    config = mtp_config(modules, enable_prefix_caching=True)
    reference = make_scheduler(config, profile_named(profile))
    reference.handle(AddRequest("a", len(SHARED), 4, prompt_token_ids=SHARED))
    long = tuple(range(500, 530))
    reference.handle(AddRequest("c", len(long), 4, prompt_token_ids=long))
    reference.handle(ScheduleStep())
    reference.handle(ModelOutput({"a": 0, "c": 0}))
    reference.handle(AddRequest("b", len(SHARED), 4, prompt_token_ids=SHARED))
    scheduled = []
    for _ in range(2):
        record = reference.handle(ScheduleStep())
        assert record is not None
        scheduled.append(record.num_scheduled_tokens.get("b", 0))
        done = reference.state.requests
        sampled = {
            rid: int(done[rid].num_computed_tokens >= done[rid].prompt_len)
            for rid in record.num_scheduled_tokens
        }
        reference.handle(
            ModelOutput(sampled, token_ids={rid: (7,) * n for rid, n in sampled.items() if n})
        )
    return scheduled


MAMBA_ALIGN = (KVGroup("mamba", 4, mamba_cache_mode="align"), KVGroup("full_attention", 4))
"""Qwen3-Next's layout at blocks of 4: Mamba in align mode beside full attention."""
