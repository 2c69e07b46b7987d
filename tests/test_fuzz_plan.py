"""How ``dualbudget fuzz`` shares its examples out, without vLLM: every method gets its
share, every (method, aim) unit its own stable seed, and the coverage gate names every
layout it fuzzes."""

from __future__ import annotations

import pytest

from dualbudget.integration.fuzz import AIMS, REQUIRED_EVENTS, shares, unit_seed
from dualbudget.integration.lockstep import COVERAGE_EVENTS
from dualbudget.spec.methods import LAYOUT_NAMES


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
    assert set(REQUIRED_EVENTS) == set(LAYOUT_NAMES)
    for events in REQUIRED_EVENTS.values():
        assert set(events) <= set(COVERAGE_EVENTS)
