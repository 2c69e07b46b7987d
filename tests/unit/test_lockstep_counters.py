"""The counts of the reference's grants that the lockstep's budget coverage events read
(``Scheduler.grants``; no vLLM needed): a grant cut by the input budget, and the refund of
a request preempted after it was scheduled in the same step, are each counted."""

from __future__ import annotations

from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep, StepRecord
from dualbudget.reference.scheduler import Scheduler
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.profiles import profile_named


def _step(scheduler: Scheduler) -> StepRecord:
    record = scheduler.handle(ScheduleStep())
    assert record is not None
    requests = scheduler.state.requests
    sampled = {
        rid: int(requests[rid].num_computed_tokens >= requests[rid].num_tokens)
        for rid in record.num_scheduled_tokens
    }
    scheduler.handle(ModelOutput(sampled))
    return record


def test_a_grant_cut_by_the_input_budget_is_counted() -> None:
    # vLLM 0.32 on DFlash, K = 3: 3 slots per request, so a 40-token prompt gets
    # min(token_budget 16, input_budget 16 - 3) = 13 tokens, cut by the input budget.
    config = EngineConfig(16, 4, 64, 4, 64, speculative_config=SpeculativeConfig("dflash", 3, True))
    scheduler = Scheduler(config, profile_named("vllm-0.32"), check="raise")
    scheduler.handle(AddRequest("0", 40, 4))
    assert _step(scheduler).num_scheduled_tokens == {"0": 13}
    assert (scheduler.grants.cut_by_input_budget, scheduler.grants.refunds) == (1, 0)


def test_the_refund_of_a_request_scheduled_earlier_in_the_step_is_counted() -> None:
    # Priority scheduling, 3 usable blocks of 4 tokens. The low-priority "0" runs first;
    # at step 2 it is scheduled, then "1" needs a block and preempts it: a refund.
    config = EngineConfig(64, 4, 64, 4, 4, scheduling_policy="priority")
    scheduler = Scheduler(config, profile_named("vllm-0.32"), check="raise")
    scheduler.handle(AddRequest("0", 4, 10, priority=5, arrival_time=0.0))
    _step(scheduler)
    scheduler.handle(AddRequest("1", 4, 10, priority=0, arrival_time=1.0))
    _step(scheduler)
    assert scheduler.grants.refunds == 0
    record = _step(scheduler)
    assert record.preempted == ["0"] and record.num_scheduled_tokens == {"1": 1}
    assert scheduler.grants.refunds == 1


def test_the_callers_draws_are_cut_into_range_and_asked_in_order() -> None:
    from dualbudget.integration.lockstep import CallerDraws

    draws = CallerDraws(k=3)
    asked: list[str] = []

    def accept(rid: str, real_drafts: int) -> int:
        asked.append(rid)
        return 9

    def propose(rid: str) -> int:
        asked.append(rid)
        return -1

    draws.accept = accept
    draws.propose = propose
    assert draws.accepted(0, "a", 2) == 2
    assert draws.proposed(0, ["a", "b"]) == {"a": 0, "b": 0}
    draws.propose = lambda rid: 7
    assert draws.proposed(0, ["c"]) == {"c": 3}
    assert asked == ["a", "a", "b"]
