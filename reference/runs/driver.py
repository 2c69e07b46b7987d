"""The one event driver: an engine run as the event stream its schedulers are fed.

One engine step is: the arrivals and aborts due before it, ``ScheduleStep``, then the
``ModelOutput`` of that step and the ``DraftProposals`` for the next. Under async
scheduling (``config.async_scheduling``) the engine keeps a batch queue of depth 2
(``EngineCore.step_with_batch_queue``): step n+1 is scheduled before step n's output is
applied, and no drafts are passed back (the worker fills the placeholders), so the stream
is ``ScheduleStep`` 0, ``ScheduleStep`` 1, ``ModelOutput(step=0)``, ``ScheduleStep`` 2,
``ModelOutput(step=1)``, ... and, once the run is over, the last output.

``EventDriver`` makes those events from the requests it was given and from what the
reference decided; how many drafts a step accepts, how many the drafter proposes and
which requests stop on EOS or a stop token come from a ``Draws`` source (a scenario's
tables, ``ScenarioDraws``, or a caller's draws, such as the fuzz's), and the driver keeps
what it drew, so that any run can be written back as a scenario with explicit tables
(``EventDriver.scenario``) that replays it event for event.

With ``enable_prefix_caching`` on, the events carry token ids (``reference.token_ids``):
each ``AddRequest`` its request's ``prompt_token_ids`` (ids of its own when it has none),
each ``ModelOutput`` the ids every request that sampled sampled, the stop token where it
stopped. They follow from the requests and the draws alone, so a scenario written back
replays them too. With it off the events carry none (token ids never move a budget).

``drive`` runs a driver to the end against a reference and any other consumers::

    for step in drive(EventDriver.of(scenario), reference, live):
        step.record  # the reference's StepRecord; every event of the step is fed

Every event goes to the reference first, then to each other consumer. A consumer that
compares (the lockstep pair of integration/lockstep.py) is itself the reference here: it
raises before the step's outputs are fed when the two decide differently.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dualbudget.spec.config import EngineConfig
from dualbudget.spec.profiles import profile_named

from ..async_scheduler import make_scheduler
from ..events import (
    Abort,
    AddRequest,
    DraftProposals,
    Event,
    ModelOutput,
    ResetPrefixCache,
    ScheduleStep,
    SetPauseState,
    StepRecord,
)
from ..formats.scenario import Acceptance, Drafts, RequestSpec, Scenario
from ..state import SchedulerState
from ..token_ids import sampled_token_ids, unique_prompt
from ..violations import CheckMode


class Draws(Protocol):
    """Where a run's model outcomes come from, for the requests of a step that reached
    the end of their prompt (in the order of its ``num_scheduled_tokens``): first
    ``accepted`` for each that had real drafts to verify (in ``[0, real_drafts]``), then,
    only with ``K > 0``, ``proposed`` for all of them at once (each in ``[0, K]``)."""

    def accepted(self, step: int, request_id: str, real_drafts: int) -> int: ...

    def proposed(self, step: int, request_ids: list[str]) -> dict[str, int]: ...


@runtime_checkable
class StopDraws(Protocol):
    """A ``Draws`` that also draws natural stops: for each request that sampled in a step,
    0 (no stop) or the token (1..num_sampled) that is EOS or a stop token."""

    def stopped(self, step: int, request_id: str, num_sampled: int) -> int: ...


class ScenarioDraws:
    """A scenario's ``acceptance`` and ``drafts`` tables (docs/reference.md)."""

    def __init__(self, scenario: Scenario) -> None:
        self.acceptance = scenario.acceptance
        self.drafts = scenario.drafts
        self.stops = scenario.stops or {}
        self.k = scenario.config.num_speculative_tokens
        # One generator, reseeded per (step, request): the same draws as a fresh one.
        self._rng = random.Random()

    def accepted(self, step: int, request_id: str, real_drafts: int) -> int:
        acceptance = self.acceptance
        if acceptance.per_position is not None:
            # Seeded per (step, request): the draw does not depend on iteration order.
            # (Reseeding one generator draws what ``random.Random(seed)`` would.)
            rng = self._rng
            rng.seed(f"{acceptance.seed}:{step}:{request_id}")
            draw = rng.random
            probs = acceptance.per_position
            accepted = 0
            for position in range(real_drafts):
                prob = probs[position] if position < len(probs) else 0.0
                if draw() >= prob:
                    break
                accepted += 1
            return accepted
        if acceptance.explicit is not None:
            return min(acceptance.explicit.get(step, {}).get(request_id, 0), real_drafts)
        return min(acceptance.fixed or 0, real_drafts)

    def proposed(self, step: int, request_ids: list[str]) -> dict[str, int]:
        drafts = self.drafts
        if drafts is None:
            return dict.fromkeys(request_ids, self.k)
        if drafts.fixed is not None:
            return dict.fromkeys(request_ids, drafts.fixed)
        row = (drafts.explicit or {}).get(step, {})
        return {rid: row.get(rid, 0) for rid in request_ids}

    def stopped(self, step: int, request_id: str, num_sampled: int) -> int:
        return min(self.stops.get(step, {}).get(request_id, 0), num_sampled)


class Consumer(Protocol):
    """Anything fed the event stream: the reference, vLLM behind ``LiveScheduler``."""

    def handle(self, event: Event) -> StepRecord | None: ...


class Reference(Consumer, Protocol):
    """The consumer whose decisions the stream follows: its ``state`` right after a
    ``ScheduleStep`` says which requests sampled, and when the run is over."""

    @property
    def state(self) -> SchedulerState: ...


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


@dataclass(frozen=True, slots=True)
class DrivenStep:
    """One step as it was fed: every event, and the reference's record of it."""

    record: StepRecord
    before: list[Event]
    """The arrivals and aborts due before the step, then its ``ScheduleStep``."""
    output: ModelOutput
    """This step's output (under async scheduling fed after the next ScheduleStep)."""
    proposals: DraftProposals | None
    """None without speculative decoding (K = 0) and under async scheduling: no drafts
    passed back."""
    rejected_drafts: int
    """Requests of the step that verified real drafts and had some of them rejected."""
    after: tuple[Event, ...] = ()
    """The events fed after the step's ScheduleStep: its output and proposals, or under
    async scheduling the previous step's output (none after step 0)."""

    @property
    def events(self) -> list[Event]:
        return [*self.before, *self.after]


class EventDriver:
    """The event stream of one engine run (one profile and config).

    Requests may be given up front (a scenario) or added as the run goes (``add``, at or
    after the next step; ``abort``): arrivals come in the order they were added, and
    their rank is vLLM's ``arrival_time`` (priority ties break on it).
    """

    def __init__(
        self,
        profile: str,
        config: EngineConfig,
        draws: Draws,
        requests: Iterable[RequestSpec] = (),
        *,
        max_steps: int | None = None,
    ) -> None:
        self.profile = profile
        self.config = config
        self.draws = draws
        self.max_steps = max_steps
        self.k = config.num_speculative_tokens
        self.step = 0
        """The index of the next ScheduleStep."""
        self.stall: Stall | None = None
        self.requests: list[RequestSpec] = []
        """Every request given so far, in the order given (up front: by arrival step)."""
        self.aborts: dict[str, int] = {}
        """Request id -> the step it is aborted before."""
        self.resets: dict[int, bool] = {}
        """Step -> ``reset_running_requests`` of the prefix-cache reset before it."""
        self.pauses: dict[int, str] = {}
        """Step -> the pause state set before it."""
        self.accepted: dict[int, dict[str, int]] = {}
        self.proposed: dict[int, dict[str, int]] = {}
        self.stops: dict[int, dict[str, int]] = {}
        """What ``draws`` answered, per step and request (zeros left out)."""
        self.async_scheduling = config.async_scheduling
        self.prefix_caching = config.enable_prefix_caching
        """Whether the events carry token ids (``reference.token_ids``)."""
        self.pending: ModelOutput | None = None
        """Async scheduling: the last step's output, fed after the next ScheduleStep."""
        self._draw_stop = draws.stopped if isinstance(draws, StopDraws) else None
        # Arrivals and aborts by step, so that a step looks up its own instead of scanning
        # every request.
        self._arrivals: dict[int, list[RequestSpec]] = {}
        self._aborts_at: dict[int, list[str]] = {}
        self._added = 0
        self._last_event_step = 0
        # Arrivals in (arrival_step, the order given).
        for request in sorted(requests, key=lambda r: r.arrival_step):
            self.add(request)

    @classmethod
    def of(cls, scenario: Scenario, max_steps: int | None = None) -> EventDriver:
        """The driver of a scenario: its requests, its tables, its engine calls."""
        driver = cls(
            scenario.profile,
            scenario.config,
            ScenarioDraws(scenario),
            scenario.requests,
            max_steps=max_steps,
        )
        for step, reset_running in (scenario.resets or {}).items():
            driver.reset_prefix_cache(reset_running, step)
        for step, pause_state in (scenario.pauses or {}).items():
            driver.set_pause_state(pause_state, step)
        return driver

    def add(self, request: RequestSpec) -> None:
        """``request`` arrives before step ``request.arrival_step`` (not a past one)."""
        if request.arrival_step < self.step:
            raise ValueError(
                f"request {request.id!r} arrives at step {request.arrival_step},"
                f" but step {self.step} is next"
            )
        self.requests.append(request)
        self._arrivals.setdefault(request.arrival_step, []).append(request)
        self._last_event_step = max(self._last_event_step, request.arrival_step)
        if request.abort_step is not None:
            self.abort(request.id, request.abort_step)

    def abort(self, request_id: str, step: int | None = None) -> None:
        """Abort ``request_id`` before ``step`` (the next one by default); once."""
        if request_id in self.aborts:
            return
        step = self.step if step is None else step
        self.aborts[request_id] = step
        self._aborts_at.setdefault(step, []).append(request_id)
        self._last_event_step = max(self._last_event_step, step)

    def reset_prefix_cache(self, reset_running_requests: bool, step: int | None = None) -> None:
        """The engine resets the prefix cache before ``step`` (the next one by default)."""
        step = self._engine_call_step(step)
        self.resets[step] = reset_running_requests

    def set_pause_state(self, pause_state: str, step: int | None = None) -> None:
        """The engine sets ``pause_state`` before ``step`` (the next one by default)."""
        step = self._engine_call_step(step)
        self.pauses[step] = pause_state

    def _engine_call_step(self, step: int | None) -> int:
        step = self.step if step is None else step
        if step < self.step:
            raise ValueError(f"an engine call before step {step}, but step {self.step} is next")
        self._last_event_step = max(self._last_event_step, step)
        return step

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

    def advance(self, reference: Reference, *others: Consumer) -> DrivenStep:
        """Run step ``self.step``: feed its events to ``reference``, then to ``others``,
        event by event."""
        before = self._before_step()
        record = None
        for event in before:
            record = reference.handle(event)
            for other in others:
                other.handle(event)
        assert record is not None  # the events end with a ScheduleStep
        step = self._after_step(record, reference.state, before)
        after: tuple[Event, ...]
        if self.async_scheduling:
            # The batch queue: this step's output waits for the next step's schedule.
            after = () if self.pending is None else (self.pending,)
            self.pending = step.output
        elif step.proposals is None:
            after = (step.output,)
        else:
            after = (step.output, step.proposals)
        step = dataclasses.replace(step, after=after)
        for event in after:
            reference.handle(event)
            for other in others:
                other.handle(event)
        self.step = record.step + 1
        return step

    def drain(self, reference: Reference, *others: Consumer) -> ModelOutput | None:
        """Async scheduling, once the run is over: feed the output still in flight (the
        engine applies it with nothing left to schedule). Returns it, if there was one."""
        output, self.pending = self.pending, None
        if output is not None:
            reference.handle(output)
            for other in others:
                other.handle(output)
        return output

    def scenario(self, upto_step: int | None = None) -> Scenario:
        """Every event up to and including step ``upto_step`` (all by default), as a
        scenario whose acceptance and draft tables are what was drawn."""
        last = max(self.step, self._last_event_step) if upto_step is None else upto_step
        requests = tuple(
            dataclasses.replace(
                r, abort_step=self.aborts[r.id] if self.aborts.get(r.id, last + 1) <= last else None
            )
            for r in self.requests
            if r.arrival_step <= last
        )
        if not requests:  # the format wants one; it arrives after the last step kept
            requests = (RequestSpec("unused", 1, 1, last + 1),)
        return Scenario(
            self.profile,
            self.config,
            requests,
            Acceptance(
                fixed=None,
                explicit={s: dict(row) for s, row in self.accepted.items() if s <= last},
            ),
            Drafts(explicit={s: dict(row) for s, row in self.proposed.items() if s <= last})
            if self.k > 0
            else None,
            {s: dict(row) for s, row in self.stops.items() if s <= last} or None,
            {s: v for s, v in self.resets.items() if s <= last} or None,
            {s: v for s, v in self.pauses.items() if s <= last} or None,
        )

    def _before_step(self) -> list[Event]:
        """The arrivals, aborts and engine calls due before step ``self.step``, then its
        ScheduleStep."""
        events: list[Event] = []
        for request in self._arrivals.get(self.step, ()):
            ids = request.prompt_token_ids if self.prefix_caching else None
            if self.prefix_caching and ids is None:
                ids = unique_prompt(request.id, request.prompt_len)
            events.append(
                AddRequest(
                    request.id,
                    request.prompt_len,
                    request.max_tokens,
                    request.priority,
                    # Arrival order as vLLM's arrival_time: priority ties break on it.
                    float(self._added),
                    prompt_token_ids=ids,
                )
            )
            self._added += 1
        events += [Abort(rid) for rid in self._aborts_at.get(self.step, ())]
        if self.step in self.resets:
            events.append(ResetPrefixCache(self.resets[self.step]))
        if self.step in self.pauses:
            events.append(SetPauseState(self.pauses[self.step]))
        events.append(ScheduleStep())
        return events

    def _after_step(
        self, record: StepRecord, state: SchedulerState, before: list[Event]
    ) -> DrivenStep:
        """The step's ModelOutput and the DraftProposals that follow it, drawn and kept."""
        num_sampled: dict[str, int] = {}
        decoding: list[str] = []
        requests, step = state.requests, record.step
        spec_tokens = record.scheduled_spec_tokens
        padded = state.last_padded
        draw_accepted = self.draws.accepted
        accepted_row: dict[str, int] = {}
        rejected = 0
        for rid in record.num_scheduled_tokens:
            if requests[rid].is_prefill_chunk:
                num_sampled[rid] = 0  # a prefill chunk short of the prompt's end
                continue
            # Padding placeholders are verified but never accepted: only real drafts are.
            real = 0 if rid in padded else spec_tokens.get(rid, 0)
            if real:
                accepted = draw_accepted(step, rid, real)
                if accepted:
                    accepted_row[rid] = accepted
                if accepted < real:
                    rejected += 1
                num_sampled[rid] = 1 + accepted
            else:
                num_sampled[rid] = 1
            decoding.append(rid)
        if accepted_row:
            self.accepted[step] = accepted_row
        stopped: dict[str, int] = {}
        draw_stop = self._draw_stop
        if draw_stop is not None:
            for rid in decoding:
                kept = draw_stop(step, rid, num_sampled[rid])
                if kept > 0:
                    stopped[rid] = min(kept, num_sampled[rid])
            if stopped:
                self.stops[step] = dict(stopped)
        proposals = None
        if self.k > 0 and not self.async_scheduling:
            num_drafts = self.draws.proposed(step, decoding)
            row = {rid: n for rid, n in num_drafts.items() if n}
            if row:
                self.proposed[step] = row
            proposals = DraftProposals(num_drafts)
        self._note_stall(record, state)
        token_ids: dict[str, tuple[int, ...]] = {}
        if self.prefix_caching:
            token_ids = {
                rid: sampled_token_ids(rid, n, stopped.get(rid, 0))
                for rid, n in num_sampled.items()
                if n > 0
            }
        output = ModelOutput(
            num_sampled, stopped, step if self.async_scheduling else None, token_ids=token_ids
        )
        return DrivenStep(record, before, output, proposals, rejected)

    def _note_stall(self, record: StepRecord, state: SchedulerState) -> None:
        # A step that scheduled and preempted nothing leaves the state as it was; with no
        # event left to come, every later step would be the same. (Under async the
        # output in flight is such an event while it carries any scheduled request.)
        if record.num_scheduled_tokens or record.preempted or record.step < self._last_event_step:
            return
        if self.pending is not None and self.pending.num_sampled:
            return
        unfinished = tuple(rid for rid, r in state.requests.items() if not r.finished)
        if unfinished:
            self.stall = Stall(record.step, unfinished)


def drive(driver: EventDriver, reference: Reference, *others: Consumer) -> Iterator[DrivenStep]:
    """Run ``driver`` to its end (every request finished, a stall, or ``max_steps``),
    feeding each event to ``reference`` and then to each of ``others``; yields each step
    once all of its events are fed. A caller that stops pulling stops the run there."""
    while not driver.done(reference.state):
        yield driver.advance(reference, *others)
    driver.drain(reference, *others)


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
        self.scheduler = make_scheduler(
            scenario.config,
            profile_named(scenario.profile),
            check=check,
            scenario=scenario.to_json(),
        )
        self.driver = EventDriver.of(scenario, max_steps)

    @property
    def stall(self) -> Stall | None:
        return self.driver.stall

    def steps(self) -> Iterator[DrivenStep]:
        return drive(self.driver, self.scheduler)

    def records(self) -> Iterator[StepRecord]:
        return (step.record for step in self.steps())
