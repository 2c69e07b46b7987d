"""Known findings, pinned: the reference must see them, in both of its checking modes.

DSpark's fill-in layout reads K + 1 draft rows per request, but vLLM 0.32 reserves only
max_num_new_slots_for_drafting = K - 1 for it, and the global reserve counts the same
K - 1. A step of many short requests then overflows the buffer: C3 breaks.
"""

from __future__ import annotations

import pytest

from dualbudget.reference.violations import ContractViolation
from tests.reference_support import fill_in_scenario, run


def test_vllm_0_32_dspark_fill_in_breaks_c3() -> None:
    # B = 20, K = 4, slots K - 1 = 3, C = K + 1 = 5, five 2-token prompts, no drafts.
    # Step 0: each prompt charged 2 + 3 = 5: four fit (input 20 -> 0), D = 4 * 5 = 20.
    # Step 1: four decodes charged 1 + 3 = 4 each (input 4 left, > 3), then r4 gets
    # min(4, 4 - 3) = 1 token: five requests, D = 5 * 5 = 25 > B = 20.
    scenario_run, records = run(fill_in_scenario("vllm-0.32", 2), check="collect")
    violations = scenario_run.scheduler.violations
    assert violations, "the known C3 finding was not seen"
    first = violations[0]
    assert (first.contract, first.step) == ("C3", 1)
    assert records[1].draft_rows == 25
    assert records[1].target_tokens == 5
    assert {v.contract for v in violations} == {"C3"}


def test_global_reserve_dspark_fill_in_breaks_c3() -> None:
    # S' = 20 - 5 * 3 = 5: five 1-token prompts fit T = 5, but D = 5 * 5 = 25 > 20.
    scenario_run, records = run(fill_in_scenario("global-reserve", 1), check="collect")
    assert [(v.contract, v.step) for v in scenario_run.scheduler.violations][:1] == [("C3", 0)]
    assert records[0].num_scheduled_tokens == {str(i): 1 for i in range(5)}


def test_raise_mode_carries_contract_state_and_scenario() -> None:
    sc = fill_in_scenario("vllm-0.32", 2)
    with pytest.raises(ContractViolation) as caught:
        run(sc)
    err = caught.value
    assert err.contract == "C3"
    assert err.step == 1
    assert err.scenario == sc.to_json()
    assert err.step_state["record"]["draft_rows"] == 25
    assert set(err.step_state["state"]["requests"]) == {str(i) for i in range(5)}
    assert '"C3"' in err.dumps()


@pytest.mark.parametrize("profile", ["vllm-0.33", "dual"])
def test_the_same_workload_is_safe_under_sound_profiles(profile: str) -> None:
    scenario_run, records = run(fill_in_scenario(profile, 2), check="collect")
    assert scenario_run.scheduler.violations == []
    assert all(r.draft_rows <= 20 for r in records)
