"""``dualbudget mutate``: plant budget bugs in the installed vLLM's scheduler, fuzz each.

Every site of every operator (``mutation.operators``) in vLLM's ``Scheduler.schedule``
is one mutant: one bug, compiled from vLLM's own source into a scheduler class
(``mutation.loading``, importable as ``mutation.classes:<name>``), fuzzed through the
live lockstep against the detected profile with a fixed seed until its first divergence
(``fuzz.first_divergence``). A mutant is ``killed`` (with the scenario file of its
divergence, which replays to it with the mutant as the live scheduler), ``equivalent``
(only with a written reason, ``mutation.equivalence``, z3-checked where arithmetic) or
``survived``; the unmutated control, compiled the same way, must agree. Exit 0 only when
none survived, 1 otherwise; an operator with no site, a refuted or contradicted
equivalence claim, or a control that diverges is an error (1).

The mutants are the units of the run (``campaign.executor``): each is fuzzed whole in
one warm worker (``--jobs`` local processes, or Ray actors with ``--executor ray``),
kept for the whole run; a mutant's result depends only on the mutant, the seed and the
examples, so any executor and width give the same report (timings aside).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from dualbudget.campaign.executor import DEFAULT_EXECUTOR, Executor
from dualbudget.campaign.store import Campaign, CampaignMismatch, map_resumed
from dualbudget.spec.errors import BadInput

from .mutation.equivalence import ClaimRefuted, check, claims_for
from .mutation.operators import OPERATORS, NoSite, Site

DEFAULT_EXAMPLES = 200
"""Examples per mutant: see docs/mutate.md for the measurement that sizes it."""
MUTANT_SECONDS = 300
"""A mutant that runs longer is taken to hang in vLLM's loop (an error, not a kill)."""
CONTROL = "control"


@dataclass
class MutantResult:
    name: str
    operator: str
    location: str
    status: str
    """``killed``, ``survived``, ``equivalent``; ``agrees`` for the control; ``error`` for
    a run that could not decide (a hang, a reference finding)."""
    reason: str | None = None
    scenario: str | None = None
    divergence: str | None = None
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _Hang(BaseException):
    """Raised by the alarm: a BaseException, so that no ``except Exception`` on the way
    (the lockstep's, Hypothesis') takes it for the scheduler's own error."""


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        # A signal handler is the main thread's alone; a worker running units on
        # another thread has no alarm, and a hang is then its executor's to report.
        yield
        return

    def fire(signum: int, frame: FrameType | None) -> None:
        raise _Hang

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Plan:
    """What every mutant of one run is fuzzed with."""

    profile: str
    examples: int
    seed: int
    out_dir: Path
    known_findings: frozenset[tuple[str, str, str]]


def run_mutant(name: str, site: Site | None, plan: Plan) -> MutantResult:
    """Fuzz mutant ``name`` (``site`` None: the control) until its first divergence, in
    this process."""
    from .fuzz import first_divergence
    from .mutation.classes import path_of

    operator, location = (site.operator, site.location) if site else (CONTROL, "-")
    start = time.monotonic()
    try:
        with _alarm(MUTANT_SECONDS):
            divergence, result = first_divergence(
                profile=plan.profile,
                scheduler_cls=path_of(name),
                seed=plan.seed,
                examples=plan.examples,
                out_dir=plan.out_dir / name.replace("/", "_"),
                known_findings=plan.known_findings,
            )
    except _Hang:
        reason = f"no result within {MUTANT_SECONDS}s (a loop that never ends?)"
        seconds = round(time.monotonic() - start, 1)
        return MutantResult(name, operator, location, "error", reason, seconds=seconds)
    out = MutantResult(
        name,
        operator,
        location,
        "survived",
        examples=result.examples,
        steps=result.steps,
        seconds=round(time.monotonic() - start, 1),
    )
    if site is None:
        out.status = "agrees"
    if divergence is not None:
        out.status, out.scenario = "killed", divergence.scenario_path
        out.divergence = f"{divergence.kind} at step {divergence.step}"
    elif result.unknown_findings:
        out.status = "error"
        out.reason = f"the reference broke the contract: {result.unknown_findings[0].to_json()}"
    return out


@dataclass(frozen=True)
class MutantUnit:
    """One unit of a mutate run: a mutant (``site`` None: the control) and its plan."""

    name: str
    site: Site | None
    plan: Plan


def run_mutant_unit(unit: MutantUnit) -> MutantResult:
    return run_mutant(unit.name, unit.site, unit.plan)


def run_mutants(
    sites: list[Site], plan: Plan, executor: Executor, campaign: Campaign | None = None
) -> tuple[MutantResult, list[MutantResult]]:
    """The control's result and every mutant's, in ``sites`` order, each mutant a unit
    of ``executor``; those kept in ``campaign`` are taken from it, the others kept there."""
    units = [MutantUnit(CONTROL, None, plan), *(MutantUnit(s.name, s, plan) for s in sites)]
    ids = [u.name for u in units]
    results = list(map_resumed(executor, campaign, run_mutant_unit, units, ids, progress="mutants"))
    return results[0], results[1:]


def decide(
    results: list[MutantResult], vllm_version: str, operators: tuple[str, ...] = OPERATORS
) -> list[str]:
    """Apply the equivalence claims to the survivors; the errors of the run."""
    claims = claims_for(vllm_version)
    errors = []
    for r in results:
        claim = claims.get(r.name)
        if claim is None:
            continue
        if r.status == "killed":
            errors.append(f"{r.name} is claimed equivalent but was killed ({r.scenario})")
        elif r.status == "survived":
            r.status, r.reason = "equivalent", claim.reason
    names = {r.name for r in results}
    errors += [
        f"equivalence claim for {n}: no such mutant in this vLLM's source"
        for n in claims
        if n not in names and n.split("/")[0] in operators
    ]
    return errors + [f"{r.name}: {r.reason}" for r in results if r.status == "error"]


@dataclass(frozen=True, kw_only=True)
class MutateOptions:
    """One ``dualbudget mutate`` run (``run_mutate_stage``); its defaults are the flags'."""

    known_findings: frozenset[tuple[str, str, str]]
    """(profile, layout, contract) breaks that are findings, not failures; no flag: the
    command line takes them from the proofs' manifest."""
    jobs: int | None = None
    """Worker processes (mutants at once) of ``executor`` local; actors with ``ray``.
    None: one per core (of the cluster, with ``ray``). Any number gives the same report."""
    executor: str = DEFAULT_EXECUTOR
    """Where the mutants run: ``local`` processes or ``ray`` actors (docs/campaigns.md)."""
    ray_address: str | None = None
    """The Ray cluster of ``--executor ray``; None: ``RAY_ADDRESS``'s, else a local Ray."""
    campaign: str | None = None
    """A directory that keeps every finished mutant (``campaign.store``): a rerun resumes."""
    operators: tuple[str, ...] = OPERATORS
    """The operators whose sites become mutants (``mutation.operators.OPERATORS``)."""
    examples: int = DEFAULT_EXAMPLES
    seed: int = 1
    profile: str | None = None
    """None: detected from the installed vLLM."""
    json_path: str | None = None
    out_dir: str = "mutants"
    """Where the killers' scenarios go."""
    vllm_src: str | None = None
    """A vLLM source tree whose Python runs over the installed vLLM (``vllm_source``)."""


def run_mutate_stage(options: MutateOptions) -> int:
    """Every mutant fuzzed, the table, the JSON report; the exit code."""
    from .commands import choose_profile, jobs_or_cores, vllm_or_exit, write_json
    from .live import quiet_vllm
    from .mutation.loading import installed_vllm_source, sites
    from .vllm_source import claims_release, use_vllm_source

    use_vllm_source(options.vllm_src)

    operators = options.operators
    unknown = sorted(set(operators) - set(OPERATORS))
    if unknown:  # bad input before any check of the installed vLLM
        known = ", ".join(OPERATORS)
        raise BadInput(f"--operators: unknown {', '.join(unknown)} (known: {known})")
    quiet_vllm()
    version = vllm_or_exit("mutate")
    if version is None:
        return 2
    profile, how = choose_profile(options.profile)
    source = installed_vllm_source()
    try:
        found = sites(source, operators)
    except NoSite as err:
        print(f"dualbudget mutate: error: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        raise BadInput(str(err)) from None
    claims = claims_for(claims_release(profile, version))
    try:
        check(claims.values())
    except ClaimRefuted as err:
        print(f"dualbudget mutate: error: an equivalence claim is false: {err}", file=sys.stderr)
        return 1
    if options.executor == "ray":
        jobs = options.jobs or 0  # 0: one actor per CPU of the cluster
    else:
        jobs = min(jobs_or_cores(options.jobs), len(found) + 1)
    plan = Plan(
        profile, options.examples, options.seed, Path(options.out_dir), options.known_findings
    )
    print(
        f"dualbudget mutate: vLLM {version} ({source.path}), profile {profile} ({how}):"
        f" {len(found)} mutants of {', '.join(operators)}; {plan.examples} examples each,"
        f" seed {plan.seed}, executor {options.executor}",
        flush=True,
    )
    start = time.monotonic()
    from .fuzz import fuzz_executor

    kept = _kept_campaign(options.campaign, profile, plan)
    with fuzz_executor(
        jobs, executor=options.executor, ray_address=options.ray_address
    ) as executor:
        control, results = run_mutants(found, plan, executor, kept)
    if kept is not None:
        kept.close()
    errors = decide(results, version, operators)
    if control.status != "agrees":
        errors.insert(0, f"the unmutated control did not pass: {control.status} {control.scenario}")
    seconds = time.monotonic() - start
    counts = _print_results(results, seconds)
    for error in errors:
        print(f"dualbudget mutate: error: {error}", file=sys.stderr)
    write_json(
        options.json_path,
        {
            "vllm_version": version,
            "profile": profile,
            "scheduler_file": source.path,
            "examples": plan.examples,
            "seed": plan.seed,
            "seconds": round(seconds, 1),
            "control": control.to_json(),
            "mutants": [r.to_json() for r in results],
        },
    )
    return 1 if errors or counts["survived"] else 0


def _kept_campaign(folder: str | None, profile: str, plan: Plan) -> Campaign | None:
    """The campaign ``--campaign`` keeps the mutants' results in, keyed by what decides
    them (vLLM's sources, the profile, the examples and seed, dualbudget's sources)."""
    if folder is None:
        return None
    from .fuzz import vllm_fingerprint
    from .sources import project_digest

    key = (
        f"mutate of {vllm_fingerprint()}, {profile}, {plan.examples} examples,"
        f" seed {plan.seed}, dualbudget {project_digest()[:12]}"
    )
    try:
        return Campaign(folder, key)
    except CampaignMismatch as err:
        raise BadInput(f"--campaign: {err}") from None


def _print_results(results: Sequence[MutantResult], seconds: float) -> dict[str, int]:
    """One line per mutant and the totals; the count of each status."""
    for r in results:
        tail = r.scenario or r.reason or ""
        print(f"  {r.status:<10} {r.name:<56} {r.location:<14} {r.seconds:>6.1f}s  {tail}")
    counts = {s: sum(r.status == s for r in results) for s in ("killed", "survived", "equivalent")}
    print(
        f"{len(results)} mutants: {counts['killed']} killed, {counts['survived']} survived,"
        f" {counts['equivalent']} equivalent, in {seconds:.0f}s"
    )
    return counts
