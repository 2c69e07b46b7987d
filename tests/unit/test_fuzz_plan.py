"""How ``dualbudget fuzz`` shares its examples out, without vLLM: every method gets its
share, every (method, aim) unit its own stable seed, and the coverage gate names every
layout it fuzzes."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from dualbudget.integration.aims import AIMS, admitted, aimed_config, reserve
from dualbudget.integration.coverage import EVENT_NAMES, required_events
from dualbudget.integration.fuzz import shares, top_up_units, unit_seed
from dualbudget.integration.outcome import FuzzResult
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.releases import RELEASES, release_named


@pytest.mark.parametrize("examples", [1, 7, 8, 30, 56, 64, 72, 200, 1001])
def test_shares_add_up_and_spread_over_the_methods(examples: int) -> None:
    layouts = list(LAYOUT_NAMES)
    units = shares(examples, layouts)
    assert sum(n for _, _, n in units) == examples
    assert all(n > 0 for _, _, n in units)
    per_layout = {layout: sum(n for lay, _, n in units if lay == layout) for layout in layouts}
    assert max(per_layout.values()) - min(per_layout.values()) <= 1
    if examples >= len(layouts) * len(AIMS):
        assert {(lay, aim) for lay, aim, _ in units} == {(x, a) for x in layouts for a in AIMS}


def test_unit_seeds_are_stable_and_distinct() -> None:
    seeds = {unit_seed(1, layout, aim) for layout in LAYOUT_NAMES for aim in AIMS}
    assert len(seeds) == len(LAYOUT_NAMES) * len(AIMS)
    # crc32, not hash(): the same in every process, whatever PYTHONHASHSEED.
    assert unit_seed(1, "ngram", "mixed") == 2131971352


def test_the_gate_requires_known_events_of_every_fuzzed_layout() -> None:
    for release in RELEASES.values():
        for layout in LAYOUT_NAMES:
            assert set(required_events(layout, release)) <= set(EVENT_NAMES)


PREFIX_EVENTS = (
    "prefix_hit",
    "full_prefix_hit",
    "cached_block_evicted",
    "hit_on_running_block",
    "resume_rehit",
)
"""The prefix-caching coverage names, required of every method in CI."""
ASYNC_ONLY_EVENTS = (
    "async_in_flight",
    "stale_output",
    "in_flight_max_tokens_skip",
    "stale_output_dropped",
)
"""The events only async scheduling reaches."""
DROPS_LAST_HIT_BLOCK_0_32 = {"eagle", "p-eagle", "dflash", "dspark-anchor", "dspark-fill-in"}
"""vLLM 0.32's ``use_eagle_block_drop`` drafters (eagle, eagle3, mtp, dflash, dspark): a hit
of n blocks keeps n - 1, so a prompt's hit never reaches num_tokens - 1."""


@pytest.mark.parametrize(
    ("release", "exempt_layouts"),
    [("0.32", {"ngram", "ngram-parallel"}), ("0.33", {"ngram-parallel"})],
)
def test_every_event_is_required_of_every_layout(release: str, exempt_layouts: set[str]) -> None:
    # No event is exempt: each has an aim that reaches it for every method (fuzz.py), but
    # the async-only ones where the release refuses async scheduling: ngram under 0.32,
    # ngram with parallel_drafting under 0.33 (plain ngram runs async there, on V2); and
    # a full prefix hit under 0.32 for the drafters that drop the last hit block; and
    # multi-module MTP's reserve off the row whose drafter may be MTP.
    for layout in LAYOUT_NAMES:
        exempt: tuple[str, ...] = ASYNC_ONLY_EVENTS if layout in exempt_layouts else ()
        if layout != "eagle":
            exempt += ("prefill_lookahead_reserved",)
        if release == "0.32" and layout in DROPS_LAST_HIT_BLOCK_0_32:
            exempt += ("full_prefix_hit",)
        expected = tuple(e for e in EVENT_NAMES if e not in exempt)
        assert required_events(layout, release_named(release)) == expected, (release, layout)


def test_the_prefix_events_are_counted_and_required_of_every_method() -> None:
    from dualbudget.reference.scheduler import PREFIX_OBSERVED

    assert PREFIX_OBSERVED == PREFIX_EVENTS  # the scheduler counts the names
    assert set(PREFIX_EVENTS) <= set(EVENT_NAMES)
    for release in RELEASES.values():
        for layout in LAYOUT_NAMES:
            required = set(required_events(layout, release))
            missing = set(PREFIX_EVENTS) - required
            if release.version == "0.32" and layout in DROPS_LAST_HIT_BLOCK_0_32:
                assert missing == {"full_prefix_hit"}, (release, layout)
            else:
                assert not missing, (release, layout)


@pytest.mark.parametrize("examples", [90, 200, 450, 1001])
def test_prefix_took_its_part_from_the_others_in_proportion(
    examples: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prefix`` and ``hybrid`` (weight 3 each), ``engine_calls`` (1) and ``edge``'s third
    weight raised the total weight from 12 to 20: every other aim keeps its part up to that
    proportion, each keeps at least one, ``edge`` at least its three at 200
    (docs/mutate.md), and ``prefix`` runs three."""
    from dataclasses import replace

    from dualbudget.integration import fuzz

    layouts = list(LAYOUT_NAMES)
    now = {(lay, aim): n for lay, aim, n in shares(examples, layouts)}
    added = ("prefix", "hybrid", "engine_calls")
    before = {name: aim for name, aim in AIMS.items() if name not in added}
    before["edge"] = replace(AIMS["edge"], weight=2)
    monkeypatch.setattr(fuzz, "AIMS", before)
    then = {(lay, aim): n for lay, aim, n in shares(examples, layouts)}
    for (layout, aim), n in then.items():
        if aim not in ("mixed", "edge"):
            assert max(1, n * 12 // 20 - 1) <= now[(layout, aim)] <= n
    for layout in layouts:
        assert now[(layout, "prefix")] >= (3 if examples >= 200 else 1)
        if examples >= 200:
            assert now[(layout, "edge")] >= 3
        assert sum(n for (lay, _), n in now.items() if lay == layout) == sum(
            n for (lay, _), n in then.items() if lay == layout
        )


@settings(max_examples=60, database=None, deadline=None)
@given(data=st.data(), layout=st.sampled_from(LAYOUT_NAMES))
def test_a_lone_config_grants_its_first_request_more_than_the_threshold(
    data: st.DataObject, layout: str
) -> None:
    for profile in ("vllm-0.32", "vllm-0.33"):
        config = data.draw(aimed_config(AIMS["lone"].configs, profile, layout))
        slots, lookahead = reserve(profile, layout, config.num_speculative_tokens)
        threshold = config.long_prefill_token_threshold
        assert 1 <= threshold < config.max_model_len - 1
        assert config.max_num_scheduled_tokens is None and config.enable_chunked_prefill
        assert config.max_num_batched_tokens - slots > threshold  # the first grant's room
        assert config.max_num_batched_tokens > lookahead  # never refused


@settings(max_examples=60, database=None, deadline=None)
@given(data=st.data(), layout=st.sampled_from(LAYOUT_NAMES))
def test_a_refund_config_admits_its_batch_where_admission_is_capped(
    data: st.DataObject, layout: str
) -> None:
    for profile in ("vllm-0.32", "vllm-0.33"):
        config = data.draw(aimed_config(AIMS["refund"].configs, profile, layout))
        k, b, seqs = (
            config.num_speculative_tokens,
            config.max_num_batched_tokens,
            config.max_num_seqs,
        )
        if admitted(profile, layout, k, 1, 8) < 8:
            assert profile == "vllm-0.33" and layout.startswith(("dflash", "dspark"))
            assert config.max_num_scheduled_tokens is not None  # the token budget binds
            assert admitted(profile, layout, k, b, seqs) == seqs


def test_top_up_rounds_have_seeds_of_their_own_and_round_0_is_the_planned_unit() -> None:
    # Round 0 keeps the planned unit's seed, so that a run needing no top-up is unchanged.
    assert unit_seed(1, "dflash", "refund", 0) == unit_seed(1, "dflash", "refund")
    rounds = {unit_seed(1, "dflash", "refund", r) for r in range(4)}
    assert len(rounds) == 4


def test_top_up_reruns_the_aims_of_the_events_left_at_zero_in_unit_order() -> None:
    layouts = ["dflash", "ngram"]
    result = FuzzResult(profile="vllm-0.32", vllm_version="0.32.0")
    for layout in layouts:
        result.coverage[layout] = dict.fromkeys(EVENT_NAMES, 1)
    assert top_up_units(result, layouts) == []
    result.coverage["ngram"]["bound_after_refund"] = 0
    result.coverage["dflash"]["resume_rehit"] = 0
    result.coverage["dflash"]["hit_on_running_block"] = 0
    result.coverage["dflash"]["input_budget_bound"] = 0
    assert top_up_units(result, layouts) == [
        ("dflash", "budget"),
        ("dflash", "prefix"),
        ("ngram", "refund"),
    ]
    # An event the release cannot reach is not required, so never rerun for.
    result.coverage["ngram"]["stale_output"] = 0  # 0.32 runs no ngram async
    assert ("ngram", "preempt") not in top_up_units(result, layouts)
