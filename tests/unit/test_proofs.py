"""The proof suite as a test module: every obligation's verdict against the manifest, and
every expected finding's witness replayed through the reference scheduler.

The suite runs once per session (module fixture, in parallel); each obligation is then
its own test case, so CI shows exactly which one moved.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dualbudget.proofs.manifest import expected_findings, load_manifest
from dualbudget.proofs.obligations import catalog, lower_of
from dualbudget.proofs.runner import Outcome, run
from dualbudget.reference.formats.scenario import ScenarioError, parse_scenario
from dualbudget.reference.runs.driver import ScenarioRun
from dualbudget.spec.config import SpeculativeConfig
from dualbudget.spec.contract import BOOKS, CONTRACT_IDS
from dualbudget.spec.invariants import one_more_token_fits
from dualbudget.spec.methods import LAYOUT_NAMES, layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import PROFILE_NAMES

MANIFEST = load_manifest()
OBLIGATIONS = catalog()
EXPECTED_FAILURES = [ob.name for ob in OBLIGATIONS if MANIFEST.expected(ob.name) == "fails"]


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    return {o.name: o for o in run(OBLIGATIONS, MANIFEST)}


def test_the_manifest_covers_the_catalog_exactly() -> None:
    assert MANIFEST.problems(ob.name for ob in OBLIGATIONS) == []


def test_every_profile_layout_and_contract_has_obligations() -> None:
    profiles = {ob.profile for ob in OBLIGATIONS}
    layouts = {ob.layout for ob in OBLIGATIONS}
    contracts = {ob.contract for ob in OBLIGATIONS}
    assert profiles == set(PROFILE_NAMES)
    assert layouts == set(LAYOUT_NAMES)
    assert contracts == set(CONTRACT_IDS)


@pytest.mark.parametrize("name", [ob.name for ob in OBLIGATIONS])
def test_verdict_matches_the_manifest(outcomes: dict[str, Outcome], name: str) -> None:
    o = outcomes[name]
    assert o.nonvacuous, f"{name}: premises unsatisfiable: {o.reasons}"
    assert o.verdict == o.expected, f"{name}: {o.verdict}, expected {o.expected}: {o.reasons}"


# -- the findings, replayed through the reference -------------------------------------


def _first_step(scenario_json: dict[str, Any], profile: str | None = None) -> tuple[Any, Any]:
    scenario = parse_scenario(scenario_json)
    replay = ScenarioRun(scenario, profile=profile, max_steps=1, check="collect")
    record = next(replay.records())
    return record, replay


def _params(scenario_json: dict[str, Any]) -> StepParams:
    return StepParams.of(parse_scenario(scenario_json).config)


@pytest.mark.parametrize("name", EXPECTED_FAILURES)
def test_expected_finding_replays_in_the_reference(outcomes: dict[str, Outcome], name: str) -> None:
    o = outcomes[name]
    assert o.scenario is not None, f"{name}: no witness scenario"
    scenario = o.scenario
    needs = {r["id"]: r["prompt_len"] for r in scenario["requests"]}
    if o.check == "C4-converse":
        # The profile refuses the config although one 1-token request fits C3 ...
        with pytest.raises(ScenarioError, match="max_num_batched_tokens"):
            parse_scenario(scenario)
        # ... and under the dual policy the same config schedules it within C3.
        as_dual = copy.deepcopy(scenario)
        as_dual["profile"] = "dual"
        record, replay = _first_step(as_dual)
        assert record.target_tokens >= 1
        assert not replay.scheduler.violations
        return
    record, replay = _first_step(scenario)
    p = _params(scenario)
    if o.contract == "C3":
        c3 = [v for v in replay.scheduler.violations if v.contract == "C3"]
        assert c3, f"{name}: the reference shows no C3 violation: {record.to_json()}"
        assert record.draft_rows > p.max_num_batched_tokens
    elif o.contract == "C4":
        # An accepted config (the scenario parsed) whose empty step schedules nothing and
        # can never change: the driver's stall, the reference's C4 progress failure.
        assert record.target_tokens == 0, f"{name}: the step made progress: {record.to_json()}"
        assert replay.stall is not None, f"{name}: the reference saw no stall"
    elif o.contract == "C5":
        scheduled = record.num_scheduled_tokens
        cut = [rid for rid in needs if scheduled.get(rid, 0) < needs[rid]]
        assert cut, f"{name}: every request got what it needs: {record.to_json()}"
        rid = cut[0]
        got = scheduled.get(rid, 0)
        # The rest of the step, without what the cut request holds.
        target = record.target_tokens - got
        draft = record.draft_rows - (p.draft_rows(got) if got else 0)
        count = len(scheduled) - (1 if got else 0)
        assert one_more_token_fits(p, target, draft, count, got)
        assert not replay.scheduler.violations
    elif o.contract == "C6":
        lower = lower_of(o.profile)
        other, _ = _first_step(scenario, profile=lower)
        if "tokens" in o.check:
            assert record.target_tokens < other.target_tokens
        else:
            assert len(record.num_scheduled_tokens) < len(other.num_scheduled_tokens)
    else:
        pytest.fail(f"{name}: no replay rule for {o.check}")


@pytest.mark.parametrize("name", EXPECTED_FAILURES)
def test_witness_step_is_what_the_reference_schedules(
    outcomes: dict[str, Outcome], name: str
) -> None:
    """The proof's FCFS step (spec code on ints) and the reference agree on the witness."""
    o = outcomes[name]
    assert o.table is not None and o.scenario is not None
    if o.check == "C4-converse":
        return
    record, _ = _first_step(o.scenario)
    granted = [record.num_scheduled_tokens.get(r["id"], 0) for r in o.scenario["requests"]]
    row = next(line for line in o.table.splitlines() if line.startswith(f"  {o.profile}:"))
    assert f"T={sum(granted)}" in row, (o.table, record.to_json())


def test_witness_files_are_scenarios(outcomes: dict[str, Outcome], tmp_path: Path) -> None:
    from dualbudget.proofs.runner import write_witnesses

    found = [o for o in outcomes.values() if o.scenario is not None]
    write_witnesses(found, tmp_path)
    for o in found:
        assert o.witness is not None
        data = json.loads(Path(o.witness).read_text())
        assert data["format"] == "dualbudget-scenario"
        assert set(data) >= {"profile", "config", "requests", "acceptance"}
        # The layout's speculative_config is SpeculativeConfig.for_layout's: the row it
        # builds is the obligation's (eagle rows as "eagle3").
        spec = data["config"]["speculative_config"]
        k = spec["num_speculative_tokens"]
        assert SpeculativeConfig(**spec) == SpeculativeConfig.for_layout(layout_named(o.layout), k)
        if o.check != "C4-converse":  # the profile refuses that config
            assert parse_scenario(data).config.layout == layout_named(o.layout)


def test_expected_findings_are_the_manifests_failures() -> None:
    failing = [ob for ob in OBLIGATIONS if MANIFEST.expected(ob.name) == "fails"]
    assert expected_findings() == {(ob.profile, ob.layout, ob.contract) for ob in failing}
    assert {item for _, _, item in expected_findings()} <= set(CONTRACT_IDS)


def test_every_check_names_its_contract_item() -> None:
    """The ``contract`` field is the item; a check's name opens with it, so that the
    manifest's names say the item too."""
    for ob in OBLIGATIONS:
        assert ob.contract in CONTRACT_IDS, ob.name
        assert ob.check == ob.contract or ob.check.startswith(f"{ob.contract}-"), ob.name


def test_the_policy_part_of_each_book_item_is_proven_for_every_profile_and_layout() -> None:
    """A book item's ``proven_by`` names checks of the catalog, each an obligation of
    every profile on every layout its release builds, so the part of the item a budget
    policy decides is proven wherever the contract C1-C6 is; an item whose policy part
    is empty says why."""
    checks = {(ob.profile, ob.layout, ob.check) for ob in OBLIGATIONS}
    pairs = {(ob.profile, ob.layout) for ob in OBLIGATIONS}
    assert {item.id for item in BOOKS if item.proven_by} == {"C8", "C10", "C11"}
    for item in BOOKS:
        assert item.policy, item.id
        assert item.policy.startswith("none: ") == (not item.proven_by), item.id
        for check in item.proven_by:
            missing = {pair for pair in pairs if (*pair, check) not in checks}
            assert not missing, (item.id, check, sorted(missing)[:3])
