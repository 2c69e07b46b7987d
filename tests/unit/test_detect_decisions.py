"""The detection scenarios separate every pair of profiles not proved to decide alike."""

from __future__ import annotations

import itertools

import pytest

from dualbudget.integration.detect import (
    DETECTION_SCENARIOS,
    SHAPES,
    Detection,
    Failure,
    reference_decisions,
    rule_on_base,
    same_rule_elsewhere,
)
from dualbudget.proofs.same_decisions import Bounds, same_decisions
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.profiles import PROFILE_NAMES, PROFILES

PROOF_BOUNDS = Bounds(b=(1, 32), m=(1, 8), k=(1, 4))
"""Where a pair the scenarios do not separate must be proved equal: every K up to the
scenarios' own and budgets well past theirs."""

SPECULATIVE_LAYOUTS = [name for name in LAYOUT_NAMES if name != "none"]


@pytest.mark.parametrize("layout", SPECULATIVE_LAYOUTS)
def test_every_pair_is_separated_or_proved_equal(layout: str) -> None:
    scenarios = [s for s in DETECTION_SCENARIOS if s.name.startswith(f"{layout}/")]
    assert scenarios, f"no detection scenario on {layout}"
    decisions = {(s.name, p): reference_decisions(s, p) for s in scenarios for p in PROFILE_NAMES}
    unseparated = []
    for a, b in itertools.combinations(PROFILE_NAMES, 2):
        if any(decisions[(s.name, a)] != decisions[(s.name, b)] for s in scenarios):
            continue
        proof = same_decisions(a, b, layout, PROOF_BOUNDS)
        if not proof.equal:
            unseparated.append(f"{a} vs {b}: {proof.reason}")
    assert not unseparated, "\n".join(unseparated)


def test_every_shape_runs_somewhere() -> None:
    # A shape no profile accepts on any layout decides nothing; one refused on a layout
    # by every profile still checks that vLLM refuses it too.
    ran = {
        scenario.name.split("/")[1]
        for scenario in DETECTION_SCENARIOS
        if any(reference_decisions(scenario, p)[:1] != ("refuses",) for p in PROFILE_NAMES)
    }
    assert ran == {shape.name for shape in SHAPES}


def test_no_match_is_a_result_naming_each_profiles_first_failure() -> None:
    failures = {
        name: Failure("dflash/narrow", f"decision at step 2: reference a, live b ({name})")
        for name in PROFILE_NAMES
    }
    found = Detection(None, "0.99.0.dev1", "decisions", (), failures)
    report = found.report()
    assert found.profile is None and "no profile matches" in report
    for name in PROFILE_NAMES:
        assert f"  {name}: fails dflash/narrow: decision at step 2" in report
    assert found.to_json()["failures"]["dual"]["scenario"] == "dflash/narrow"


def test_a_class_is_reported_as_one() -> None:
    found = Detection("vllm-0.32", "0.32.1.dev0", "decisions", ("vllm-0.32", "pr-52996"))
    assert "the class vllm-0.32, pr-52996" in found.report()


def test_a_proposal_run_on_another_base_is_named_with_its_rule() -> None:
    # pr-53080's policy is dual's rule under the proposal's name (spec/policies.py), run
    # on another release: a tree detected as dual on dual's base runs pr-53080's rule.
    assert same_rule_elsewhere("dual") == ("pr-53080",)
    assert same_rule_elsewhere("pr-53080") == ("dual",)
    found = Detection("dual", "0.33.1.dev0", "decisions", ("dual",))
    assert "decides as profile dual (pr-53080's rule on vllm-0.33's base)" in found.report()
    assert found.how_chosen() == "detected by decisions; pr-53080's rule on vllm-0.33's base"
    assert found.to_json()["same_rule"] == {"dual": ["pr-53080"]}


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_same_rule_is_read_from_the_records(profile: str) -> None:
    # Symmetric, never the profile's own base, never a release's own profile, and each
    # named profile's policy class resolves every method as this one's does.
    own = PROFILES[profile]
    for other in same_rule_elsewhere(profile):
        assert PROFILES[other].release != own.release
        assert PROFILES[other].vllm_version is None
        if own.vllm_version is None:
            assert profile in same_rule_elsewhere(other)
        for name in ("open", "room", "exhausted", "charge", "admission_rules"):
            assert getattr(type(PROFILES[other].policy), name) is getattr(type(own.policy), name)
    if not same_rule_elsewhere(profile):
        assert rule_on_base(profile) == ""
