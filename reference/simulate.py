"""What-if simulation: what a budget policy costs or gains on a workload, in steps.

``simulate(scenario, profile)`` drives the reference scheduler (in ``record`` mode, so a
profile that breaks the contract on the workload is reported, not aborted) through the
scenario and keeps, per step, the requests scheduled, the target tokens ``T``, the draft
input rows ``D``; and per request, the step it arrived, was first scheduled, first produced
an output token and last produced one. Everything here is an exact consequence of the
policy's decisions: the step counts and their ratios between profiles do not depend on any
hardware.

Seconds come only from ``StepTimeModel``: ``t(step) = a + b*T + c*D``. Its defaults are
illustrative, of the order of an 8B model on one modern GPU; absolute seconds are only as
good as the coefficients, ratios of step counts are exact. How to fit the coefficients
from real runs: ``StepTimeModel`` and docs/simulate.md.

Percentiles are nearest-rank: ``p`` of ``n`` sorted values is the value at
``ceil(p/100 * n) - 1`` (so p50 of ``[1, 2, 3, 4]`` is 2, p99 of 100 values the 99th).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .contract import RecordedViolation
from .driver import ScenarioRun
from .events import ModelOutput
from .scenario import Scenario

ProgressFn = Callable[[str, int, int, int], None]
"""``(profile, steps so far, requests finished, requests in all)``."""


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


@dataclass
class RequestTimes:
    arrival: int
    first_scheduled: int = -1
    first_output: int = -1
    last_output: int = -1
    output_tokens: int = 0


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
        """The issue's per-profile JSON object (plus diagnostics after its keys)."""
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
    run = ScenarioRun(scenario, profile=profile, max_steps=max_steps, check="record")
    scheduler, driver = run.scheduler, run.driver
    result = SimResult(profile, run.scenario.config.max_num_batched_tokens)
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
    # ScenarioRun.records, unrolled, to see each step's ModelOutput as well.
    while not driver.done(state):
        record = None
        for event in driver.before_step():
            record = scheduler.handle(event)
        assert record is not None
        step = record.step
        scheduled = record.num_scheduled_tokens
        req_per_step.append(len(scheduled))
        target_per_step.append(record.target_tokens)
        draft_per_step.append(record.draft_rows)
        for event in driver.after_step(record, state):
            if isinstance(event, ModelOutput):
                for rid, sampled in event.num_sampled.items():
                    if sampled:
                        r = times[rid]
                        if r.first_output < 0:
                            r.first_output = step
                        r.last_output = step
            scheduler.handle(event)
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
    result.violations = summarize_violations(scheduler.violations)
    if run.stall is not None:
        result.stall = run.stall.message()
    result.wall_seconds = time.perf_counter() - started
    return result


def summarize_violations(found: Sequence[RecordedViolation]) -> list[dict[str, Any]]:
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


def to_json(workload: str, results: Sequence[SimResult]) -> dict[str, Any]:
    """The ``--json`` document: exactly the issue's schema."""
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
        profiles.append({k: s[k] for k in keys})
    return {"workload": workload, "profiles": profiles}
