"""Turn a Scenario into the event stream of an engine, and run it.

One engine step is: the arrivals and aborts due before it, ``ScheduleStep``, then the
``ModelOutput`` of that step and the ``DraftProposals`` for the next. ``ScenarioDriver``
makes those events from the scenario and from what the reference decided, so that other
consumers (the live vLLM adapter) can be fed the very same stream in lockstep:

    driver = ScenarioDriver(scenario)
    while not driver.done(state):
        for event in driver.before_step():   # AddRequest/Abort..., ScheduleStep
            record = consumer.handle(event)
        for event in driver.after_step(record, state):   # ModelOutput, DraftProposals
            consumer.handle(event)

``state`` is the reference's ``SchedulerState`` right after the step was scheduled.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from dualbudget.spec.profiles import profile_named

from .contract import CheckMode
from .events import Abort, AddRequest, DraftProposals, Event, ModelOutput, ScheduleStep, StepRecord
from .scenario import Scenario
from .scheduler import Scheduler
from .state import SchedulerState


@dataclass(frozen=True)
class Stall:
    """No request can ever be scheduled again (a fixed point, no event left to change it):
    a C4 progress failure of the config under this profile."""

    step: int
    unfinished: tuple[str, ...]

    def message(self) -> str:
        return (
            f"C4 progress: stalled at step {self.step}: requests"
            f" {', '.join(self.unfinished)} can never be scheduled"
        )


class ScenarioDriver:
    def __init__(self, scenario: Scenario, max_steps: int | None = None) -> None:
        self.scenario = scenario
        self.max_steps = max_steps
        self.k = scenario.config.num_speculative_tokens
        self.step = 0
        """The index of the next ScheduleStep."""
        self.stall: Stall | None = None
        self._order = sorted(
            range(len(scenario.requests)), key=lambda i: (scenario.requests[i].arrival_step, i)
        )
        self._added = 0
        self._last_event_step = max(
            max(r.arrival_step, r.abort_step if r.abort_step is not None else 0)
            for r in scenario.requests
        )

    def done(self, state: SchedulerState) -> bool:
        if self.stall is not None:
            return True
        if self.max_steps is not None and self.step >= self.max_steps:
            return True
        if self.step <= self._last_event_step:
            return False
        # vLLM keeps stepping while finished ids are still to be reported (has_requests).
        return not state.finished_since_step and all(r.finished for r in state.requests.values())

    def before_step(self) -> list[Event]:
        """The arrivals and aborts due before step ``self.step``, then its ScheduleStep."""
        events: list[Event] = []
        for i in self._order:
            request = self.scenario.requests[i]
            if request.arrival_step == self.step:
                events.append(
                    AddRequest(
                        request.id,
                        request.prompt_len,
                        request.max_tokens,
                        request.priority,
                        # Arrival order as vLLM's arrival_time: priority ties break on it.
                        float(self._added),
                    )
                )
                self._added += 1
        events += [Abort(r.id) for r in self.scenario.requests if r.abort_step == self.step]
        events.append(ScheduleStep())
        return events

    def after_step(self, record: StepRecord, state: SchedulerState) -> list[Event]:
        """The step's ModelOutput and the DraftProposals that follow it."""
        num_sampled: dict[str, int] = {}
        decoding: list[str] = []
        for rid in record.num_scheduled_tokens:
            request = state.requests[rid]
            if request.num_computed_tokens < request.num_tokens:
                num_sampled[rid] = 0  # a prefill chunk short of the prompt's end
                continue
            real_drafts = (
                0 if rid in state.last_padded else record.scheduled_spec_tokens.get(rid, 0)
            )
            num_sampled[rid] = 1 + self._accepted(record.step, rid, real_drafts)
            decoding.append(rid)
        events: list[Event] = [ModelOutput(num_sampled)]
        if self.k > 0:
            events.append(
                DraftProposals({rid: self._proposed(record.step, rid) for rid in decoding})
            )
        self._note_stall(record, state)
        self.step = record.step + 1
        return events

    def _accepted(self, step: int, rid: str, drafts: int) -> int:
        acceptance = self.scenario.acceptance
        if drafts == 0:
            return 0
        if acceptance.per_position is not None:
            # Seeded per (step, request): the draw does not depend on iteration order.
            rng = random.Random(f"{acceptance.seed}:{step}:{rid}")
            accepted = 0
            for position in range(drafts):
                probs = acceptance.per_position
                prob = probs[position] if position < len(probs) else 0.0
                if rng.random() >= prob:
                    break
                accepted += 1
            return accepted
        if acceptance.explicit is not None:
            return min(acceptance.explicit.get(step, {}).get(rid, 0), drafts)
        return min(acceptance.fixed or 0, drafts)

    def _proposed(self, step: int, rid: str) -> int:
        drafts = self.scenario.drafts
        if drafts is None:
            return self.k
        if drafts.fixed is not None:
            return drafts.fixed
        return (drafts.explicit or {}).get(step, {}).get(rid, 0)

    def _note_stall(self, record: StepRecord, state: SchedulerState) -> None:
        # A step that scheduled and preempted nothing leaves the state as it was; with no
        # event left to come, every later step would be the same.
        if record.num_scheduled_tokens or record.preempted or record.step < self._last_event_step:
            return
        unfinished = tuple(rid for rid, r in state.requests.items() if not r.finished)
        if unfinished:
            self.stall = Stall(record.step, unfinished)


class ScenarioRun:
    """The reference scheduler driven through a scenario."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        profile: str | None = None,
        max_steps: int | None = None,
        check: CheckMode = "raise",
    ) -> None:
        if profile is not None and profile != scenario.profile:
            scenario = scenario.with_profile(profile)
        self.scenario = scenario
        self.scheduler = Scheduler(
            scenario.config,
            profile_named(scenario.profile),
            check=check,
            scenario=scenario.to_json(),
        )
        self.driver = ScenarioDriver(scenario, max_steps)

    @property
    def stall(self) -> Stall | None:
        return self.driver.stall

    def records(self) -> Iterator[StepRecord]:
        scheduler, driver = self.scheduler, self.driver
        while not driver.done(scheduler.state):
            record = None
            for event in driver.before_step():
                record = scheduler.handle(event)
            assert record is not None  # before_step ends with a ScheduleStep
            for event in driver.after_step(record, scheduler.state):
                scheduler.handle(event)
            yield record


def run_scenario(
    scenario: Scenario,
    profile: str | None = None,
    max_steps: int | None = None,
    *,
    check: CheckMode = "raise",
) -> Iterator[StepRecord]:
    """The step records of the reference on ``scenario`` (``profile`` overrides its own)."""
    return ScenarioRun(scenario, profile=profile, max_steps=max_steps, check=check).records()
