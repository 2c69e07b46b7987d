"""Lockstep: the reference and the live vLLM scheduler on one event stream.

``Lockstep`` is the pair behind the event interface: every event goes to both, in the
same order, and after each ``ScheduleStep`` their ``StepRecord.decision()`` must be
equal, and so must their KV pools' free blocks. The comparison is exact: ``decision()``
already sorts ``preempted`` and ``finished`` (sets in vLLM, whose iteration order means
nothing) and compares ``num_scheduled_tokens``/``scheduled_spec_tokens`` as dicts (order
inside a step is not part of the decision). Nothing else is normalised.

The events come from the reference's one driver (``reference.runs.driver.EventDriver``):
either the caller's draws step by step (``run_step(accept, propose)``, the fuzz) or a
scenario's tables (``run_in_lockstep``). The driver keeps what it drew, so the first
divergence is written as a scenario file with explicit tables that ``dualbudget fuzz
--replay FILE`` runs in lockstep again, event for event.

Beside the comparison, the contract monitor (``integration.monitor``) judges every live
step on its own, from vLLM's output and KV state: a second opinion that does not depend
on the reference, kept apart (``Lockstep.monitor.violations``) and never raised.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import (
    Event,
    ResetPrefixCache,
    ScheduleStep,
    SetPauseState,
    StepRecord,
)
from dualbudget.reference.formats.scenario import (
    Acceptance,
    RequestSpec,
    Scenario,
    dump_scenario,
    validate,
)
from dualbudget.reference.runs.driver import EventDriver, drive
from dualbudget.reference.scheduler import GrantCounts, UnmirroredVllmCrash
from dualbudget.reference.state import SchedulerState
from dualbudget.reference.violations import VLLM_CRASHES, StepViolation, raised_as
from dualbudget.spec.config import EngineConfig
from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import profile_named

from .books import call_books, snapshot
from .coverage import EVENT_NAMES
from .live import LiveScheduler, Unsupported
from .monitor import Monitor, MonitorViolation, Wanted, readable, step_seen, wanted_before
from .vllm_api import AdapterFailure


@dataclass
class Divergence:
    kind: str
    """``decision``, ``free_blocks`` (the pools' free blocks after the step differ),
    ``validation`` (one side refuses the config) or ``crash``."""
    step: int
    reference: Any
    live: Any
    seed: int | None = None
    scenario_path: str | None = None
    replay_command: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "step": self.step,
            "reference": self.reference,
            "live": self.live,
            "seed": self.seed,
            "scenario": self.scenario_path,
            "replay": self.replay_command,
        }

    def report(self) -> str:
        lines = [
            f"DIVERGENCE ({self.kind}) at step {self.step}"
            + (f", seed {self.seed}" if self.seed is not None else ""),
            f"  reference: {json.dumps(self.reference, sort_keys=True)}",
            f"  live:      {json.dumps(self.live, sort_keys=True)}",
        ]
        if self.scenario_path:
            lines.append(f"  scenario:  {self.scenario_path}")
            lines.append(f"  reproduce: {self.replay_command}")
        return "\n".join(lines)


class DivergenceFound(Exception):
    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.report())
        self.divergence = divergence


class ConfigRefused(Exception):
    """Both sides refuse the config: not a divergence, the example is void."""


class MirroredCrash(Exception):
    """Both sides fail on the same event (the reference mirrors a vLLM assertion with
    ``UnmirroredVllmCrash``): they agree, and the run cannot go on. ``crash`` names the
    assertion (``reference.violations.VLLM_CRASHES``; None where no reference ran);
    ``step`` is the driver's step whose events failed."""

    def __init__(self, message: str, crash: str | None, step: int) -> None:
        super().__init__(message)
        self.crash = crash
        self.step = step


def replay_command(path: str | Path) -> str:
    return f"{shlex.quote(sys.executable)} -m dualbudget fuzz --replay {shlex.quote(str(path))}"


class CallerDraws:
    """The driver's ``Draws`` from the callbacks of the step being run:
    ``accept(rid, real_drafts)``, ``propose(rid)`` and ``stop(rid, num_sampled)`` (the
    fuzz's Hypothesis draws), asked in the driver's order, their answers cut into
    ``[0, real_drafts]``, ``[0, K]`` and ``[0, num_sampled]`` (0: no natural stop)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.accept: Callable[[str, int], int] = lambda rid, real_drafts: 0
        self.propose: Callable[[str], int] = lambda rid: 0
        self.stop: Callable[[str, int], int] = lambda rid, num_sampled: 0

    def accepted(self, step: int, request_id: str, real_drafts: int) -> int:
        return min(max(self.accept(request_id, real_drafts), 0), real_drafts)

    def proposed(self, step: int, request_ids: list[str]) -> dict[str, int]:
        return {rid: min(max(self.propose(rid), 0), self.k) for rid in request_ids}

    def stopped(self, step: int, request_id: str, num_sampled: int) -> int:
        return min(max(self.stop(request_id, num_sampled), 0), num_sampled)


class LiveRun:
    """What every run of a live scheduler on the driver's events holds, with or without a
    reference beside it: the config and profile, the driver and the caller's draws, the
    coverage counters, the steps compared, and the contract monitor over the live side.
    ``Lockstep`` adds the reference; ``monitor_run.LiveAlone`` runs the live side alone.
    """

    live: LiveScheduler

    def __init__(
        self,
        config: EngineConfig,
        profile: str,
        *,
        seed: int | None,
        out_dir: str | Path | None,
        label: str,
        driver: EventDriver | None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.seed = seed
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.label = label
        self.k = config.num_speculative_tokens
        self.layout = config.layout.name if config.layout is not None else "none"
        self.draws = CallerDraws(self.k)
        self.driver = driver or EventDriver(profile, config, self.draws)
        self.coverage: dict[str, int] = dict.fromkeys(EVENT_NAMES, 0)
        """Per coverage event (``coverage.COVERAGE``), the times this run reached it: the
        reference's own counters (``Scheduler.observed``) and those counted here."""
        self.violations: list[StepViolation] = []
        self.finished: set[str] = set()
        self.compared = 0
        """Steps whose decisions were made (and, beside a reference, compared)."""
        self.last_live: StepRecord | None = None
        """The live scheduler's record of the last step."""

    def watch(self, live: LiveScheduler) -> None:
        """Take ``live`` as the live side, with the contract monitor over it."""
        self.live = live
        self.construction = live.construction
        self.monitor = Monitor(
            self.config,
            num_lookahead_tokens=int(getattr(live.scheduler, "num_lookahead_tokens", 0)),
        )
        """The contract monitor's opinion on every live step (``monitor``): its
        violations are kept in ``monitor.violations``, never raised."""
        self.monitored = readable(getattr(live, "scheduler", None))
        """The live side is vLLM's scheduler (not a test's stand-in): the monitor reads it."""

    @property
    def step(self) -> int:
        """The index of the next step."""
        return self.driver.step

    def _feed_live(self, event: Event) -> None:
        """Feed ``event`` to the live scheduler; an engine call between steps is judged
        by the monitor (C12) on vLLM's books just before and just after it."""
        if not (self.monitored and isinstance(event, ResetPrefixCache | SetPauseState)):
            self.live.handle(event)
            return
        before = snapshot(self.live.scheduler)
        self.live.handle(event)
        resets = isinstance(event, ResetPrefixCache) and event.reset_running_requests
        books = call_books(before, snapshot(self.live.scheduler))
        self.monitor.judge_call(self.step, repr(event), books, resets_running=resets)

    @property
    def requests(self) -> list[RequestSpec]:
        return self.driver.requests

    # -- what the caller does -----------------------------------------------------------
    def add(
        self,
        prompt_len: int,
        max_tokens: int,
        priority: int = 0,
        prompt_token_ids: tuple[int, ...] | None = None,
    ) -> str:
        """A request arriving before the next step; returns its id. ``prompt_token_ids``
        matter only with prefix caching on (the driver then makes ids for a prompt with
        none)."""
        rid = str(len(self.driver.requests))
        self.driver.add(
            RequestSpec(
                rid,
                prompt_len,
                max_tokens,
                self.driver.step,
                priority,
                prompt_token_ids=prompt_token_ids,
            )
        )
        return rid

    def abort(self, rid: str) -> None:
        """Abort ``rid`` before the next step (once)."""
        self.driver.abort(rid)

    def reset_prefix_cache(self, reset_running_requests: bool) -> None:
        """The engine resets the prefix cache before the next step."""
        self.driver.reset_prefix_cache(reset_running_requests)

    def set_pause_state(self, pause_state: str) -> None:
        """The engine pauses (``paused_new``, ``paused_all``) or resumes before the next
        step."""
        self.driver.set_pause_state(pause_state)

    def _monitor(self, live: StepRecord, wanted: dict[str, Wanted]) -> list[MonitorViolation]:
        """The monitor's verdict on the live step just made (before any comparison, so
        that a diverging step is judged too)."""
        # The step's own victims: not those an engine call preempted before it.
        before = self.live.preempted_before_step
        seen = step_seen(
            self.live.scheduler,
            live.step,
            live.num_scheduled_tokens,
            [rid for rid in live.preempted if rid not in before] if before else live.preempted,
            wanted,
            live.scheduled_spec_tokens,
        )
        return self.monitor.judge(seen)

    # -- the scenario of the run ----------------------------------------------------------
    def scenario(self, upto_step: int) -> Scenario:
        """Every event up to and including step ``upto_step``, as a scenario."""
        return self.driver.scenario(upto_step)

    def write_scenario(self, upto_step: int, kind: str = "divergence") -> Path:
        """The run up to ``upto_step`` as a scenario file under ``out_dir``, named by
        ``kind`` (``divergence``, or ``monitor-C3`` etc. for a monitor violation)."""
        out_dir = self.out_dir if self.out_dir is not None else Path(".")
        out_dir.mkdir(parents=True, exist_ok=True)
        seed = "" if self.seed is None else f"-seed{self.seed}"
        path = out_dir / f"{kind}-{self.label}{seed}-step{upto_step}.json"
        dump_scenario(self.scenario(upto_step), path)
        return path


class Lockstep(LiveRun):
    """One reference and one live scheduler, fed the same events.

    ``profile`` names the reference's profile; the live side is whatever vLLM is
    installed (``live``: one built by the caller, e.g. of the trace recorder's class).
    Without ``driver`` the caller makes the run: ``add``, ``abort`` and ``run_step``;
    with one (a scenario's, ``EventDriver.of``) the run is ``drive(lock.driver, lock)``.
    Raises ``ConfigRefused`` when both refuse the config and ``DivergenceFound`` when only
    one does, or when they decide differently, or one of them crashes; with ``out_dir``
    the divergence is written there as a scenario first.
    """

    def __init__(
        self,
        config: EngineConfig,
        profile: str,
        *,
        seed: int | None = None,
        out_dir: str | Path | None = None,
        label: str = "lockstep",
        live: LiveScheduler | None = None,
        driver: EventDriver | None = None,
    ) -> None:
        super().__init__(config, profile, seed=seed, out_dir=out_dir, label=label, driver=driver)
        ref_error = live_error = None
        try:
            validate(Scenario(profile, config, (RequestSpec("probe", 1, 1),), Acceptance()))
            self.reference = make_scheduler(
                config, profile_named(profile), check="collect", judge_books=True
            )
        except BadInput as err:
            ref_error = str(err)
        try:
            self.live = live if live is not None else LiveScheduler(config)
        except Unsupported as err:
            live_error = err.reason
        if ref_error and live_error:
            raise ConfigRefused(f"reference: {ref_error}; live: {live_error}")
        if ref_error or live_error:
            self._diverge(
                "validation",
                f"refuses: {ref_error}" if ref_error else "accepts",
                f"refuses: {live_error}" if live_error else "accepts",
            )
        self.watch(self.live)

    @property
    def state(self) -> SchedulerState:
        """The reference's state: the stream follows its decisions (which are the live
        scheduler's while the two agree)."""
        return self.reference.state

    def unfinished(self) -> list[str]:
        requests, aborts = self.reference.state.requests, self.driver.aborts
        return [
            r.id
            for r in self.driver.requests
            if r.id not in aborts and (r.id not in requests or not requests[r.id].finished)
        ]

    def run_step(
        self,
        accept: Callable[[str, int], int],
        propose: Callable[[str], int],
        stop: Callable[[str, int], int] | None = None,
    ) -> tuple[StepRecord, StepRecord]:
        """One engine step: ``accept(rid, real_drafts)``, ``propose(rid)`` and
        ``stop(rid, num_sampled)`` (none stops without it) are asked for each request
        that reached the end of its prompt (``Draws``' order). Under async scheduling the
        step's output is fed after the next step's schedule."""
        self.draws.accept, self.draws.propose = accept, propose
        self.draws.stop = stop if stop is not None else _no_stop
        step = self.driver.advance(self)
        self.coverage["rejected_drafts"] += step.rejected_drafts
        # The outputs fed after the schedule count too (stale output, natural stops).
        self.coverage.update(self.reference.observed)
        self.finished |= set(step.record.finished)
        assert self.last_live is not None
        return step.record, self.last_live

    # -- the consumer ---------------------------------------------------------------------
    def handle(self, event: Event) -> StepRecord | None:
        """Feed ``event`` to both; for a ``ScheduleStep``, the reference's record once the
        two decisions are found equal."""
        if isinstance(event, ScheduleStep):
            return self._schedule()
        self._feed(event)
        return None

    def _feed(self, event: Event) -> None:
        ref_error = live_error = None
        crash = None
        try:
            self.reference.handle(event)
        except UnmirroredVllmCrash as err:
            ref_error, crash = f"{type(err).__name__}: {err}", err.crash
        live_raised: Exception | None = None
        try:
            self._feed_live(event)
        except AdapterFailure:
            raise  # the adapter cannot drive this vLLM: nothing to compare
        except Exception as err:  # vLLM's own assertion: reported, never swallowed
            live_error, live_raised = _failure(err), err
        self._both_or_diverge(ref_error, crash, live_error, live_raised)

    def _both_or_diverge(
        self,
        ref_error: str | None,
        crash: str | None,
        live_error: str | None,
        live_raised: Exception | None,
    ) -> None:
        """Both sides failed on the same event: a mirrored crash when vLLM's exception is
        the one the reference names (``reference.violations.VLLM_CRASHES``), else a
        divergence; one side failing alone is a divergence."""
        if ref_error and live_error:
            if crash is not None and live_raised is not None and raised_as(live_raised, crash):
                raise MirroredCrash(f"reference: {ref_error}; live: {live_error}", crash, self.step)
            ref_error += f" (vLLM raises {VLLM_CRASHES[crash]})" if crash else ""
        if ref_error or live_error:
            self._diverge("crash", ref_error or "ok", live_error or "ok")

    def _schedule(self) -> StepRecord:
        state = self.reference.state
        before = {
            rid: (
                state.requests[rid].num_computed_tokens,
                state.requests[rid].num_tokens_with_spec
                + state.requests[rid].num_output_placeholders,
            )
            for rid in state.running
        }
        grants = dataclasses.replace(self.reference.grants)
        ref_error = live_error = None
        crash = None
        record = live = None
        try:
            record = self.reference.handle(ScheduleStep())
        except UnmirroredVllmCrash as err:
            ref_error, crash = f"{type(err).__name__}: {err}", err.crash
        wanted = wanted_before(self.live.scheduler) if self.monitored else None
        live_raised: Exception | None = None
        try:
            live = self.live.handle(ScheduleStep())
        except AdapterFailure:
            raise
        except Exception as err:
            live_error, live_raised = _failure(err), err
        if live is not None and wanted is not None:
            self._monitor(live, wanted)
        self._both_or_diverge(ref_error, crash, live_error, live_raised)
        assert record is not None and live is not None
        self.compared += 1
        self.last_live = live
        if len(self.reference.violations) > len(self.violations):
            self.violations = list(self.reference.violations)
        if record.decision() != live.decision():
            self._diverge("decision", record.decision(), live.decision(), record.step)
        # The KV manager's state, not only its verdicts: a block held or freed a step
        # early moves no decision until the pool runs short, maybe never in a short run.
        if self.reference.state.free_blocks != self.live.num_free_blocks:
            self._diverge(
                "free_blocks",
                self.reference.state.free_blocks,
                self.live.num_free_blocks,
                record.step,
            )
        self._count(record, before, grants)
        self.coverage.update(self.reference.observed)
        return record

    def _count(
        self,
        record: StepRecord,
        before: dict[str, tuple[int, int]],
        grants: GrantCounts,
    ) -> None:
        """The step's events counted here; ``grants`` is the reference's ``GrantCounts``
        before the step."""
        cov, state, now = self.coverage, self.reference.state, self.reference.grants
        cov["input_budget_bound"] += now.cut_by_input_budget > grants.cut_by_input_budget
        cov["preempt_scheduled"] += now.refunds - grants.refunds
        cov["preemption"] += len(record.preempted)
        cov["padded_decode"] += len(state.last_padded)
        cov["bound_after_refund"] += now.cut_after_refund - grants.cut_after_refund
        token_budget, input_budget = self.reference.rules.opened
        if token_budget < input_budget:
            cov["token_budget_bound"] += now.cut_to_token_budget - grants.cut_to_token_budget
        limit = self.config.max_model_len
        for rid, q in record.num_scheduled_tokens.items():
            request = state.requests[rid]
            if request.num_computed_tokens < request.num_tokens:
                cov["chunked_prefill"] += 1
            if rid in before:
                computed, with_spec = before[rid]
                if q == limit - computed - 1 and q < with_spec - computed:
                    cov["max_model_len_cap"] += 1

    def _diverge(self, kind: str, reference: Any, live: Any, step: int | None = None) -> None:
        step = self.step if step is None else step
        path = self.write_scenario(step) if self.out_dir is not None else None
        raise DivergenceFound(
            Divergence(
                kind,
                step,
                reference,
                live,
                self.seed,
                None if path is None else str(path),
                None if path is None else replay_command(path),
            )
        )


def _no_stop(request_id: str, num_sampled: int) -> int:
    return 0


def _failure(err: BaseException) -> str:
    """vLLM's exception in one line, with where it was raised."""
    return f"{type(err).__name__}: {err}".strip() + _where(err)


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {Path(last.filename).name}:{last.lineno})"


def run_in_lockstep(
    scenario: Scenario,
    *,
    out_dir: str | Path | None = None,
    max_steps: int | None = None,
    live: LiveScheduler | None = None,
    monitored: list[MonitorViolation] | None = None,
) -> tuple[int, Divergence | None]:
    """Run ``scenario``'s event stream (its tables, through ``EventDriver``) into the
    reference and a live scheduler (``live``, or one of vLLM's own); returns the steps
    compared and the first divergence (None when the decisions agree throughout). The
    divergence is written under ``out_dir`` only when one is given; the monitor's
    violations are added to ``monitored`` when one is given."""
    driver = EventDriver.of(scenario, max_steps)
    try:
        lock = Lockstep(
            scenario.config, scenario.profile, out_dir=out_dir, live=live, driver=driver
        )
    except DivergenceFound as found:
        return 0, found.divergence
    try:
        for _ in drive(driver, lock):
            pass
    except DivergenceFound as found:
        return lock.compared, found.divergence
    finally:
        if monitored is not None:
            monitored += lock.monitor.violations
    return lock.compared, None


def live_records(
    scenario: Scenario, live: LiveScheduler, max_steps: int | None = None
) -> list[StepRecord]:
    """``live``'s step records for ``scenario``'s event stream, run in lockstep with the
    reference (which makes the events that depend on state: sampled counts, drafts).
    Raises ``DivergenceFound`` at the first step the two decide differently."""
    driver = EventDriver.of(scenario, max_steps)
    lock = Lockstep(scenario.config, scenario.profile, live=live, driver=driver)
    records = []
    for _ in drive(driver, lock):
        assert lock.last_live is not None
        records.append(lock.last_live)
    return records
