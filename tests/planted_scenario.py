"""Differences planted in the reference, each found on a fixed scenario that reaches the
state where the plant changes a decision or the free blocks: the scenario agrees with
vLLM without the plant and diverges with it, in every release it is run against.

The scenarios (``planted_scenarios/NAME.json``) were written by the seeded fuzz that
first found each plant; a test that drives them depends on what the reference and vLLM
decide on them, not on which examples a fuzz seed draws. The ``books-ITEM`` scenarios
beside them reach the state a planted break of a book item shows in
(``test_books_live.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dualbudget.integration.lockstep import Divergence, run_in_lockstep
from dualbudget.reference.formats.scenario import Scenario, load_scenario

SCENARIOS = Path(__file__).resolve().parent / "planted_scenarios"


def planted_scenario(name: str, profile: str) -> Scenario:
    """The scenario of ``name`` under ``profile`` (the installed release's)."""
    return load_scenario(SCENARIOS / f"{name}.json").with_profile(profile)


def planted_divergence(scenario: Scenario, plant: Callable[[], None]) -> Divergence | None:
    """The divergence ``plant`` makes on ``scenario`` (a ``planted_scenario``) in lockstep
    with the installed vLLM, after the same scenario agreed without it (None: no
    divergence)."""
    _, control = run_in_lockstep(scenario)
    assert control is None, f"without the plant it must agree: {control.report()}"
    plant()
    _, found = run_in_lockstep(scenario)
    return found
