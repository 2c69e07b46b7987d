"""Multi-module MTP (``num_nextn_predict_layers`` > 1, K > 1): each module reads one
prompt token further past a prefill chunk, so vLLM ends no chunk within K tokens of the
prompt's end, caches none of a chunk's last K - 1 tokens until the next chunk, keeps them
below a sliding window and (0.33) hashes each block with the K tokens after it.

Hand-worked cases on the reference, each also run in lockstep against the installed vLLM
(an EAGLE drafter relabelled MTP: ``integration.live``), then crowds of requests on a
full-attention and a sliding-window + full-attention layout, sync and async, caching on
and off."""

from __future__ import annotations

import dataclasses

import pytest

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep
from dualbudget.reference.scheduler import Scheduler
from dualbudget.spec.config import ConfigError, EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.profiles import PROFILES, profile_named
from tests.multi_module_mtp_cases import MAMBA_ALIGN, PROMPT, K, mtp_config, sibling_run
from tests.releases import every_release


def first_step(config: EngineConfig, profile: str) -> tuple[Scheduler, int]:
    """The reference after one step with PROMPT waiting, a longer prompt behind it (vLLM
    applies the threshold only where a request could be starved): the tokens PROMPT got."""
    reference = make_scheduler(config, profile_named(profile))
    reference.handle(AddRequest("a", len(PROMPT), 4, prompt_token_ids=PROMPT))
    behind = tuple(range(500, 530))
    reference.handle(AddRequest("b", len(behind), 4, prompt_token_ids=behind))
    record = reference.handle(ScheduleStep())
    assert record is not None
    return reference, record.num_scheduled_tokens["a"]


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_config_reads_the_lookahead_as_vllm_does(profile: str) -> None:
    assert mtp_config(3).num_prefill_lookahead_tokens == K
    assert mtp_config(3).num_reprefillable_tokens == K - 1
    # One module, or K = 1: the drafter reads only the next token.
    assert mtp_config(1).num_prefill_lookahead_tokens == 1
    one_draft = mtp_config(3, speculative_config=SpeculativeConfig("mtp", 1))
    assert one_draft.num_prefill_lookahead_tokens == 1
    assert mtp_config(1).num_reprefillable_tokens == 0


def test_modules_belong_to_an_mtp_drafter() -> None:
    from dualbudget.spec.config import check_engine_config

    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        check_engine_config(mtp_config(3, speculative_config=SpeculativeConfig("eagle", K)))


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_chunk_ends_no_closer_than_k_to_the_prompts_end(profile: str) -> None:
    """A chunk of 8 of the 10 prompt tokens would leave 2 < K: it gives back 1 so that 3
    are left. One module reads only the next token: the chunk stays 8."""
    assert first_step(mtp_config(3), profile)[1] == 7
    assert first_step(mtp_config(1), profile)[1] == 8


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_reprefillable_tokens_are_cached_with_the_next_chunk(profile: str) -> None:
    """With caching, the first chunk (7 tokens) caches the full blocks of its first
    7 - (K - 1) = 5 tokens: one block, where one module's first chunk (8 tokens) caches
    two. After the second chunk the prompt's hashed blocks are cached either way."""
    many, scheduled = first_step(mtp_config(3, enable_prefix_caching=True), profile)
    assert scheduled == 7 and many.state.requests["a"].num_cached_blocks == 1
    one, scheduled = first_step(mtp_config(1, enable_prefix_caching=True), profile)
    assert scheduled == 8 and one.state.requests["a"].num_cached_blocks == 2
    many.handle(ModelOutput({"a": 0, "b": 0}))
    record = many.handle(ScheduleStep())
    assert record is not None and record.num_scheduled_tokens["a"] == 3
    # As far as the hashes go: 0.33 hashes each block with the K tokens after it, so the
    # second block of a 10-token prompt has none until a token is sampled.
    release = profile_named(profile).release
    num_hashes = 1 if release.num_hash_lookahead_tokens("mtp") else 2
    assert many.state.requests["a"].num_cached_blocks == num_hashes


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_sibling_hits_only_the_finalized_blocks(profile: str) -> None:
    """When the second SHARED is admitted (step 2) the first has cached the blocks of
    its first 16 tokens but K - 1 = 2: three blocks, where one module caches four.
    0.33 hashes ahead and drops no block: a hit of 12 tokens leaves 8 (one module: 16,
    4). 0.32 drops the hit's last block: 8 tokens hit, then 8 and 4 scheduled (one
    module: 12 hit, 8 scheduled, then a decode of 1)."""
    if profile_named(profile).release.drops_last_hit_block("mtp"):
        assert sibling_run(3, profile) == [8, 4]
        assert sibling_run(1, profile) == [8, 1]
    else:
        assert sibling_run(3, profile)[0] == 8
        assert sibling_run(1, profile)[0] == 4


def test_a_sliding_window_keeps_the_reprefillable_tokens() -> None:
    """SlidingWindowSpec.extra_retained_tokens: K - 1 tokens past the window are kept."""
    from dualbudget.reference.kv.kinds import single_type_manager

    window = KVGroup("sliding_window", 4, sliding_window=4)
    config = mtp_config(3, kv_groups=(window, KVGroup("full_attention", 4)))
    manager = single_type_manager(window, config)
    # 20 computed tokens: the window holds the last 3 + 1; 2 more are retained.
    assert manager.num_skipped_tokens(20) == 20 - 3 - (K - 1)
    one = single_type_manager(window, mtp_config(1, kv_groups=config.kv_groups))
    assert one.num_skipped_tokens(20) == 20 - 3


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_lookahead_longer_than_a_dropped_block_is_refused_where_vllm_refuses(
    profile: str,
) -> None:
    """vLLM's coordinator refuses, with caching, a lookahead longer than a scheduler
    block where some group drops its hit's last block: 0.32 drops it for MTP (every
    group); 0.33 hashes ahead instead, so only a group marked as the drafter's drops."""
    small = mtp_config(3, block_size=2, enable_prefix_caching=True)
    release = profile_named(profile).release
    if release.drops_last_hit_block("mtp"):
        with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
            make_scheduler(small, profile_named(profile))
    else:
        make_scheduler(small, profile_named(profile))
        marked = dataclasses.replace(
            small, kv_groups=(KVGroup("full_attention", 2, is_eagle_group=True),)
        )
        with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
            make_scheduler(marked, profile_named(profile))


def mamba_first_chunk(profile: str) -> int:
    """A 14-token prompt alone, prefix caching on, Mamba align: its first chunk."""
    config = mtp_config(3, long_prefill_token_threshold=0, enable_prefix_caching=True)
    config = dataclasses.replace(config, kv_groups=MAMBA_ALIGN)
    reference = make_scheduler(config, profile_named(profile))
    reference.handle(AddRequest("a", 14, 4, prompt_token_ids=tuple(range(200, 214))))
    record = reference.handle(ScheduleStep())
    assert record is not None
    return record.num_scheduled_tokens["a"]


@every_release
def test_a_mamba_chunk_ends_at_the_last_state_the_hashes_can_prove(profile: str) -> None:
    """The chunk ends at the prompt's last reusable Mamba state, 8 in every release: from
    0.33 on, vLLM hashes each block with the K = 3 tokens after it, so that state leaves K tokens to
    recompute (14 - 3 = 11, down to a block: 8); 0.32 drops the drafter's last block
    (12 - 4). Leaving one token, as a drafter reading one token past a chunk does, would
    end the chunk at 12, and the reserve cut it to 11."""
    assert mamba_first_chunk(profile) == 8
