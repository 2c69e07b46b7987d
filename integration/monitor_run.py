"""The live vLLM scheduler alone, judged by the contract monitor only (``--monitor-only``).

Where no profile matches a scheduler's decisions (or the user asks for it), there is no
reference to compare with, but the contract can still be checked: ``LiveAlone`` is the
lockstep's interface (what the fuzz's machines call) over the live scheduler alone. The
one event driver (``reference.runs.driver.EventDriver``) follows vLLM's own decisions instead
of the reference's: ``LiveState`` is what the driver reads of the scheduler it follows
(which requests are unfinished, which scheduled ones finished their prompt, which were
padded), read off vLLM's scheduler after each event. Every step is judged by
``integration.monitor``; the run is written as a scenario like any lockstep run, so
``dualbudget fuzz --replay FILE --monitor-only`` replays a violation.

vLLM failing one of its own assertions ends the example (``LiveCrash``): with no
reference, nothing says whether the reference would have failed there too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from dualbudget.reference.events import Event, ScheduleStep, StepRecord
from dualbudget.reference.formats.scenario import Scenario
from dualbudget.reference.runs.driver import EventDriver, drive
from dualbudget.reference.state import SchedulerState
from dualbudget.spec.config import EngineConfig

from .live import LiveScheduler, Unsupported
from .lockstep import ConfigRefused, LiveRun, Lockstep, MirroredCrash, _failure, _no_stop
from .monitor import MonitorViolation, wanted_before
from .vllm_api import AdapterFailure


class LiveCrash(MirroredCrash):
    """vLLM failed on an event with no reference beside it: the example ends there."""


@dataclass(frozen=True)
class LiveRequest:
    finished: bool
    is_prefill_chunk: bool


@dataclass
class LiveState:
    """What ``EventDriver`` reads of the scheduler it follows, from vLLM's: its
    unfinished requests (vLLM drops a request once finished), its queues, whether
    finished ids are still to be reported (``has_finished_requests``), and the requests
    of the last step whose spec tokens were padding (admitted from the waiting queue
    with spec tokens, which no real draft gives a request before its first step)."""

    requests: dict[str, LiveRequest]
    running: list[str]
    waiting: list[str]
    finished_since_step: list[str]
    last_padded: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, scheduler: Any, last_padded: list[str]) -> LiveState:
        return cls(
            requests={
                str(rid): LiveRequest(bool(r.is_finished()), bool(r.is_prefill_chunk))
                for rid, r in scheduler.requests.items()
            },
            running=[str(r.request_id) for r in scheduler.running],
            waiting=[str(r.request_id) for r in scheduler.waiting],
            finished_since_step=["?"] if scheduler.has_finished_requests() else [],
            last_padded=last_padded,
        )


class LiveAlone(Lockstep):
    """The live scheduler behind ``Lockstep``'s interface, with no reference: the events
    follow vLLM's decisions and the contract monitor judges every step. A config vLLM
    refuses voids the example (``ConfigRefused``)."""

    def __init__(
        self,
        config: EngineConfig,
        profile: str,
        *,
        seed: int | None = None,
        out_dir: str | Path | None = None,
        label: str = "monitor-only",
        live: LiveScheduler | None = None,
        driver: EventDriver | None = None,
    ) -> None:
        # Lockstep's own construction builds the reference: none here, only what every
        # live run holds.
        LiveRun.__init__(
            self, config, profile, seed=seed, out_dir=out_dir, label=label, driver=driver
        )
        try:
            self.watch(live if live is not None else LiveScheduler(config))
        except Unsupported as err:
            raise ConfigRefused(f"live: {err.reason}") from None
        self._padded: list[str] = []

    def _crash(self, err: Exception) -> LiveCrash:
        """vLLM's failure: with no reference, no name of the assertion the reference
        mirrors."""
        return LiveCrash(f"live: {_failure(err)}", None, self.step)

    @property
    def state(self) -> SchedulerState:
        # The driver reads only LiveState's fields of the state it is handed.
        return cast(SchedulerState, LiveState.of(self.live.scheduler, self._padded))

    def unfinished(self) -> list[str]:
        live, aborts, step = self.live.scheduler.requests, self.driver.aborts, self.driver.step
        return [
            r.id
            for r in self.driver.requests
            if r.id not in aborts and (r.arrival_step >= step or r.id in live)
        ]

    def run_step(
        self,
        accept: Callable[[str, int], int],
        propose: Callable[[str], int],
        stop: Callable[[str, int], int] | None = None,
    ) -> tuple[StepRecord, StepRecord]:
        """One engine step of the live scheduler alone (``Lockstep.run_step``); its
        record twice, as both sides of the pair."""
        self.draws.accept, self.draws.propose = accept, propose
        self.draws.stop = stop if stop is not None else _no_stop
        step = self.driver.advance(self)
        self.coverage["rejected_drafts"] += step.rejected_drafts
        self.finished |= set(step.record.finished)
        return step.record, step.record

    def handle(self, event: Event) -> StepRecord | None:
        if isinstance(event, ScheduleStep):
            return self._schedule_alone()
        try:
            self._feed_live(event)
        except AdapterFailure:
            raise  # the adapter cannot drive this vLLM: not vLLM failing
        except Exception as err:  # vLLM's own assertion: the example ends here
            raise self._crash(err) from None
        return None

    def _schedule_alone(self) -> StepRecord:
        scheduler = self.live.scheduler
        wanted = wanted_before(scheduler)
        in_flight = bool(self.live.pending_steps)
        try:
            live = self.live.handle(ScheduleStep())
        except AdapterFailure:
            raise
        except Exception as err:
            raise self._crash(err) from None
        assert live is not None
        self.compared += 1
        self.last_live = live
        self._padded = [
            rid for rid in live.scheduled_spec_tokens if rid in wanted and not wanted[rid].running
        ]
        self._count_alone(live, in_flight)
        self._monitor(live, wanted)
        return live

    def _count_alone(self, live: StepRecord, in_flight: bool) -> None:
        """The coverage events vLLM's own state shows (``coverage.CoverageEvent.alone``),
        counted as ``Lockstep`` counts them from the reference's."""
        cov, requests = self.coverage, self.live.scheduler.requests
        cov["preemption"] += len(live.preempted)
        cov["padded_decode"] += len(self._padded)
        cov["async_in_flight"] += in_flight
        for rid in live.num_scheduled_tokens:
            request = requests.get(rid)
            if request is not None and request.num_computed_tokens < request.num_prompt_tokens:
                cov["chunked_prefill"] += 1


def run_alone(
    scenario: Scenario, *, max_steps: int | None = None
) -> tuple[int, list[MonitorViolation], str | None]:
    """``scenario``'s event stream into the live scheduler alone: the steps run, the
    monitor's violations, and vLLM's crash if it failed one of its assertions."""
    driver = EventDriver.of(scenario, max_steps)
    lock = LiveAlone(scenario.config, scenario.profile, driver=driver)
    crash = None
    try:
        for _ in drive(driver, lock):
            pass
    except LiveCrash as err:
        crash = str(err)
    return lock.compared, list(lock.monitor.violations), crash
