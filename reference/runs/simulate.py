"""What-if simulation: what a budget policy costs or gains on a workload, in steps.

``simulate(scenario, profile)`` drives the reference scheduler (in ``collect`` mode, so a
profile that breaks the contract on the workload is reported, not aborted) through the
scenario and keeps, per step, the requests scheduled, the target tokens ``T``, the draft
input rows ``D``; and per request, the step it arrived, was first scheduled, first produced
an output token and last produced one. Everything here is an exact consequence of the
policy's decisions: the step counts and their ratios between profiles do not depend on any
hardware.

Seconds come only from ``StepTimeModel``: ``t(step) = a + b*T + c*D``, its coefficients
from a named ``Calibration`` (``CALIBRATIONS``): ``illustrative``, the default, of the
order of an 8B model on one modern GPU and measured on nothing; or one fitted to published
runs, with its provenance. Absolute seconds are only as good as the coefficients, ratios
of step counts are exact. How to fit the coefficients from real runs: ``fit_exactly`` and
docs/simulate.md.

Under prefix caching (``enable_prefix_caching``, the scenario's config) each run also
keeps its hits (``PrefixStats``): per request admitted, the prompt tokens its first
admission found cached, and the scheduler's own counters of the cache's events.

``scenario_from_trace`` makes a what-if workload of a recorded trace: its config, its
arrivals and aborts, and the acceptance it measured.

Percentiles are nearest-rank: ``p`` of ``n`` sorted values is the value at
``ceil(p/100 * n) - 1`` (so p50 of ``[1, 2, 3, 4]`` is 2, p99 of 100 values the 99th).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import profile_named, release_profile
from dualbudget.spec.releases import release_of

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
from ..formats.scenario import Acceptance, RequestSpec, Scenario, validate
from ..formats.trace import Entry, Trace, TraceError
from ..scheduler import PREFIX_OBSERVED
from ..token_ids import segment
from ..violations import StepViolation
from .driver import Reference, ScenarioRun, drive
from .replay import check_settings

ProgressFn = Callable[[str, int, int, int], None]
"""``(profile, steps so far, requests finished, requests in all)``."""

DEFAULT_PROFILES = ("vllm-0.32", "vllm-0.33", "dual")
"""The profiles a simulation compares when none is named (``dualbudget simulate``, the
design-review report): the two releases and the upstream proposal, ratios against the
first."""


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of ``values`` (need not be sorted); 0 for no values."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def dist(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "p50", "p99", "max"}`` of ``values`` (all 0 for no values)."""
    if not values:
        return {"mean": 0.0, "p50": 0, "p99": 0, "max": 0}
    return {
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values),
    }


@dataclass(frozen=True)
class StepTimeModel:
    """``t(step) = a + b*T + c*D`` seconds, T target rows, D draft input rows.

    Defaults (a = 8 ms, b = 20 us per target row, c = 5 us per draft row) are an
    illustration, not a measurement. To fit them: run ``vllm bench serve`` for three or more
    configurations (batch size, B, K), simulate each with this tool, and solve the least
    squares ``wall_i = a*steps_i + b*sum(T)_i + c*sum(D)_i`` over the runs; or regress the
    engine's per-step durations on ``(1, T, D)`` directly where step timings are logged.
    """

    a: float = 0.008
    b: float = 20e-6
    c: float = 5e-6

    def step_seconds(self, target: int, draft: int) -> float:
        return self.a + self.b * target + self.c * draft


@dataclass(frozen=True)
class PublishedRun:
    """One measured benchmark run, and the simulator's totals for its workload and profile
    (the left-hand side of the fit)."""

    profile: str
    duration_s: float
    """The benchmark's duration: what the fit matches."""
    output_tokens_per_s: float
    mean_itl_ms: float
    """vLLM's mean inter-token latency, between streamed chunks: with speculative decoding
    one chunk per step, so it compares with the predicted mean step time (not fitted)."""
    acceptance_length: float
    steps: int
    target_rows: int
    """``sum(T)`` over the simulated steps."""
    draft_rows: int
    """``sum(D)`` over the simulated steps."""

    def seconds(self, model: StepTimeModel) -> float:
        """The simulated run's seconds under ``model``."""
        return model.a * self.steps + model.b * self.target_rows + model.c * self.draft_rows


@dataclass(frozen=True)
class Calibration:
    """Coefficients of the step-time model under a name, with where they come from."""

    name: str
    model: StepTimeModel
    provenance: str
    workload: str | None = None
    """The preset (seed 0) whose simulation gave the runs' totals; None: no fit."""
    runs: tuple[PublishedRun, ...] = ()
    fixed: str = ""
    """What the fit did not solve for, and why."""

    def residuals(self) -> list[float]:
        """Per run, predicted minus measured seconds."""
        return [run.seconds(self.model) - run.duration_s for run in self.runs]

    def notes(self) -> list[str]:
        """The calibration in words: provenance, fit, residuals, out-of-sample checks."""
        m = self.model
        lines = [
            f"calibration {self.name}: t = {m.a:.6g} s + {m.b:.6g} s*T + {m.c:.6g} s*D;"
            f" {self.provenance}"
        ]
        if not self.runs:
            return lines
        residuals = ", ".join(
            f"{r.profile} {x:+.2e} s" for r, x in zip(self.runs, self.residuals(), strict=True)
        )
        lines.append(
            f"fit: {len(self.runs)} runs of {self.workload} solved exactly for 2 coefficients"
            f" ({self.fixed}); residuals {residuals}: zero by construction, two runs fit two"
            " coefficients exactly, so they do not measure the fit"
        )
        checks = ", ".join(
            f"{r.profile} {1000 * r.seconds(m) / r.steps:.2f} vs {r.mean_itl_ms:.2f}"
            for r in self.runs
        )
        lines.append(f"not fitted: predicted mean step time vs published mean ITL, ms: {checks}")
        return lines


def fit_exactly(runs: Sequence[PublishedRun], draft_per_target: float) -> StepTimeModel:
    """``a`` and ``b`` solving ``a*steps + b*(sum T + r*sum D) = duration`` for two runs,
    ``c = r*b`` with ``r = draft_per_target`` held: two runs give two equations, and where
    ``D/T`` is the same in both (one method, one K) they cannot tell ``b`` from ``c``."""
    if len(runs) != 2:
        raise ValueError(f"an exact fit needs two runs, got {len(runs)}")
    (s1, x1, y1), (s2, x2, y2) = (
        (r.steps, r.target_rows + draft_per_target * r.draft_rows, r.duration_s) for r in runs
    )
    det = s1 * x2 - s2 * x1
    if det == 0:
        raise ValueError("the two runs are collinear in (steps, rows): no exact fit")
    a = (y1 * x2 - y2 * x1) / det
    b = (s1 * y2 - s2 * y1) / det
    return StepTimeModel(a, b, draft_per_target * b)


# The published run of the dspark-bench workload (Qwen3-8B, tensor parallel 2,
# max_num_batched_tokens=128, max_num_seqs=16, DSpark K=7, 4096 requests of 64 prompt and
# 512 output tokens at concurrency 4096), as published for the DSpark budget proposal; the
# totals are this simulator's for `dspark-bench` at seed 0 under the same profile
# (tests/unit/test_calibration.py re-simulates them).
DSPARK_QWEN3_8B_RUNS = (
    PublishedRun("vllm-0.32", 716.16, 2928.34, 9.38, 3.23, 75301, 5457936, 4729991),
    PublishedRun("dual", 586.69, 3574.55, 13.53, 3.24, 42795, 5465328, 4741002),
)
DRAFT_PER_TARGET = 0.25
"""``c/b`` where a fit cannot tell them apart: the illustrative model's ratio."""

DEFAULT_CALIBRATION = "illustrative"
CALIBRATIONS: dict[str, Calibration] = {
    c.name: c
    for c in (
        Calibration(
            DEFAULT_CALIBRATION,
            StepTimeModel(),
            "the default: an illustration of the order of an 8B model on one modern GPU,"
            " fitted to no measurement",
        ),
        Calibration(
            "published-dspark-qwen3-8b",
            fit_exactly(DSPARK_QWEN3_8B_RUNS, DRAFT_PER_TARGET),
            "fitted to the published vllm bench serve run of Qwen3-8B, tensor parallel 2,"
            " B=128, max_num_seqs=16, DSpark K=7, 4096 x (64 prompt, 512 output) at"
            " concurrency 4096: 716.16 s under vLLM 0.32, 586.69 s under the proposal"
            " (simulated as dual), as published for the DSpark budget proposal; the run's own"
            " report is not in the repository",
            "dspark-bench",
            DSPARK_QWEN3_8B_RUNS,
            f"c = {DRAFT_PER_TARGET:g}*b held: D/T is 0.87 in both runs, so b and c are not"
            " separable",
        ),
    )
}


def calibration_named(name: str) -> Calibration:
    try:
        return CALIBRATIONS[name]
    except KeyError:
        raise BadInput(
            f"--calibration: unknown calibration {name!r} (known: {', '.join(CALIBRATIONS)})"
        ) from None


@dataclass
class RequestTimes:
    arrival: int
    first_scheduled: int = -1
    first_output: int = -1
    last_output: int = -1
    output_tokens: int = 0


@dataclass
class PrefixStats:
    """Prefix-cache hits of one run; all zero with ``enable_prefix_caching`` off.

    ``hit_tokens`` and ``prompt_tokens`` sum over the requests admitted (scheduled at
    least once): the tokens the first admission found in the cache and the prompt's
    length. A preempted request's hit on resuming is not in them; the scheduler counts it
    (``resume_rehit``), and its ``prefix_hit`` counts every admission with a hit, resumes
    included."""

    requests: int = 0
    requests_with_hit: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PREFIX_OBSERVED, 0))

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0 before any admission)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "hit_tokens": self.hit_tokens,
            "prompt_tokens": self.prompt_tokens,
            "hit_rate": self.hit_rate,
            "requests": self.requests,
            "requests_with_hit": self.requests_with_hit,
            "events": dict(self.events),
        }


class FirstAdmissions:
    """A consumer fed after the reference: right after each ``ScheduleStep`` it reads,
    for every request scheduled for the first time, its hit, exactly: vLLM's
    ``_update_after_schedule`` has just added the scheduled tokens to
    ``num_computed_tokens``, which admission started at the hit."""

    def __init__(self, reference: Reference) -> None:
        self.reference = reference
        self.hits: dict[str, int] = {}
        """Request id -> cached tokens at its first admission."""

    def handle(self, event: Event) -> StepRecord | None:
        if isinstance(event, ScheduleStep):
            state = self.reference.state
            hits, requests = self.hits, state.requests
            for rid, tokens in state.in_flight[state.num_steps - 1].scheduled.items():
                if rid not in hits:
                    hits[rid] = requests[rid].num_computed_tokens - tokens
        return None


@dataclass
class SimResult:
    """The per-step and per-request record of one profile's run."""

    profile: str
    budget: int
    """``B = max_num_batched_tokens``: the buffer rows."""
    requests_per_step: list[int] = field(default_factory=list)
    target_per_step: list[int] = field(default_factory=list)
    draft_per_step: list[int] = field(default_factory=list)
    requests: dict[str, RequestTimes] = field(default_factory=dict)
    violations: list[dict[str, Any]] = field(default_factory=list)
    """Recorded contract breaks: ``{"contract", "count", "first_step", "message"}``."""
    stall: str | None = None
    wall_seconds: float = 0.0
    prefix_caching: bool = False
    """The config's ``enable_prefix_caching``."""
    prefix: PrefixStats = field(default_factory=PrefixStats)

    @property
    def steps(self) -> int:
        return len(self.target_per_step)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests.values())

    @property
    def peak_rows(self) -> int:
        return max(
            (max(t, d) for t, d in zip(self.target_per_step, self.draft_per_step, strict=True)),
            default=0,
        )

    def ttft_steps(self) -> list[int]:
        """Steps from arrival to the first output token, per request that produced one:
        a request arriving before step ``s`` and sampling its first token in step ``s``
        has TTFT 1."""
        return [
            r.first_output - r.arrival + 1 for r in self.requests.values() if r.first_output >= 0
        ]

    def first_scheduled_steps(self) -> list[int]:
        """Steps from arrival to the first scheduled token (0: scheduled in its arrival
        step)."""
        return [
            r.first_scheduled - r.arrival for r in self.requests.values() if r.first_scheduled >= 0
        ]

    def steps_per_output_token(self) -> list[float]:
        """Per request with two or more outputs: steps between its first and last output
        token over the tokens after the first (the inter-token latency in steps)."""
        return [
            (r.last_output - r.first_output) / (r.output_tokens - 1)
            for r in self.requests.values()
            if r.output_tokens > 1
        ]

    def step_end_times(self, model: StepTimeModel) -> list[float]:
        """Seconds at the end of each step under ``model``."""
        clock, ends = 0.0, []
        for target, draft in zip(self.target_per_step, self.draft_per_step, strict=True):
            clock += model.step_seconds(target, draft)
            ends.append(clock)
        return ends

    def timing(self, model: StepTimeModel) -> dict[str, float]:
        """Predicted seconds: total, output tokens/s, TTFT (mean, p99) and inter-token
        latency (mean) per request."""
        ends = self.step_end_times(model)
        total = ends[-1] if ends else 0.0

        def start(step: int) -> float:
            return ends[step - 1] if step > 0 else 0.0

        ttft = [
            ends[r.first_output] - start(r.arrival)
            for r in self.requests.values()
            if r.first_output >= 0
        ]
        itl = [
            (ends[r.last_output] - ends[r.first_output]) / (r.output_tokens - 1)
            for r in self.requests.values()
            if r.output_tokens > 1
        ]
        return {
            "seconds": total,
            "output_tokens_per_s": self.output_tokens / total if total > 0 else 0.0,
            "ttft_s_mean": sum(ttft) / len(ttft) if ttft else 0.0,
            "ttft_s_p99": percentile(ttft, 99),
            "itl_s_mean": sum(itl) / len(itl) if itl else 0.0,
        }

    def summary(self) -> dict[str, Any]:
        """One profile's object of the ``--json`` document (diagnostics after its keys)."""
        ttft = self.ttft_steps()
        spot = self.steps_per_output_token()
        return {
            "profile": self.profile,
            "steps": self.steps,
            "requests_per_step": dist(self.requests_per_step),
            "target_tokens_per_step": dist(self.target_per_step),
            "draft_rows_per_step": dist(self.draft_per_step),
            "peak_rows": self.peak_rows,
            "ttft_steps": {"mean": _mean(ttft), "p99": percentile(ttft, 99)},
            "output_tokens": self.output_tokens,
            "budget_rows": self.budget,
            "first_scheduled_steps": {
                "mean": _mean(self.first_scheduled_steps()),
                "p99": percentile(self.first_scheduled_steps(), 99),
            },
            "steps_per_output_token": _mean(spot),
            "prefix_cache": self.prefix.to_json(),
            "violations": list(self.violations),
            "stall": self.stall,
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def simulate(
    scenario: Scenario,
    profile: str,
    *,
    max_steps: int | None = None,
    progress: ProgressFn | None = None,
    progress_every: float = 5.0,
) -> SimResult:
    """Run the reference over ``scenario`` under ``profile`` and record the statistics."""
    started = time.perf_counter()
    run = ScenarioRun(scenario, profile=profile, max_steps=max_steps, check="collect")
    scheduler = run.scheduler
    config = run.scenario.config
    result = SimResult(
        profile, config.max_num_batched_tokens, prefix_caching=config.enable_prefix_caching
    )
    times = result.requests
    for request in run.scenario.requests:
        times[request.id] = RequestTimes(request.arrival_step)
    req_per_step = result.requests_per_step
    target_per_step = result.target_per_step
    draft_per_step = result.draft_per_step
    total = len(times)
    finished = 0
    next_report = started + progress_every
    state = scheduler.state
    prefix_caching = config.enable_prefix_caching
    admissions = FirstAdmissions(scheduler)
    driven_steps = drive(run.driver, scheduler, admissions) if prefix_caching else run.steps()
    for driven in driven_steps:
        record = driven.record
        step = record.step
        scheduled = record.num_scheduled_tokens
        req_per_step.append(len(scheduled))
        target_per_step.append(record.target_tokens)
        draft_per_step.append(record.draft_rows)
        for rid, sampled in driven.output.num_sampled.items():
            if sampled:
                r = times[rid]
                if r.first_output < 0:
                    r.first_output = step
                r.last_output = step
        for rid in scheduled:
            r = times[rid]
            if r.first_scheduled < 0:
                r.first_scheduled = step
        finished += len(record.finished)
        if progress is not None and step % 1024 == 0:
            now = time.perf_counter()
            if now >= next_report:
                progress(profile, step + 1, finished, total)
                next_report = now + progress_every
    for rid, done in state.requests.items():
        times[rid].output_tokens = done.num_output_tokens
    if prefix_caching:
        result.prefix = prefix_stats(admissions.hits, run.scenario, scheduler.observed)
    result.violations = summarize_violations(scheduler.violations)
    if run.stall is not None:
        result.stall = run.stall.message()
    result.wall_seconds = time.perf_counter() - started
    return result


def prefix_stats(hits: dict[str, int], scenario: Scenario, observed: dict[str, int]) -> PrefixStats:
    """The run's ``PrefixStats`` from each admitted request's first hit and the
    scheduler's counters."""
    prompt_len = {r.id: r.prompt_len for r in scenario.requests}
    return PrefixStats(
        requests=len(hits),
        requests_with_hit=sum(1 for hit in hits.values() if hit > 0),
        prompt_tokens=sum(prompt_len[rid] for rid in hits),
        hit_tokens=sum(hits.values()),
        events={name: observed[name] for name in PREFIX_OBSERVED},
    )


def summarize_violations(found: Sequence[StepViolation]) -> list[dict[str, Any]]:
    """One entry per contract item broken: how often, the first step and its message."""
    by_contract: dict[str, dict[str, Any]] = {}
    for v in found:
        entry = by_contract.get(v.contract)
        if entry is None:
            by_contract[v.contract] = {
                "contract": v.contract,
                "count": 1,
                "first_step": v.step,
                "message": v.message,
            }
        else:
            entry["count"] += 1
    return [by_contract[c] for c in sorted(by_contract)]


def ratios(results: Sequence[SimResult], model: StepTimeModel) -> list[dict[str, float]]:
    """Per result, the ratios of its steps, output tokens/s, mean TTFT and mean ITL to the
    first result's (1.0 for the first; 0 where the first is 0)."""
    if not results:
        return []
    base_sum = results[0].summary()
    base_time = results[0].timing(model)

    def ratio(x: float, y: float) -> float:
        return x / y if y else 0.0

    out = []
    for r in results:
        s, t = r.summary(), r.timing(model)
        out.append(
            {
                "steps": ratio(s["steps"], base_sum["steps"]),
                "ttft_steps_mean": ratio(s["ttft_steps"]["mean"], base_sum["ttft_steps"]["mean"]),
                "output_tokens_per_s": ratio(
                    t["output_tokens_per_s"], base_time["output_tokens_per_s"]
                ),
                "ttft_s_mean": ratio(t["ttft_s_mean"], base_time["ttft_s_mean"]),
                "itl_s_mean": ratio(t["itl_s_mean"], base_time["itl_s_mean"]),
            }
        )
    return out


def to_json(
    workload: str, results: Sequence[SimResult], calibration: Calibration | None = None
) -> dict[str, Any]:
    """The ``--json`` document (docs/simulate.md), with the calibration in use, whether
    prefix caching was on and, per profile, the seconds and output tokens/s it predicts
    and the prefix cache's hits."""
    if calibration is None:
        calibration = CALIBRATIONS[DEFAULT_CALIBRATION]
    keys = (
        "profile",
        "steps",
        "requests_per_step",
        "target_tokens_per_step",
        "draft_rows_per_step",
        "peak_rows",
        "ttft_steps",
        "output_tokens",
    )
    profiles = []
    for r in results:
        s = r.summary()
        timing = r.timing(calibration.model)
        profiles.append(
            {
                **{k: s[k] for k in keys},
                "seconds": timing["seconds"],
                "tokens_per_s": timing["output_tokens_per_s"],
                "prefix_cache": s["prefix_cache"],
            }
        )
    model = calibration.model
    return {
        "workload": workload,
        "calibration": {
            "name": calibration.name,
            "a": model.a,
            "b": model.b,
            "c": model.c,
            "provenance": calibration.provenance,
        },
        "enable_prefix_caching": any(r.prefix_caching for r in results),
        "profiles": profiles,
    }


# -- a workload from a recorded trace -------------------------------------------------
def scenario_from_trace(trace: Trace, profile: str, seed: int = 0) -> Scenario:
    """A what-if workload from a recorded trace: its config, its requests arriving at the
    steps they arrived (aborts, prefix-cache resets and pauses likewise), and the
    acceptance it measured.

    Acceptance is kept as empirical per-position rates (position ``j`` accepted given
    ``j-1`` was), not as a per-step table: under another profile the same step schedules
    other requests, so only the rates carry over. The simulated drafter proposes ``K``
    every step; a decode step after the recorded drafter proposed nothing counts as a
    rejection at position 0, and padded placeholders (which no target accepts) as
    rejections, so the rates fold in how often real drafts were there. What does not
    carry over is the verify width: a step the trace ran at width 1 is simulated at
    ``1 + K``, so step counts of a what-if are model results, not replays.

    A prefix-cached trace (version 3 on) keeps what its prompts shared: each request gets
    prompt ids made from its recorded block hashes (``prompt_ids_from_hashes``), so two
    prompts share a block in the what-if exactly where vLLM found them sharing one. Its
    outputs are the simulation's own ids, so a later turn's blocks over an earlier reply
    are shared no more.
    """
    # A what-if on a setting the reference does not model would run without it, silently:
    # the recorded settings are read as the recording release's replay reads them.
    release = release_of(trace.header.vllm_version)
    check_settings(trace, profile_named(profile) if release is None else release_profile(release))
    arrivals, aborts, resets, pauses = _timeline(trace.entries)
    if not arrivals:
        raise TraceError(f"trace {trace.path!r}: holds no request to simulate")
    rates = _acceptance_rates(trace.entries)
    block_size = trace.header.config.block_size
    requests = tuple(
        RequestSpec(
            id=rid,
            prompt_len=event.prompt_len,
            max_tokens=event.max_tokens,
            arrival_step=step,
            priority=event.priority,
            abort_step=max(aborts[rid], step) if rid in aborts else None,
            prompt_token_ids=None
            if event.block_hashes is None
            else prompt_ids_from_hashes(rid, event.prompt_len, event.block_hashes, block_size),
        )
        for rid, (event, step) in arrivals.items()
    )
    acceptance = Acceptance(fixed=None, per_position=rates, seed=seed)
    return validate(
        Scenario(
            profile,
            trace.header.config,
            requests,
            acceptance,
            resets=resets or None,
            pauses=pauses or None,
        )
    )


Timeline = tuple[dict[str, tuple[AddRequest, int]], dict[str, int], dict[int, bool], dict[int, str]]
"""A trace's arrivals (each request's event and the steps before it), aborts, resets
and pauses, each by the number of steps recorded before it."""


def _timeline(entries: Sequence[Entry]) -> Timeline:
    """When each request arrived and was aborted, and the engine's calls, counted in the
    steps recorded before each."""
    arrivals: dict[str, tuple[AddRequest, int]] = {}
    aborts: dict[str, int] = {}
    resets: dict[int, bool] = {}
    pauses: dict[int, str] = {}
    steps = 0
    for entry in entries:
        if isinstance(entry, StepRecord):
            steps += 1
        elif isinstance(entry, AddRequest):
            arrivals[entry.request_id] = (entry, steps)
        elif isinstance(entry, Abort):
            aborts.setdefault(entry.request_id, steps)
        elif isinstance(entry, ResetPrefixCache):
            # A scenario holds one reset before a step: one that resets the running
            # requests does all a plain one does and more.
            resets[steps] = resets.get(steps, False) or entry.reset_running_requests
        elif isinstance(entry, SetPauseState):
            # The state the step is scheduled in is the last one set before it.
            pauses[steps] = entry.state
    return arrivals, aborts, resets, pauses


def _acceptance_rates(entries: Sequence[Entry]) -> tuple[float, ...]:
    """Per draft position ``j``, the share of the drafts reached there that were accepted
    (given ``j-1`` was), over every output of the trace."""
    reached: list[int] = []
    accepted: list[int] = []
    # The drafts each step verified, by step: under async an output answers an earlier step.
    spec_of: dict[int, dict[str, int]] = {}
    last = -1
    proposed_none: set[str] = set()
    for entry in entries:
        if isinstance(entry, StepRecord):
            last = entry.step
            spec_of[last] = entry.scheduled_spec_tokens
        elif isinstance(entry, DraftProposals):
            proposed_none = {rid for rid, n in entry.num_drafts.items() if n == 0}
        elif isinstance(entry, ModelOutput):
            spec = spec_of.get(last if entry.step is None else entry.step, {})
            for rid, sampled in entry.num_sampled.items():
                drafts = spec.get(rid, 0)
                if sampled <= 0 or (drafts <= 0 and rid not in proposed_none):
                    continue
                # A decode step after the drafter proposed nothing (n-gram without a
                # match) counts as a rejection at the first position: the simulation
                # proposes K every step, so the trace's silence must lower the rates.
                drafts = max(drafts, 1)
                taken = sampled - 1
                while len(reached) < drafts:
                    reached.append(0)
                    accepted.append(0)
                for position in range(min(taken + 1, drafts)):
                    reached[position] += 1
                    accepted[position] += position < taken
    return tuple(a / r if r else 0.0 for a, r in zip(accepted, reached, strict=True))


def prompt_ids_from_hashes(
    request_id: str, prompt_len: int, block_hashes: Sequence[str], block_size: int
) -> tuple[int, ...]:
    """Prompt ids that share a block with another prompt's exactly where their recorded
    hashes are equal: each hashed block the ids of its hash, the rest the request's own.
    Because a hash stands for its whole prefix, equal ids chain back to equal hashes."""
    ids = [i for h in block_hashes for i in segment(f"block:{h}", block_size)]
    return (*ids, *segment(f"tail:{request_id}", prompt_len - len(ids)))
