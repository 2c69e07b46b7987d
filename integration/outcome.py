"""What a fuzz run counted and found: a unit's (``UnitRun``) and a whole run's
(``FuzzResult``), with the findings and the reasons a run stops.

A fuzz stops at a divergence, or at a C1-C3 break of the reference that is not a known
finding; everything else is counted (examples, steps, refused configs, mirrored crashes,
coverage events per method) so that a run says what it reached. The contract monitor's
violations (``integration.monitor``) are kept apart from both: counted per contract item,
the first of each (profile, layout, item, cause) of a unit written as a scenario, and
labelled with the known finding whose cause the run's config meets (``known_as``); they
fail the verdict, never stop the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dualbudget.proofs.manifest import causes
from dualbudget.spec.config import EngineConfig
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.profiles import profile_named

from .coverage import EVENT_NAMES, required_events
from .lockstep import Divergence

if TYPE_CHECKING:
    from .lockstep import Lockstep, MirroredCrash

LIVE_ALONE_CRASH = "vllm-alone"
"""The kind of a crash of vLLM with no reference beside it (``--monitor-only``): nothing
names the assertion the reference would have mirrored."""
UNIT_RESULTS_FORMAT = 3
"""The form of a unit's pickled result, part of a campaign's key: a campaign kept in
another form is refused rather than merged (2: mirrored crashes counted by kind; 3: the
first refused config's reason, which a method's verdict names)."""

FindingKey = tuple[str, str, str]
"""(profile, layout, contract id) of a contract break."""


class Broken(Protocol):
    """A break of a contract item at a step: the reference's ``StepViolation`` or the
    monitor's ``MonitorViolation``."""

    @property
    def contract(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def message(self) -> str: ...


def known_as(key: FindingKey, config: EngineConfig, known: frozenset[FindingKey]) -> str | None:
    """The manifest's name of the known finding a break of ``key`` under ``config`` is:
    of those on ``key`` (``proofs.manifest.causes``), the first whose condition
    ``config`` meets; None when ``key`` is not ``known`` or ``config`` meets none of
    theirs. A key ``known`` names without a manifest row (a caller's own list) is known
    as itself."""
    if key not in known:
        return None
    on_key = [cause for cause in causes() if cause.key == key]
    if not on_key:
        return "/".join(key)
    return next((cause.name for cause in on_key if cause.explains(key, config)), None)


@dataclass
class Finding:
    """A contract break of a live run (the reference's C1-C3, or the monitor's), with
    its scenario; ``cause``: the manifest's name of the known finding it is (``known_as``;
    the run then goes on), None when it is new."""

    profile: str
    layout: str
    contract: str
    step: int
    message: str
    scenario_path: str
    cause: str | None

    @property
    def key(self) -> FindingKey:
        return (self.profile, self.layout, self.contract)

    @property
    def known(self) -> bool:
        return self.cause is not None

    @property
    def labelled(self) -> tuple[str, str, str, str | None]:
        """Its key and cause: one finding of a run per label."""
        return (*self.key, self.cause)

    @property
    def manifest_key(self) -> str | None:
        """The manifest's name of the finding this is, when known: an obligation's
        ``profile/layout/Cn``, or ``outside_model.<cause>``."""
        return self.cause

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "known": self.known, "finding": self.manifest_key}


def monitor_line(finding: Finding) -> str:
    """One line for a monitor violation: a known finding's manifest name, or MONITOR."""
    tag = f"monitor, known finding {finding.manifest_key}" if finding.known else "MONITOR"
    return (
        f"{tag}: {finding.contract} under {finding.profile} with {finding.layout} at step"
        f" {finding.step}: {finding.message} (scenario {finding.scenario_path})"
    )


def never_cancelled() -> bool:
    return False


class TimeUp(Exception):
    """Raised by a unit's first rule once its time is spent: ends that Hypothesis run."""


@dataclass(kw_only=True)
class Outcome:
    """What a fuzz counted and what stops it, for a unit (``UnitRun``) and a whole run
    (``FuzzResult``) alike: it stops at a divergence, or at a C1-C3 break that is not a
    known finding."""

    examples: int = 0
    steps: int = 0
    refused_configs: int = 0
    first_refusal: str | None = None
    """Why the first refused config was refused (both sides' reasons, or vLLM's alone)."""
    mirrored_crashes: dict[str, int] = field(default_factory=dict)
    """Examples ended by a crash, per vLLM assertion the reference mirrors
    (``reference.violations.VLLM_CRASHES``; ``LIVE_ALONE_CRASH`` with no reference)."""
    crash_scenarios: dict[str, str] = field(default_factory=dict)
    """The scenario file of the first example of each kind of ``mirrored_crashes``."""
    divergences: list[Divergence] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    monitor_findings: list[Finding] = field(default_factory=list)
    """The monitor's violations, the first of each (profile, layout, item, cause), each
    with its scenario file."""
    monitor_counts: dict[str, int] = field(default_factory=dict)
    """Per contract item, every violation the monitor saw (known ones included)."""
    books_judged: dict[str, int] = field(default_factory=dict)
    """Per book item (C7-C13), the request-steps (C13: block-steps) the monitor judged it on."""
    stopped_by_time: bool = False
    seconds: float = 0.0
    """Wall time: of a unit's Hypothesis run; of a whole fuzz, after its warm-up."""

    @property
    def unknown_findings(self) -> list[Finding]:
        return [f for f in self.findings if not f.known]

    @property
    def unknown_monitor_findings(self) -> list[Finding]:
        return [f for f in self.monitor_findings if not f.known]

    def count_monitor(self, counts: dict[str, int], judged: dict[str, int]) -> None:
        for contract, n in counts.items():
            self.monitor_counts[contract] = self.monitor_counts.get(contract, 0) + n
        for contract, n in judged.items():
            self.books_judged[contract] = self.books_judged.get(contract, 0) + n

    @property
    def stopped(self) -> bool:
        """A divergence or an unknown finding: the fuzz stops here."""
        return bool(self.divergences or self.unknown_findings)


@dataclass
class UnitRun(Outcome):
    """What one (layout, aim) unit ran and found: the state its machines share."""

    profile: str
    layout: str
    aim: str
    seed: int
    out_dir: Path
    known_findings: frozenset[FindingKey]
    deadline: float | None = None
    cancelled: Callable[[], bool] = never_cancelled
    """True once the unit's result can no longer be used (an earlier unit stopped)."""
    started: int = 0
    """Examples the unit started (refused configs too): numbers the scenario files."""
    coverage: dict[str, int] | None = None
    """Events counted, once a step ran."""
    constructions: set[str] = field(default_factory=set)
    top_up_round: int = 0
    """0: a planned unit; r >= 1: a rerun in the run's top-up round r (``fuzz.run_fuzz``)."""
    monitor_only: bool = False
    """The live scheduler alone, judged by the contract monitor only (``monitor_run``)."""

    @property
    def round_tag(self) -> str:
        """``-top-up<r>`` for a rerun in top-up round r, else nothing."""
        return f"-top-up{self.top_up_round}" if self.top_up_round else ""

    @property
    def unit_name(self) -> str:
        """``layout/aim`` (its round's tag after a top-up rerun's)."""
        return f"{self.layout}/{self.aim}{self.round_tag}"

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def refuse(self, reason: str) -> None:
        """A config refused (void example): counted, the first reason kept."""
        self.refused_configs += 1
        if self.first_refusal is None:
            self.first_refusal = reason

    def count_step(self, before: dict[str, int], after: dict[str, int]) -> None:
        self.steps += 1
        if self.coverage is None:
            self.coverage = dict.fromkeys(EVENT_NAMES, 0)
        # The events of the coverage table only: the reference counts more than the
        # table gates on (``Scheduler.observed``).
        for event in EVENT_NAMES:
            self.coverage[event] += after.get(event, 0) - before.get(event, 0)

    def take_findings(self, lock: Lockstep) -> list[Finding]:
        """The C1-C3 breaks ``lock`` recorded since the last call, one per (profile,
        layout, contract, cause) in this unit, each with the scenario that reproduces it."""
        new = self._take(lock, lock.violations, monitor=False)
        lock.violations.clear()
        lock.reference.violations.clear()
        self.findings += new
        return new

    def take_crash(self, lock: Lockstep, crash: MirroredCrash) -> None:
        """An example ended by ``crash``: counted by kind, the first of each kind in this
        unit written as a scenario (``fuzz --replay`` reproduces it)."""
        name = crash.crash or LIVE_ALONE_CRASH
        self.mirrored_crashes[name] = self.mirrored_crashes.get(name, 0) + 1
        if name not in self.crash_scenarios:
            path = lock.write_scenario(crash.step, f"crash-{name}")
            self.crash_scenarios[name] = str(path)

    def take_monitor(self, lock: Lockstep) -> list[Finding]:
        """The monitor's violations in ``lock`` since the last call: all counted, the
        first of each (profile, layout, contract, cause) in this unit kept with its
        scenario."""
        counts: dict[str, int] = {}
        for violation in lock.monitor.violations:
            counts[violation.contract] = counts.get(violation.contract, 0) + 1
        new = self._take(lock, lock.monitor.violations, monitor=True)
        lock.monitor.violations.clear()
        judged = lock.monitor.books_judged
        self.count_monitor(counts, judged)
        lock.monitor.books_judged = dict.fromkeys(judged, 0)
        self.monitor_findings += new
        return new

    def _take(
        self, lock: Lockstep, violations: Sequence[Broken], *, monitor: bool
    ) -> list[Finding]:
        """``violations`` (the monitor's or the reference's) as findings labelled by
        cause, those not yet kept in this unit, each written as a scenario."""
        kept = self.monitor_findings if monitor else self.findings
        seen = {f.labelled for f in kept}
        new: list[Finding] = []
        for violation in violations:
            key = (self.profile, lock.layout, violation.contract)
            cause = known_as(key, lock.config, self.known_findings)
            if (*key, cause) in seen:
                continue
            seen.add((*key, cause))
            kind = f"monitor-{violation.contract}" if monitor else "divergence"
            path = lock.write_scenario(violation.step, kind)
            new.append(
                Finding(
                    *key,
                    step=violation.step,
                    message=violation.message,
                    scenario_path=str(path),
                    cause=cause,
                )
            )
        return new


@dataclass
class FuzzResult(Outcome):
    """A whole fuzz run: its units merged in unit order (``merge``), its coverage per
    method, and the required events still at zero (``zero_events``)."""

    profile: str
    vllm_version: str
    coverage: dict[str, dict[str, int]] = field(default_factory=dict)
    constructions: dict[str, set[str]] = field(default_factory=dict)
    examples_by_layout: dict[str, int] = field(default_factory=dict)
    steps_by_layout: dict[str, int] = field(default_factory=dict)
    """Live steps checked per method: what a verdict rests on."""
    refusals_by_layout: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Per method, the configs refused and the first reason."""
    examples_by_unit: dict[str, int] = field(default_factory=dict)
    warm_up_seconds: float = 0.0
    """vLLM's one-off costs, before ``seconds`` starts."""
    monitor_only: bool = False
    """The live scheduler ran alone, judged by the contract monitor only."""

    def monitor_json(self) -> dict[str, Any]:
        """The monitor's section of the fuzz's JSON: per contract item its count, and
        each violation kept (``manifest finding``: the manifest's name when known), and
        the request-steps each book item was judged on."""
        from .monitor import BOOKS_MONITORED, MONITORED

        return {
            "alone": self.monitor_only,
            "checked": list(MONITORED),
            "counts": {c: self.monitor_counts.get(c, 0) for c in MONITORED},
            "books_judged": {c: self.books_judged.get(c, 0) for c in BOOKS_MONITORED},
            "new": len(self.unknown_monitor_findings),
            "violations": [f.to_json() for f in self.monitor_findings],
        }

    def monitor_summary(self) -> str:
        """The monitor's lines of the verdict: its counts, then each violation kept."""
        from .monitor import BOOKS_MONITORED, MONITORED

        counts = ", ".join(f"{c} {self.monitor_counts.get(c, 0)}" for c in MONITORED)
        judged = ", ".join(f"{c} {self.books_judged.get(c, 0)}" for c in BOOKS_MONITORED)
        lines = [
            f"contract monitor (every live step, without the reference): {counts}",
            f"  the books judged on (request-steps): {judged}",
        ]
        lines += [monitor_line(f) for f in self.monitor_findings]
        return "\n".join(lines)

    def totals(self) -> dict[str, int]:
        return {
            event: sum(per.get(event, 0) for per in self.coverage.values()) for event in EVENT_NAMES
        }

    def required(self, layout: str) -> tuple[str, ...]:
        """The gate's events for ``layout`` under this run's profile (those vLLM's own
        state shows, when the live scheduler ran alone)."""
        return required_events(layout, profile_named(self.profile).release, self.monitor_only)

    def zero_events(self, layouts: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """The (layout, event) pairs the gate requires that are still at zero."""
        return [
            (layout, event)
            for layout in layouts or LAYOUT_NAMES
            for event in self.required(layout)
            if self.coverage.get(layout, {}).get(event, 0) == 0
        ]

    def zero_coverage(self, layouts: Sequence[str] | None = None) -> list[str]:
        return [f"{layout}:{event}" for layout, event in self.zero_events(layouts)]

    def merge(self, run: UnitRun) -> list[Finding]:
        """Add one unit's counts; returns its findings not already found by an earlier
        unit (one finding per (profile, layout, contract, cause) in the whole run)."""
        self.examples += run.examples
        self.steps += run.steps
        self.refused_configs += run.refused_configs
        if self.first_refusal is None:
            self.first_refusal = run.first_refusal
        layout = run.layout
        self.steps_by_layout[layout] = self.steps_by_layout.get(layout, 0) + run.steps
        if run.refused_configs:
            count, reason = self.refusals_by_layout.get(layout, (0, run.first_refusal or ""))
            self.refusals_by_layout[layout] = (count + run.refused_configs, reason)
        for crash, count in run.mirrored_crashes.items():
            self.mirrored_crashes[crash] = self.mirrored_crashes.get(crash, 0) + count
            self.crash_scenarios.setdefault(crash, run.crash_scenarios[crash])
        self.divergences += run.divergences
        self.stopped_by_time |= run.stopped_by_time
        if run.examples:
            layout = run.layout
            self.examples_by_layout[layout] = self.examples_by_layout.get(layout, 0) + run.examples
            # Summed: a campaign merges one (layout, aim) of many seeds.
            by_unit = self.examples_by_unit
            by_unit[run.unit_name] = by_unit.get(run.unit_name, 0) + run.examples
            self.constructions.setdefault(layout, set()).update(run.constructions)
        if run.coverage is not None:
            per = self.coverage.setdefault(run.layout, dict.fromkeys(EVENT_NAMES, 0))
            for event, count in run.coverage.items():
                per[event] += count
        seen = {f.labelled for f in self.findings}
        new = [f for f in run.findings if f.labelled not in seen]
        self.findings += new
        self.count_monitor(run.monitor_counts, run.books_judged)
        seen = {f.labelled for f in self.monitor_findings}
        self.monitor_findings += [f for f in run.monitor_findings if f.labelled not in seen]
        return new
