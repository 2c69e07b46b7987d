"""Run the obligations (in parallel), compare with the manifest, report.

A job is one family of one (profile, layout): its queries are built and decided in a
worker process (z3 terms do not cross processes), together with the witnesses of its
failed obligations. Results come back as plain data.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dualbudget.spec.profiles import PROFILES

from .manifest import Manifest
from .model import Subject
from .mutants import MUTANTS, mutant_named
from .obligations import C6_QUEUE, Obligation, catalog, family_queries, subjects_of
from .reach import Reach, reach_of, reach_units
from .solve import PRODUCT_HINT_BOUND, QUERY_TIMEOUT_MS, decide
from .witness import WITNESS_MAX_K, WITNESS_MAX_REQUESTS, WITNESS_MAX_TOKENS, find_witness

BOUNDS = (
    "bounds: none on the proofs: every obligation holds for any number of requests (C6 by"
    " induction over the queue), any K, any budget;"
    f" z3 timeout {QUERY_TIMEOUT_MS / 1000:g} s per query (timeout = unknown = failure);"
    f" product lemmas for j <= {PRODUCT_HINT_BOUND} (sound, re-checked when sat);"
    f" witness search: <= {WITNESS_MAX_REQUESTS} requests (C6: {C6_QUEUE}),"
    f" B, S, prompts <= {WITNESS_MAX_TOKENS}, K <= {WITNESS_MAX_K}"
)


@dataclass
class Outcome:
    profile: str
    layout: str
    contract: str
    check: str
    name: str
    verdict: str
    expected: str
    nonvacuous: bool
    seconds: float
    inductive: bool = True
    """The obligation's ``inductive``: proven for any number of requests."""
    witness: str | None = None
    reasons: list[str] = field(default_factory=list)
    counterexample: dict[str, str] | None = None
    table: str | None = None
    scenario: dict[str, Any] | None = None

    @property
    def matches(self) -> bool:
        return self.verdict == self.expected


def base_subjects() -> dict[str, Subject]:
    return {name: Subject(name, profile.policy) for name, profile in PROFILES.items()}


def subjects_for(mutant: str | None) -> dict[str, Subject]:
    subjects = base_subjects()
    if mutant is not None:
        m = mutant_named(mutant)
        subjects[m.profile] = m.build()
    return subjects


Job = tuple[str, str, str, str | None, tuple[Obligation, ...], bool]
"""(family, profile, layout, mutant, the family's obligations to decide, want witnesses)"""


def _run_job(job: Job) -> list[dict[str, Any]]:
    family, profile, layout, mutant, obligations, witnesses = job
    subjects = subjects_for(mutant)
    results = decide(family_queries(family, subjects, profile, layout))
    out = []
    for ob in obligations:
        r = results[ob.check]
        row: dict[str, Any] = {
            "check": ob.check,
            "verdict": r.verdict,
            "nonvacuous": r.nonvacuous,
            "seconds": r.seconds,
            "reasons": r.reasons,
            "counterexample": r.counterexample,
            "table": None,
            "scenario": None,
        }
        if witnesses and r.verdict == "fails":
            t0 = time.perf_counter()
            w = find_witness(ob, subjects)
            if w is not None:
                row["table"] = w.table()
                row["scenario"] = w.scenario()
            row["seconds"] += time.perf_counter() - t0
        out.append(row)
    return out


def select(
    profiles: Sequence[str] | None = None,
    layouts: Sequence[str] | None = None,
    contracts: Sequence[str] | None = None,
    touching: str | None = None,
) -> list[Obligation]:
    """The catalog filtered; ``touching``: only obligations that run that profile's code."""
    chosen = []
    for ob in catalog():
        if profiles and ob.profile not in profiles:
            continue
        if layouts and ob.layout not in layouts:
            continue
        if contracts and ob.contract not in contracts:
            continue
        if touching is not None and touching not in subjects_of(ob):
            continue
        chosen.append(ob)
    return chosen


def _jobs(obligations: Iterable[Obligation], mutant: str | None, witnesses: bool) -> list[Job]:
    grouped: dict[tuple[str, str, str], list[Obligation]] = {}
    for ob in obligations:
        grouped.setdefault((ob.family, ob.profile, ob.layout), []).append(ob)
    # Slowest families first, so the pool's tail is short.
    order = {"C6": 0, "inductive": 1, "C3": 2, "C5": 3, "C4": 4, "reach": 5}
    keys = sorted(grouped, key=lambda key: order.get(key[0], 9))
    return [(f, p, lay, mutant, tuple(grouped[(f, p, lay)]), witnesses) for f, p, lay in keys]


def workers() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 4))


def run(
    obligations: Sequence[Obligation],
    manifest: Manifest,
    mutant: str | None = None,
    witnesses: bool = True,
    processes: int | None = None,
) -> list[Outcome]:
    jobs = _jobs(obligations, mutant, witnesses)
    n = processes or workers()
    if n > 1 and len(jobs) > 1:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(n) as pool:
            rows = pool.map(_run_job, jobs, chunksize=1)
    else:
        rows = [_run_job(job) for job in jobs]
    by_name: dict[str, dict[str, Any]] = {}
    for job, job_rows in zip(jobs, rows, strict=True):
        _, profile, layout, *_ = job
        for row in job_rows:
            by_name[f"{profile}/{layout}/{row['check']}"] = row
    outcomes = []
    for ob in obligations:
        row = by_name[ob.name]
        outcomes.append(
            Outcome(
                ob.profile,
                ob.layout,
                ob.contract,
                ob.check,
                ob.name,
                row["verdict"],
                manifest.expected(ob.name),
                row["nonvacuous"],
                row["seconds"],
                ob.inductive,
                reasons=row["reasons"],
                counterexample=row["counterexample"],
                table=row["table"],
                scenario=row["scenario"],
            )
        )
    return outcomes


def _reach_job(ob: Obligation) -> Reach:
    return reach_of(ob, base_subjects())


def run_reach(
    obligations: Sequence[Obligation], manifest: Manifest, processes: int | None = None
) -> list[Reach]:
    """The reach (proofs/reach.py) of each expected failure among ``obligations``, in
    their order."""
    failing = reach_units(obligations, manifest.expected)
    n = processes or workers()
    if n > 1 and len(failing) > 1:
        with multiprocessing.get_context("fork").Pool(n) as pool:
            return pool.map(_reach_job, failing, chunksize=1)
    return [_reach_job(ob) for ob in failing]


@dataclass
class MutantOutcome:
    name: str
    profile: str
    description: str
    killed_by: list[str]
    unknown: list[str]
    seconds: float


def run_mutants(
    manifest: Manifest, names: Sequence[str] | None = None, processes: int | None = None
) -> list[MutantOutcome]:
    out = []
    for mutant in MUTANTS:
        if names and mutant.name not in names:
            continue
        t0 = time.perf_counter()
        obligations = select(touching=mutant.profile)
        outcomes = run(obligations, manifest, mutant.name, witnesses=False, processes=processes)
        killed = [o.name for o in outcomes if o.verdict != "unknown" and not o.matches]
        unknown = [o.name for o in outcomes if o.verdict == "unknown"]
        out.append(
            MutantOutcome(
                mutant.name,
                mutant.profile,
                mutant.description,
                killed,
                unknown,
                time.perf_counter() - t0,
            )
        )
    return out


def outcome_json(o: Outcome) -> dict[str, Any]:
    return {
        "profile": o.profile,
        "layout": o.layout,
        "contract": o.contract,
        "check": o.check,
        "name": o.name,
        "verdict": o.verdict,
        "expected": o.expected,
        "nonvacuous": o.nonvacuous,
        "inductive": o.inductive,
        "seconds": round(o.seconds, 4),
        "witness": o.witness,
    }


def summary(outcomes: Sequence[Outcome], wall: float) -> dict[str, Any]:
    return {
        "obligations": len(outcomes),
        "holds": sum(o.verdict == "holds" for o in outcomes),
        "fails": sum(o.verdict == "fails" for o in outcomes),
        "unknown": sum(o.verdict == "unknown" for o in outcomes),
        "vacuous": sum(not o.nonvacuous for o in outcomes),
        "bounded": sum(not o.inductive for o in outcomes),
        "matching_manifest": sum(o.matches for o in outcomes),
        "mismatches": [o.name for o in outcomes if not o.matches],
        "expected_failures": sum(o.expected == "fails" for o in outcomes),
        "witnesses": sum(o.witness is not None for o in outcomes),
        "wall_seconds": round(wall, 3),
        "bounds": BOUNDS,
        "ok": all(o.matches for o in outcomes),
    }


def mutant_json(m: MutantOutcome) -> dict[str, Any]:
    data = asdict(m)
    data["seconds"] = round(m.seconds, 3)
    return data


def write_witnesses(outcomes: Sequence[Outcome], directory: Path) -> None:
    import json

    for o in outcomes:
        if o.scenario is not None:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / (o.name.replace("/", "__") + ".json")
            path.write_text(json.dumps(o.scenario, indent=2) + "\n")
            o.witness = str(path)
