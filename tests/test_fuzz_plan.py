"""How ``dualbudget fuzz`` shares its examples out, without vLLM: every method gets its
share, every (method, aim) unit its own stable seed, and the coverage gate names every
layout it fuzzes."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from dualbudget.integration.fuzz import AIMS, required_events, shares, unit_seed
from dualbudget.integration.lockstep import COVERAGE_EVENTS
from dualbudget.spec.methods import LAYOUT_NAMES, VLLM_VERSIONS


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
    for release in VLLM_VERSIONS:
        for layout in LAYOUT_NAMES:
            assert set(required_events(layout, release)) <= set(COVERAGE_EVENTS)


@pytest.mark.parametrize(
    ("release", "exempt_layouts"),
    [("0.32", {"ngram", "ngram-parallel"}), ("0.33", {"ngram-parallel"})],
)
def test_every_event_is_required_of_every_layout(release: str, exempt_layouts: set[str]) -> None:
    # No event is exempt: each has an aim that reaches it for every method (fuzz.py), but
    # the async-only ones where the release refuses async scheduling: ngram under 0.32,
    # ngram with parallel_drafting under 0.33 (plain ngram runs async there, on V2).
    from dualbudget.integration.fuzz import ASYNC_ONLY_EVENTS

    for layout in LAYOUT_NAMES:
        exempt = ASYNC_ONLY_EVENTS if layout in exempt_layouts else ()
        expected = tuple(e for e in COVERAGE_EVENTS if e not in exempt)
        assert required_events(layout, release) == expected, (release, layout)


@pytest.mark.parametrize("examples", [90, 200, 450, 1001])
def test_lone_and_edge_left_every_other_aims_part_as_it_was(
    examples: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lone`` (weight 1) and ``edge``'s second weight came out of ``mixed``'s 2: the
    total weight is the same, so every other aim but ``mixed`` (which takes the rest)
    keeps its part, and ``edge`` has at least its old one."""
    from dataclasses import replace

    from dualbudget.integration import fuzz

    layouts = list(LAYOUT_NAMES)
    now = {(lay, aim): n for lay, aim, n in shares(examples, layouts)}
    before = {name: aim for name, aim in AIMS.items() if name != "lone"}
    before["mixed"] = replace(AIMS["mixed"], weight=2)
    before["edge"] = replace(AIMS["edge"], weight=1)
    monkeypatch.setattr(fuzz, "AIMS", before)
    then = {(lay, aim): n for lay, aim, n in shares(examples, layouts)}
    for (layout, aim), n in then.items():
        if aim == "edge":
            assert now[(layout, aim)] >= n
        elif aim != "mixed":
            assert now[(layout, aim)] == n
    for layout in layouts:
        assert now[(layout, "lone")] >= 1
        assert sum(n for (lay, _), n in now.items() if lay == layout) == sum(
            n for (lay, _), n in then.items() if lay == layout
        )


@settings(max_examples=60, database=None, deadline=None)
@given(data=st.data(), layout=st.sampled_from(LAYOUT_NAMES))
def test_a_lone_config_grants_its_first_request_more_than_the_threshold(
    data: st.DataObject, layout: str
) -> None:
    from dualbudget.integration.machine import _reserve, lone_config

    for profile in ("vllm-0.32", "vllm-0.33"):
        config = data.draw(lone_config(profile, layout))
        slots, lookahead = _reserve(profile, layout, config.num_speculative_tokens)
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
    from dualbudget.integration.machine import _admitted, refund_config

    for profile in ("vllm-0.32", "vllm-0.33"):
        config = data.draw(refund_config(profile, layout))
        k, b, seqs = (
            config.num_speculative_tokens,
            config.max_num_batched_tokens,
            config.max_num_seqs,
        )
        if _admitted(profile, layout, k, 1, 8) < 8:
            assert profile == "vllm-0.33" and layout.startswith(("dflash", "dspark"))
            assert config.max_num_scheduled_tokens is not None  # the token budget binds
            assert _admitted(profile, layout, k, b, seqs) == seqs
