"""Where two policies decide differently: the reference run under each, step by step.

``compare(scenario, a, b)`` drives the reference scheduler through the same scenario
under two profiles and returns the first step whose decision differs (the tokens each
request was scheduled, the preemptions) and the totals of each run side by side: steps to
drain, target tokens and draft rows, output tokens, tokens per step, and the contract
items each broke (``collect`` mode: a profile that breaks the contract on the scenario is
reported, not aborted). The step counts are exact consequences of the policies; no step
time model is involved.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..events import StepRecord
from ..formats.scenario import Scenario
from .driver import ScenarioRun

DIFF_MAX_STEPS = 100_000
"""A run that has not drained after this many steps is cut there (``totals`` says so)."""


@dataclass
class Totals:
    """One profile's run of the scenario."""

    profile: str
    steps: int = 0
    target_tokens: int = 0
    draft_rows: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    drained: bool = False
    violations: dict[str, int] = field(default_factory=dict)
    """Contract item -> steps that broke it."""

    @property
    def tokens_per_step(self) -> float:
        return self.target_tokens / self.steps if self.steps else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "steps": self.steps,
            "target_tokens": self.target_tokens,
            "draft_rows": self.draft_rows,
            "output_tokens": self.output_tokens,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "preemptions": self.preemptions,
            "drained": self.drained,
            "violations": dict(self.violations),
        }


@dataclass
class Difference:
    """The first step whose decisions differ."""

    step: int
    decisions: dict[str, dict[str, Any]]
    """profile -> ``{"num_scheduled_tokens", "preempted", "target_tokens", "draft_rows"}``."""
    requests: list[str]
    """The requests scheduled differently (or preempted by one profile only)."""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "requests": list(self.requests), **self.decisions}


@dataclass
class Comparison:
    profiles: tuple[str, str]
    totals: tuple[Totals, Totals]
    first: Difference | None

    @property
    def differs(self) -> bool:
        return self.first is not None or _shape(self.totals[0]) != _shape(self.totals[1])

    def steps_gap(self) -> int:
        """Steps to drain under the second profile minus under the first."""
        return self.totals[1].steps - self.totals[0].steps

    def to_json(self) -> dict[str, Any]:
        return {
            "profiles": list(self.profiles),
            "differs": self.differs,
            "first_step": self.first.to_json() if self.first else None,
            "totals": {t.profile: t.to_json() for t in self.totals},
        }


def _shape(t: Totals) -> tuple[int, int, int, int]:
    return (t.steps, t.target_tokens, t.draft_rows, t.output_tokens)


def _decision(record: StepRecord) -> dict[str, Any]:
    return {
        "num_scheduled_tokens": dict(record.num_scheduled_tokens),
        "preempted": list(record.preempted),
        "target_tokens": record.target_tokens,
        "draft_rows": record.draft_rows,
    }


def _differing(a: StepRecord, b: StepRecord) -> list[str]:
    ids = sorted(set(a.num_scheduled_tokens) | set(b.num_scheduled_tokens))
    out = [rid for rid in ids if a.num_scheduled_tokens.get(rid) != b.num_scheduled_tokens.get(rid)]
    out += sorted(set(a.preempted) ^ set(b.preempted))
    return out


def _records(run: ScenarioRun, totals: Totals, max_steps: int) -> Iterator[StepRecord]:
    for record in run.records():
        totals.steps += 1
        totals.target_tokens += record.target_tokens
        totals.draft_rows += record.draft_rows
        totals.preemptions += len(record.preempted)
        yield record
        if totals.steps >= max_steps:
            return
    totals.drained = True


def compare(scenario: Scenario, a: str, b: str, *, max_steps: int = DIFF_MAX_STEPS) -> Comparison:
    """Both profiles through ``scenario`` (each validated for it: BadInput if one refuses
    the config), step by step."""
    runs = [ScenarioRun(scenario, profile=p, check="collect") for p in (a, b)]
    totals = (Totals(a), Totals(b))
    streams = [_records(run, t, max_steps) for run, t in zip(runs, totals, strict=True)]
    first: Difference | None = None
    while True:
        got = [next(stream, None) for stream in streams]
        if got[0] is None and got[1] is None:
            break
        ra, rb = got
        if first is None and ra is not None and rb is not None:
            requests = _differing(ra, rb)
            if requests:
                first = Difference(ra.step, {a: _decision(ra), b: _decision(rb)}, requests)
        elif first is None:
            # One run drained, the other goes on: they differ from here.
            done = next(r for r in got if r is not None)
            which = (a, b)[got.index(done)]
            first = Difference(
                done.step, {which: _decision(done)}, sorted(done.num_scheduled_tokens)
            )
    for run, t in zip(runs, totals, strict=True):
        t.output_tokens = sum(r.num_output_tokens for r in run.scheduler.state.requests.values())
        for v in run.scheduler.violations:
            t.violations[v.contract] = t.violations.get(v.contract, 0) + 1
    return Comparison((a, b), totals, first)
