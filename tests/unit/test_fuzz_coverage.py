"""The coverage table (``integration.coverage.COVERAGE``) is the one home of a coverage
event: every counter the lockstep or the reference scheduler keeps is a row, every row's
aim exists, the gate's required events follow from the rows and the ``Release`` record's
flags, and the coverage table's columns are the rows' (no vLLM needed)."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace

from dualbudget.integration import lockstep
from dualbudget.integration.aims import AIMS
from dualbudget.integration.commands import fuzz_verdict
from dualbudget.integration.coverage import (
    COVERAGE,
    EVENT_NAMES,
    EVENTS,
    everywhere,
    required_events,
    where_async_runs,
    where_full_hits_happen,
    where_mtp_is_drawn,
)
from dualbudget.integration.outcome import FuzzResult
from dualbudget.reference.scheduler import KV_GROUP_OBSERVED, OBSERVED
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.releases import RELEASES, release_named


def _lockstep_counters() -> set[str]:
    """The names ``lockstep`` counts itself: every string key of a subscript of its
    coverage dict (``self.coverage[...]`` or its local alias ``cov[...]``)."""
    tree = ast.parse(inspect.getsource(lockstep))
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Subscript) or not isinstance(node.slice, ast.Constant):
            continue
        target = node.value
        is_coverage = (isinstance(target, ast.Name) and target.id == "cov") or (
            isinstance(target, ast.Attribute) and target.attr == "coverage"
        )
        if is_coverage and isinstance(node.slice.value, str):
            names.add(node.slice.value)
    return names


def test_every_counter_is_a_row_and_every_row_is_counted() -> None:
    counted_here = _lockstep_counters()
    assert counted_here, "the lockstep counts events by their names"
    assert not counted_here & set(OBSERVED)  # each counted in one place
    assert counted_here | set(OBSERVED) == set(EVENT_NAMES)


def test_names_and_column_heads_are_unique_and_every_row_says_why() -> None:
    assert len(set(EVENT_NAMES)) == len(COVERAGE)
    assert len({event.short for event in COVERAGE}) == len(COVERAGE)
    assert all(len(event.short) < 14 for event in COVERAGE)  # fits its column
    assert all(event.reason for event in COVERAGE)
    assert all(EVENTS[name] is event for name, event in zip(EVENT_NAMES, COVERAGE, strict=True))


def test_every_rows_aim_exists() -> None:
    assert {event.aim for event in COVERAGE} <= set(AIMS)


def test_the_required_events_are_the_rows_that_reach_the_release_and_layout() -> None:
    v032, v033 = release_named("0.32"), release_named("0.33")
    assert required_events("eagle", v033) == EVENT_NAMES
    # Only the EAGLE row's drafter is ever MTP: no other row reserves MTP's lookahead.
    assert required_events("dflash", v033) == tuple(
        e.name for e in COVERAGE if e.reached is not where_mtp_is_drawn
    )
    # 0.32 drops the last hit block for EAGLE: no full hit; it runs EAGLE async.
    assert required_events("eagle", v032) == tuple(
        e.name for e in COVERAGE if e.reached is not where_full_hits_happen
    )
    # 0.32 runs no ngram async: none of the async-only rows.
    assert required_events("ngram", v032) == tuple(
        e.name for e in COVERAGE if e.reached not in (where_async_runs, where_mtp_is_drawn)
    )
    assert {e.reached for e in COVERAGE} == {
        everywhere,
        where_async_runs,
        where_full_hits_happen,
        where_mtp_is_drawn,
    }


def test_a_release_differing_in_one_flag_changes_only_the_rows_reading_it() -> None:
    base = release_named("0.33")
    no_async_ngram = replace(base, version="0.99", async_runner_v2_methods=())
    drops_dflash = replace(base, version="0.99", block_drop_methods=("dflash",))
    for layout in LAYOUT_NAMES:
        before = required_events(layout, base)
        lost = set(before) - set(required_events(layout, no_async_ngram))
        assert lost == (
            {"async_in_flight", "stale_output", "in_flight_max_tokens_skip", "stale_output_dropped"}
            if layout == "ngram"
            else set()
        )
        lost = set(before) - set(required_events(layout, drops_dflash))
        assert lost == ({"full_prefix_hit"} if layout == "dflash" else set())
    for release in RELEASES.values():  # each release's events are a subset of the rows
        for layout in LAYOUT_NAMES:
            assert set(required_events(layout, release)) <= set(EVENT_NAMES)


def test_the_coverage_table_has_a_column_per_row_in_the_tables_order() -> None:
    result = FuzzResult(profile="vllm-0.33", vllm_version="0.33.0")
    result.coverage["ngram"] = dict.fromkeys(EVENT_NAMES, 1)
    result.steps = result.steps_by_layout["ngram"] = 10
    code, table = fuzz_verdict(result, ["ngram"], gate=True)
    head = next(line for line in table.splitlines() if line.startswith("method"))
    assert head.split()[:3] == ["method", "ex", "steps"]
    assert head.split()[3:-2] == [event.short for event in COVERAGE]
    assert code == 0
    result.coverage["ngram"]["resume_rehit"] = 0
    code, table = fuzz_verdict(result, ["ngram"], gate=True)
    assert code == 1 and "FAIL: coverage at zero for ngram:resume_rehit" in table


def test_the_hybrid_rows_are_the_coordinators_counters_drawn_by_the_hybrid_aim() -> None:
    """The KV-group events are counted by the reference's coordinator and drawn only by
    the aim that draws group layouts: every other aim keeps vLLM's one group."""
    hybrid = {event.name for event in COVERAGE if event.aim == "hybrid"}
    assert hybrid == set(KV_GROUP_OBSERVED)
    assert AIMS["hybrid"].configs.kv_layouts
    assert all(not aim.configs.kv_layouts for name, aim in AIMS.items() if name != "hybrid")
