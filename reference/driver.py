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
from .scenario import RequestSpec, Scenario
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
        # Arrivals and aborts by step, so that a step looks up its own instead of scanning
        # every request: arrivals in (arrival_step, scenario order), aborts in scenario order.
        self._arrivals: dict[int, list[RequestSpec]] = {}
        for request in sorted(scenario.requests, key=lambda r: r.arrival_step):
            self._arrivals.setdefault(request.arrival_step, []).append(request)
        self._aborts: dict[int, list[str]] = {}
        for request in scenario.requests:
            if request.abort_step is not None:
                self._aborts.setdefault(request.abort_step, []).append(request.id)
        self._added = 0
        # One generator, reseeded per (step, request): the same draws as a fresh one.
        self._rng = random.Random()
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
        if state.finished_since_step:
            return False
        requests = state.requests
        # Unfinished requests are queued: look there first, then make sure of all of them.
        for queue in (state.running, state.waiting):
            for rid in queue:
                if not requests[rid].finished:
                    return False
        return all(r.finished for r in requests.values())

    def before_step(self) -> list[Event]:
        """The arrivals and aborts due before step ``self.step``, then its ScheduleStep."""
        events: list[Event] = []
        for request in self._arrivals.get(self.step, ()):
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
        events += [Abort(rid) for rid in self._aborts.get(self.step, ())]
        events.append(ScheduleStep())
        return events

    def after_step(self, record: StepRecord, state: SchedulerState) -> list[Event]:
        """The step's ModelOutput and the DraftProposals that follow it."""
        num_sampled: dict[str, int] = {}
        decoding: list[str] = []
        requests, step = state.requests, record.step
        spec_tokens = record.scheduled_spec_tokens
        padded = set(state.last_padded)
        for rid in record.num_scheduled_tokens:
            request = requests[rid]
            # request.num_tokens, inlined
            if request.num_computed_tokens < request.prompt_len + request.num_output_tokens:
                num_sampled[rid] = 0  # a prefill chunk short of the prompt's end
                continue
            real_drafts = 0 if rid in padded else spec_tokens.get(rid, 0)
            num_sampled[rid] = 1 + (self._accepted(step, rid, real_drafts) if real_drafts else 0)
            decoding.append(rid)
        events: list[Event] = [ModelOutput(num_sampled)]
        if self.k > 0:
            drafts = self.scenario.drafts
            if drafts is None:
                proposals = dict.fromkeys(decoding, self.k)
            else:
                proposals = {rid: self._proposed(step, rid) for rid in decoding}
            events.append(DraftProposals(proposals))
        self._note_stall(record, state)
        self.step = record.step + 1
        return events

    def _accepted(self, step: int, rid: str, drafts: int) -> int:
        acceptance = self.scenario.acceptance
        if drafts == 0:
            return 0
        if acceptance.per_position is not None:
            # Seeded per (step, request): the draw does not depend on iteration order.
            # (Reseeding one generator draws what ``random.Random(seed)`` would.)
            rng = self._rng
            rng.seed(f"{acceptance.seed}:{step}:{rid}")
            draw = rng.random
            probs = acceptance.per_position
            accepted = 0
            for position in range(drafts):
                prob = probs[position] if position < len(probs) else 0.0
                if draw() >= prob:
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
