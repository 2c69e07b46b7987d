"""The aims' one config builder (``integration.aims.aimed_config``), without vLLM: every
config it draws for an aim lies within the aim's row (``ConfigBounds``) and, but for
``mixed``'s, is one vLLM and the reference accept under each release's own profile."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import assume, find, given, settings

from dualbudget.integration.aims import (
    AIMS,
    ConfigBounds,
    PerDraft,
    Pool,
    TokenBudget,
    admission_capped,
    aimed_config,
    full_request_blocks,
    reserve,
)
from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.kv.kinds import caching_modelled
from dualbudget.spec.config import RETENTION_KINDS, ConfigError, EngineConfig, check_engine_config
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.profiles import profile_named
from dualbudget.spec.releases import RELEASES

PROFILES = [release.profile_name for release in RELEASES.values()]


def _within(config: EngineConfig, bounds: ConfigBounds, profile: str, layout: str) -> None:
    k = config.num_speculative_tokens
    slots, lookahead = reserve(profile, layout, k)
    b, seqs = config.max_num_batched_tokens, config.max_num_seqs
    assert 1 <= k <= 5 and config.layout is not None and config.layout.name == layout
    assert config.block_size in bounds.block_sizes
    if bounds.max_model_len_in_k is None:
        assert config.max_model_len in bounds.max_model_lens
    else:
        shortest, longest = bounds.max_model_len_in_k
        assert shortest.at(k, slots) <= config.max_model_len <= longest.at(k, slots)
    threshold = config.long_prefill_token_threshold
    assert any(
        least <= threshold <= (config.max_model_len if most is None else most)
        for least, most in bounds.thresholds
    )
    assert bounds.max_num_seqs[0] <= seqs <= bounds.max_num_seqs[1]
    assert config.enable_chunked_prefill in bounds.chunked_prefill
    assert config.scheduling_policy in bounds.policies
    if bounds.layout_caching and all(caching_modelled(group) for group in config.groups):
        assert config.enable_prefix_caching in (bounds.prefix_caching, True)
    else:
        assert config.enable_prefix_caching == bounds.prefix_caching
    thinned = any(group.kind in RETENTION_KINDS for group in config.groups)
    if bounds.layout_caching and config.enable_prefix_caching and thinned:
        assert config.prefix_cache_retention_interval in (0, None)
    else:
        assert config.prefix_cache_retention_interval is None
    if config.num_nextn_predict_layers is not None:
        assert config.multi_module_mtp and config.num_nextn_predict_layers == k
        assert config.block_size >= k or not config.enable_prefix_caching
    aligned = any(group.mamba_cache_mode == "align" for group in config.groups)
    assert config.mamba_prefill_checkpoint_blocks in ((0, 1) if aligned else (0,))
    need = full_request_blocks(config.max_model_len, config.block_size, config.kv_groups)
    if bounds.kv_layouts:
        drawn = [tuple(shape.at(config.block_size) for shape in kv) for kv in bounds.kv_layouts]
        assert config.kv_groups in drawn
    else:
        assert config.kv_groups == ()
    assert any(
        low <= config.num_gpu_blocks <= high
        for low, high in (pool.range_at(need, seqs) for pool in bounds.pools)
    )
    assert b >= max(bounds.floor, seqs)
    if not bounds.refused_too:
        assert b >= lookahead + 2
    if bounds.fits_decode_batch:
        assert b > seqs * (1 + k + slots)
    if bounds.first_grant_above_threshold:
        assert b - slots > threshold + 1
    if bounds.admits_max_num_seqs and admission_capped(profile, layout, k):
        assert b >= seqs * lookahead
    cap = config.max_num_scheduled_tokens
    ranges = [pair.token.range_at(b, k) for pair in bounds.budgets]
    assert any(
        cap is None if token is None else cap is not None and token[0] <= cap <= token[1]
        for token in ranges
    )


@pytest.mark.parametrize("aim", list(AIMS))
@settings(max_examples=40, database=None, deadline=None)
@given(data=st.data(), layout=st.sampled_from(LAYOUT_NAMES), profile=st.sampled_from(PROFILES))
def test_every_drawn_config_lies_within_its_aims_row(
    aim: str, data: st.DataObject, layout: str, profile: str
) -> None:
    # A method the profile's release does not build is never drawn for it (Release.layouts).
    assume(layout in profile_named(profile).release.layouts)
    bounds = AIMS[aim].configs
    config = data.draw(aimed_config(bounds, profile, layout))
    _within(config, bounds, profile, layout)
    check_engine_config(config)  # vLLM's SchedulerConfig checks: B >= seqs, ...
    if not bounds.refused_too:  # an aimed config is never refused
        profile_named(profile).policy.validate(config)
        make_scheduler(config, profile_named(profile))


@pytest.mark.parametrize("retention", [0, None])
def test_the_hybrid_aim_draws_a_sliding_window_at_both_retentions(retention: int | None) -> None:
    """vLLM's engine default 0 (sparse) in most caching-on sliding-window draws, the
    ``KVCacheConfig`` default None (dense) in some."""
    config = find(
        aimed_config(AIMS["hybrid"].configs, "vllm-0.33", "eagle"),
        lambda config: (
            config.enable_prefix_caching
            and config.groups[0].kind == "sliding_window"
            and config.prefix_cache_retention_interval == retention
        ),
        settings=settings(max_examples=2000, database=None),
    )
    check_engine_config(config)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_hybrid_aim_draws_chunked_local_attention_with_caching_the_reference_runs(
    profile: str,
) -> None:
    """Llama 4's layout with prefix caching on, the drafter's layers in the full-attention
    group, so that no release drops the chunked group's last hit block (which vLLM
    asserts against and the reference refuses)."""
    config = find(
        aimed_config(AIMS["hybrid"].configs, profile, "eagle"),
        lambda config: (
            config.enable_prefix_caching and config.groups[0].kind == "chunked_local_attention"
        ),
        settings=settings(max_examples=2000, database=None),
    )
    make_scheduler(config, profile_named(profile))


@pytest.mark.parametrize("aim", ["prefix", "hybrid"])
def test_the_eagle_row_draws_multi_module_mtp_with_prefix_caching(aim: str) -> None:
    """The EAGLE row's drafter is now and then MTP of K > 1 modules, with prefix caching
    on (where its re-prefilled tokens and 0.33's K-token hash lookahead act)."""
    config = find(
        aimed_config(AIMS[aim].configs, "vllm-0.33", "eagle"),
        lambda config: config.multi_module_mtp and config.enable_prefix_caching,
        settings=settings(max_examples=2000, database=None),
    )
    make_scheduler(config, profile_named("vllm-0.33"))


def test_mixed_alone_may_draw_a_refused_config() -> None:
    assert [name for name, aim in AIMS.items() if aim.configs.refused_too] == ["mixed"]

    def refused(config: EngineConfig) -> bool:
        try:
            profile_named("vllm-0.33").policy.validate(config)
        except ConfigError:
            return True
        return False

    # A buffer at or below DFlash's lookahead: vLLM 0.33 refuses it.
    config = find(
        aimed_config(AIMS["mixed"].configs, "vllm-0.33", "dflash"),
        refused,
        settings=settings(max_examples=2000, database=None),
    )
    assert config.max_num_batched_tokens <= config.num_speculative_tokens + 1


def test_the_bounds_arithmetic() -> None:
    assert PerDraft(3, 3, 8).at(2, 1) == 3 + 6 + 8
    assert Pool(1, 1.5).range_at(10, 4) == (10, 15)
    assert Pool(0, 2, per_seq=True).range_at(10, 4) == (40, 60)
    assert Pool(1, 1, extra_blocks=4).range_at(10, 4) == (10, 14)
    assert TokenBudget.DEFAULT.range_at(16, 3) is None
    assert TokenBudget.ABOVE_B.range_at(16, 3) == (17, 40)
    assert TokenBudget.DECODE_WIDTHS.range_at(16, 3) == (9, 12)


@settings(max_examples=30, database=None, deadline=None)
@given(data=st.data(), layout=st.sampled_from(LAYOUT_NAMES))
def test_the_budget_aim_draws_a_token_budget_above_b_where_no_slots_are_reserved(
    data: st.DataObject, layout: str
) -> None:
    for profile in PROFILES:
        config = data.draw(aimed_config(AIMS["budget"].configs, profile, layout))
        slots, _ = reserve(profile, layout, config.num_speculative_tokens)
        if slots == 0:  # only a token budget above B lets the input budget bind
            cap = config.max_num_scheduled_tokens
            assert cap is not None and cap > config.max_num_batched_tokens
