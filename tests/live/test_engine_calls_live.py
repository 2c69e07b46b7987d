"""vLLM's ``reset_prefix_cache`` and ``set_pause_state`` in lockstep with the reference:
the hand-worked streams of tests/engine_call_cases.py, each decision compared with vLLM's
and with the hand-worked one, the contract monitor judging every live step (needs vLLM;
see docs/vllm-environments.md)."""

from __future__ import annotations

import pytest

from dualbudget.integration.lockstep import Lockstep
from dualbudget.reference.events import ResetPrefixCache, ScheduleStep
from tests.engine_call_cases import CASES
from tests.worked_cases import Case

pytestmark = pytest.mark.live


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hand_worked_case_agrees_with_vllm(case: Case, profile: str) -> None:
    lock = Lockstep(case.config, profile)
    live_decisions = []
    for event in case.events:
        lock.handle(event)  # raises DivergenceFound at the first differing step
        if isinstance(event, ScheduleStep):
            assert lock.last_live is not None
            live_decisions.append(lock.last_live.decision())
    assert live_decisions == list(case.expected)
    # The monitor judged every step: a reset's victims resumed in the next step are not
    # that step's victims (C11), and a paused step is not a stall (C4).
    assert lock.monitor.violations == []
    statuses = {str(rid): str(r.status.name) for rid, r in lock.live.scheduler.requests.items()}
    for rid, status in statuses.items():
        assert case.finished[rid].upper() == status


def test_vllm_drops_the_output_in_flight_at_a_reset(profile: str) -> None:
    case = next(c for c in CASES if c.name == "reset-drops-the-output-in-flight")
    lock = Lockstep(case.config, profile)
    for event in case.events:
        lock.handle(event)
        if isinstance(event, ResetPrefixCache):
            request = lock.live.scheduler.requests["a"]
            assert (request.num_stale_output_tokens, request.drop_stale_output) == (1, True)
            assert (request.num_computed_tokens, len(request.output_token_ids)) == (0, 1)
