"""Lockstep: the reference and the live vLLM scheduler on one event stream.

Both consumers get every event in the same order; after each ``ScheduleStep`` their
``StepRecord.decision()`` must be equal. The comparison is exact: ``decision()`` already
sorts ``preempted`` and ``finished`` (sets in vLLM, whose iteration order means nothing)
and compares ``num_scheduled_tokens``/``scheduled_spec_tokens`` as dicts (order inside a
step is not part of the decision). Nothing else is normalised.

The events are generated the way ``reference.driver.ScenarioDriver`` generates them
(arrivals, then aborts, then the step; after it the ``ModelOutput`` and the
``DraftProposals``), and the run keeps them as a scenario (explicit acceptance and draft
tables), so the first divergence is written as a scenario file that ``dualbudget fuzz
--replay FILE`` replays through the driver, event for event.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualbudget.reference.contract import RecordedViolation
from dualbudget.reference.driver import ScenarioDriver
from dualbudget.reference.events import (
    Abort,
    AddRequest,
    DraftProposals,
    Event,
    ModelOutput,
    ScheduleStep,
    StepRecord,
)
from dualbudget.reference.scenario import (
    Acceptance,
    Drafts,
    RequestSpec,
    Scenario,
    dump_scenario,
    validate,
)
from dualbudget.reference.scheduler import Scheduler, UnmirroredVllmCrash
from dualbudget.spec.config import EngineConfig
from dualbudget.spec.errors import BadInput
from dualbudget.spec.kernel import BudgetKernel
from dualbudget.spec.profiles import profile_named

from .live import LiveScheduler, Unsupported

COVERAGE_EVENTS = (
    "input_budget_bound",
    "chunked_prefill",
    "preemption",
    "preempt_scheduled",
    "padded_decode",
    "rejected_drafts",
    "max_model_len_cap",
)
"""The abstract events a run counts, per method (the issue's coverage list):
a grant cut by the draft/input budget, a prefill chunk short of the prompt, a
preemption, a preemption of a request already scheduled in the same step, a new decode
padded to 1 + K, a step output rejecting drafts, a grant cut at max_model_len."""


class KernelCounters:
    """Counts what the reference asks of its budget kernel (``spec.kernel``); decides
    nothing itself: ``kernel`` is the reference's own, its answers passed through.

    ``input_bound``: grants cut below ``min(need, token_budget)``, i.e. by the
    draft/input budget. ``refunds``: refunds of a request already scheduled this step
    (the kernel's ``give_back``, which only that preemption calls).
    """

    def __init__(self, kernel: BudgetKernel) -> None:
        self.input_bound = 0
        self.refunds = 0
        self._grant, self._give_back = kernel.grant, kernel.give_back
        self.kernel = dataclasses.replace(kernel, grant=self.grant, give_back=self.give_back)

    def grant(self, token_budget: int, input_budget: int, need: int) -> int:
        q = self._grant(token_budget, input_budget, need)
        if q < min(need, token_budget):
            self.input_bound += 1
        return q

    def give_back(self, token_budget: int, input_budget: int, q: int) -> tuple[int, int]:
        self.refunds += 1
        return self._give_back(token_budget, input_budget, q)


@dataclass
class Divergence:
    kind: str
    """``decision``, ``validation`` (one side refuses the config) or ``crash``."""
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
    ``UnmirroredVllmCrash``): they agree, and the run cannot go on."""


def replay_command(path: str | Path) -> str:
    return f"{shlex.quote(sys.executable)} -m dualbudget fuzz --replay {shlex.quote(str(path))}"


@dataclass
class StepCoverage:
    events: dict[str, int] = field(default_factory=dict)


class Lockstep:
    """One reference and one live scheduler, fed the same events by the caller.

    ``profile`` names the reference's profile; the live side is whatever vLLM is
    installed. Raises ``ConfigRefused`` when both refuse the config and
    ``DivergenceFound`` when only one does.
    """

    def __init__(
        self,
        config: EngineConfig,
        profile: str,
        *,
        seed: int | None = None,
        out_dir: str | Path | None = None,
        label: str = "lockstep",
    ) -> None:
        self.config = config
        self.profile = profile
        self.seed = seed
        self.out_dir = Path(out_dir) if out_dir is not None else Path(".")
        self.label = label
        self.k = config.num_speculative_tokens
        self.layout = (config.layout.name) if config.layout is not None else "none"
        self.step = 0
        self.requests: list[RequestSpec] = []
        self._aborts: dict[str, int] = {}
        self._accepted: dict[int, dict[str, int]] = {}
        self._proposed: dict[int, dict[str, int]] = {}
        self._pending_adds: list[AddRequest] = []
        self._pending_aborts: list[str] = []
        self.coverage: dict[str, int] = dict.fromkeys(COVERAGE_EVENTS, 0)
        self.violations: list[RecordedViolation] = []
        self.finished: set[str] = set()
        ref_error = live_error = None
        try:
            self.scenario_base = validate(
                Scenario(profile, config, (RequestSpec("probe", 1, 1),), Acceptance())
            )
            self.reference = Scheduler(config, profile_named(profile), check="record")
        except BadInput as err:
            ref_error = str(err)
        try:
            self.live = LiveScheduler(config)
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
        self.counters = KernelCounters(self.reference.kernel)
        self.reference.kernel = self.counters.kernel
        self.construction = self.live.construction

    # -- what the caller does -----------------------------------------------------------
    def add(self, prompt_len: int, max_tokens: int, priority: int = 0) -> str:
        rid = str(len(self.requests))
        self.requests.append(RequestSpec(rid, prompt_len, max_tokens, self.step, priority))
        # ScenarioDriver: arrival_time is the arrival's rank, arrivals before aborts.
        self._pending_adds.append(
            AddRequest(rid, prompt_len, max_tokens, priority, float(len(self.requests) - 1))
        )
        return rid

    def abort(self, rid: str) -> None:
        if rid in self._aborts:
            return
        self._aborts[rid] = self.step
        self._pending_aborts.append(rid)

    def unfinished(self) -> list[str]:
        requests = self.reference.state.requests
        pending = {a.request_id for a in self._pending_adds}
        return [
            r.id
            for r in self.requests
            if r.id not in self._aborts and (r.id in pending or not requests[r.id].finished)
        ]

    def run_step(
        self,
        accept: Callable[[str, int], int],
        propose: Callable[[str], int],
    ) -> tuple[StepRecord, StepRecord]:
        """One engine step: ``accept(rid, real_drafts)`` and ``propose(rid)`` are asked
        for each request that reached the end of its prompt."""
        events: list[Event] = [*self._pending_adds]
        events += [Abort(rid) for rid in self._pending_aborts]
        self._pending_adds, self._pending_aborts = [], []
        for event in events:
            self._feed(event)
        state = self.reference.state
        before = {
            rid: (state.requests[rid].num_computed_tokens, state.requests[rid].num_tokens_with_spec)
            for rid in state.running
        }
        input_bound, refunds = self.counters.input_bound, self.counters.refunds
        record, live = self._schedule()
        self._count(record, before, input_bound, refunds)

        # ScenarioDriver.after_step, with the caller's acceptance and proposals.
        num_sampled: dict[str, int] = {}
        decoding: list[str] = []
        for rid in record.num_scheduled_tokens:
            request = state.requests[rid]
            if request.num_computed_tokens < request.num_tokens:
                num_sampled[rid] = 0
                continue
            real = 0 if rid in state.last_padded else record.scheduled_spec_tokens.get(rid, 0)
            accepted = min(max(accept(rid, real), 0), real) if real else 0
            if accepted:
                self._accepted.setdefault(record.step, {})[rid] = accepted
            if accepted < real:
                self.coverage["rejected_drafts"] += 1
            num_sampled[rid] = 1 + accepted
            decoding.append(rid)
        after: list[Event] = [ModelOutput(num_sampled)]
        if self.k > 0:
            proposals = {rid: min(max(propose(rid), 0), self.k) for rid in decoding}
            row = {rid: n for rid, n in proposals.items() if n}
            if row:
                self._proposed[record.step] = row
            after.append(DraftProposals(proposals))
        for event in after:
            self._feed(event)
        self.step = record.step + 1
        self.finished |= set(record.finished)
        return record, live

    # -- internals ----------------------------------------------------------------------
    def _feed(self, event: Event) -> None:
        ref_error = live_error = None
        try:
            self.reference.handle(event)
        except UnmirroredVllmCrash as err:
            ref_error = f"{type(err).__name__}: {err}"
        try:
            self.live.handle(event)
        except Exception as err:  # vLLM's own assertion: reported, never swallowed
            live_error = f"{type(err).__name__}: {err}".strip() + _where(err)
        if ref_error or live_error:
            self._diverge("crash", ref_error or "ok", live_error or "ok")

    def _schedule(self) -> tuple[StepRecord, StepRecord]:
        ref_error = live_error = None
        record = live = None
        try:
            record = self.reference.handle(ScheduleStep())
        except UnmirroredVllmCrash as err:
            ref_error = f"{type(err).__name__}: {err}"
        try:
            live = self.live.handle(ScheduleStep())
        except Exception as err:
            live_error = f"{type(err).__name__}: {err}".strip() + _where(err)
        if ref_error and live_error:
            raise MirroredCrash(f"reference: {ref_error}; live: {live_error}")
        if ref_error or live_error:
            self._diverge("crash", ref_error or "ok", live_error or "ok")
        assert record is not None and live is not None
        if len(self.reference.violations) > len(self.violations):
            self.violations = list(self.reference.violations)
        if record.decision() != live.decision():
            self._diverge("decision", record.decision(), live.decision(), record.step)
        return record, live

    def _count(
        self,
        record: StepRecord,
        before: dict[str, tuple[int, int]],
        input_bound: int,
        refunds: int,
    ) -> None:
        cov, state = self.coverage, self.reference.state
        cov["input_budget_bound"] += self.counters.input_bound > input_bound
        cov["preempt_scheduled"] += self.counters.refunds - refunds
        cov["preemption"] += len(record.preempted)
        cov["padded_decode"] += len(state.last_padded)
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
        path = self.write_scenario(step)
        raise DivergenceFound(
            Divergence(kind, step, reference, live, self.seed, str(path), replay_command(path))
        )

    # -- the scenario of the run ----------------------------------------------------------
    def scenario(self, upto_step: int) -> Scenario:
        """Every event up to and including step ``upto_step``, as a scenario."""
        requests = tuple(
            RequestSpec(
                r.id,
                r.prompt_len,
                r.max_tokens,
                r.arrival_step,
                r.priority,
                self._aborts[r.id]
                if r.id in self._aborts and self._aborts[r.id] <= upto_step
                else None,
            )
            for r in self.requests
            if r.arrival_step <= upto_step
        )
        if not requests:  # the format wants one; it arrives after the last step kept
            requests = (RequestSpec("unused", 1, 1, upto_step + 1),)
        return Scenario(
            self.profile,
            self.config,
            requests,
            Acceptance(
                fixed=None,
                explicit={s: dict(r) for s, r in self._accepted.items() if s <= upto_step},
            ),
            Drafts(explicit={s: dict(r) for s, r in self._proposed.items() if s <= upto_step})
            if self.k > 0
            else None,
        )

    def write_scenario(self, upto_step: int) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        seed = "" if self.seed is None else f"-seed{self.seed}"
        path = self.out_dir / f"divergence-{self.label}{seed}-step{upto_step}.json"
        dump_scenario(self.scenario(upto_step), path)
        return path


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {Path(last.filename).name}:{last.lineno})"


def lockstep_steps(
    scenario: Scenario, live: LiveScheduler, max_steps: int | None = None
) -> Iterator[tuple[StepRecord, StepRecord]]:
    """Feed ``scenario``'s event stream to the reference and to ``live``; yield the two
    records of each step. The reference makes the events that depend on state (sampled
    counts, drafts), which is sound while the two agree; a caller that finds a
    divergence stops pulling before that step's outputs are fed."""
    reference = Scheduler(scenario.config, profile_named(scenario.profile), check="record")
    driver = ScenarioDriver(scenario, max_steps)
    while not driver.done(reference.state):
        record = live_record = None
        for event in driver.before_step():
            record = reference.handle(event)
            live_record = live.handle(event)
        assert record is not None and live_record is not None
        yield record, live_record
        for event in driver.after_step(record, reference.state):
            reference.handle(event)
            live.handle(event)


def replay(
    scenario: Scenario,
    *,
    out_dir: str | Path | None = None,
    max_steps: int | None = None,
) -> tuple[int, Divergence | None]:
    """Run a scenario through ``ScenarioDriver`` into both schedulers; returns the steps
    run and the first divergence (None when the decisions agree throughout)."""
    try:
        live = LiveScheduler(scenario.config)
    except Unsupported as err:
        return 0, Divergence("validation", 0, "accepts", f"refuses: {err.reason}")
    steps = 0
    for record, live_record in lockstep_steps(scenario, live, max_steps):
        steps += 1
        if record.decision() != live_record.decision():
            return steps, Divergence(
                "decision", record.step, record.decision(), live_record.decision()
            )
    return steps, None
