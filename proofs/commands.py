"""``dualbudget prove``: every obligation against the manifest; exit 0 only on a match.

The command line reads ``ProveOptions`` for its defaults when it builds its parser, for
every command; so this module imports the proofs (the manifest, the obligations, the
runner, the reach: z3) only inside its functions, and ``dualbudget schedule`` never loads
z3.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from xml.etree import ElementTree

from dualbudget.spec.errors import BadInput

if TYPE_CHECKING:
    from .obligations import Obligation
    from .reach import Reach
    from .runner import MutantOutcome, Outcome

MapUnits = Callable[[Callable[["Obligation"], "Reach"], Sequence["Obligation"]], Iterable["Reach"]]
"""An executor's ``map``: each unit's result in unit order (``campaign.executor``); the
command layer passes it in, since proofs/ imports only spec/."""

DEFAULT_WITNESS_DIR = Path("out") / "witnesses"


@dataclass(frozen=True, kw_only=True)
class ProveOptions:
    """One ``dualbudget prove`` run; the command line fills it from its flags, and
    ``dualbudget check`` runs it with every default."""

    profiles: tuple[str, ...] = ()
    """Only these profiles' obligations; empty: every profile."""
    layouts: tuple[str, ...] = ()
    """Only these layouts' obligations; empty: every layout."""
    contracts: tuple[str, ...] = ()
    """Only these contract items' obligations; empty: every item."""
    mutants: bool = False
    """Also run the mutant suite (``proofs/mutants.py``): each must be killed."""
    reach: bool = False
    """Also the reach of each finding (``proofs/reach.py``)."""
    json_path: str | None = None
    junit_path: str | None = None
    witness_dir: Path = DEFAULT_WITNESS_DIR
    """Where the witness scenarios go (the reach's under ``reach/``)."""
    executor: str = "local"
    """Where the reach queries run (``dualbudget/prove_cli.py``): ``local`` processes or
    ``ray``."""
    jobs: int | None = None
    """The executor's width; None: the proofs' own pool width (``runner.workers``)."""
    ray_address: str | None = None
    """The Ray cluster of ``--executor ray``; None: a local Ray started for the run."""


def reach_unit(ob: Obligation) -> Reach:
    """One unit of ``prove --reach``: the reach of one expected failure (module level, so
    that an executor's workers import it)."""
    from .reach import reach_of
    from .runner import base_subjects

    return reach_of(ob, base_subjects())


def prove(options: ProveOptions, map_units: MapUnits | None = None) -> int:
    """The command; ``map_units`` runs the reach's units (``reach.reach_units``), None:
    the proofs' own local pool (``runner.run_reach``)."""
    from .manifest import load_manifest
    from .obligations import catalog
    from .reach import reach_units
    from .runner import (
        BOUNDS,
        mutant_json,
        outcome_json,
        run,
        run_mutants,
        run_reach,
        select,
        summary,
        write_witnesses,
    )

    started = time.perf_counter()
    out = sys.stdout
    manifest = load_manifest()
    problems = manifest.problems(ob.name for ob in catalog())
    if problems:
        raise BadInput("proofs/manifest.toml: " + "; ".join(problems[:5]))
    obligations = select(options.profiles, options.layouts, options.contracts)
    if not obligations:
        raise BadInput("no obligation matches --profile/--layout/--only")
    print(BOUNDS, file=out)
    outcomes = run(obligations, manifest)
    write_witnesses(outcomes, options.witness_dir)
    print_table(outcomes, out)
    print_findings(outcomes, out)
    reaches: list[Reach] | None = None
    reach_wall = 0.0
    if options.reach:
        t0 = time.perf_counter()
        if map_units is None:
            reaches = run_reach(obligations, manifest)
        else:
            reaches = list(map_units(reach_unit, reach_units(obligations, manifest.expected)))
        write_reach_scenarios(reaches, options.witness_dir / "reach")
        reach_wall = time.perf_counter() - t0
        print_reach(reaches, outcomes, out, reach_wall)
    wall = time.perf_counter() - started
    report = summary(outcomes, wall)
    if reaches is not None:
        report["reach_wall_seconds"] = round(reach_wall, 3)
        report["reach_seconds"] = round(sum(r.seconds for r in reaches), 3)
    mutants: list[MutantOutcome] | None = None
    if options.mutants:
        t0 = time.perf_counter()
        mutants = run_mutants(manifest)
        print_mutants(mutants, out)
        wall = time.perf_counter() - started
        report["mutants_wall_seconds"] = round(time.perf_counter() - t0, 3)
        report["wall_seconds"] = round(wall, 3)
        report["mutants_killed"] = sum(bool(m.killed_by) for m in mutants)
        report["mutants"] = len(mutants)
        report["ok"] = report["ok"] and all(m.killed_by for m in mutants)
    print_summary(report, out)
    if options.json_path:
        data: dict[str, object] = {
            "obligations": [outcome_json(o) for o in outcomes],
            "summary": report,
        }
        if reaches is not None:
            data["reach"] = [r.to_json() for r in reaches]
        if mutants is not None:
            data["mutants"] = [
                {"name": m.name, "description": m.description, "killed_by": m.killed_by}
                for m in mutants
            ]
            data["mutant_details"] = [mutant_json(m) for m in mutants]
        Path(options.json_path).write_text(json.dumps(data, indent=2) + "\n")
    if options.junit_path:
        write_junit(outcomes, mutants, Path(options.junit_path))
    return 0 if report["ok"] else 1


def print_table(outcomes: Sequence[Outcome], out: TextIO) -> None:
    header = f"{'profile':<15} {'layout':<15} {'contract':<8} {'check':<34} {'verdict':<8}"
    print(f"{header} {'expected':<8} {'inductive':<9} {'seconds':>7}", file=out)
    for o in outcomes:
        flag = "" if o.matches else "   <-- MISMATCH"
        vac = "" if o.nonvacuous else " (vacuous)"
        inductive = "yes" if o.inductive else "BOUNDED"
        print(
            f"{o.profile:<15} {o.layout:<15} {o.contract:<8} {o.check:<34} {o.verdict:<8}"
            f" {o.expected:<8} {inductive:<9} {o.seconds:7.2f}{vac}{flag}",
            file=out,
        )


def print_findings(outcomes: Sequence[Outcome], out: TextIO) -> None:
    failed = [o for o in outcomes if o.verdict != "holds" or not o.matches]
    if not failed:
        return
    print("\nfailed obligations, with their witnesses:", file=out)
    for o in failed:
        print(f"\n* {o.name}: {o.verdict} (expected {o.expected})", file=out)
        for reason in o.reasons[:3]:
            print(f"    {reason}", file=out)
        if o.table is not None:
            print(o.table, file=out)
            print(f"  scenario: {o.witness}", file=out)
        elif o.counterexample is not None:
            shown = " ".join(f"{k}={v}" for k, v in sorted(o.counterexample.items()))
            print(f"  counterexample to induction (no concrete step found): {shown}", file=out)


def write_reach_scenarios(reaches: Sequence[Reach], directory: Path) -> None:
    """Each finding's realistic scenario, as ``NAME.json`` (``dualbudget schedule`` runs
    it); ``Reach.to_json`` names the file under ``scenario``."""
    for r in reaches:
        if r.scenario is not None:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / (r.obligation.replace("/", "__") + ".json")
            path.write_text(json.dumps(r.scenario, indent=2) + "\n")
            r.scenario_path = str(path)


def print_reach(
    reaches: Sequence[Reach], outcomes: Sequence[Outcome], out: TextIO, wall: float
) -> None:
    from .reach import REACH_BOX, minimal_witness, reach_rows

    witnesses = {o.name: minimal_witness(o.table) for o in outcomes}
    print(f"\nreach of each finding (z3 over the spec in {REACH_BOX.text()}):", file=out)
    rows = reach_rows(reaches, witnesses)
    for r, row in zip(reaches, rows[1:], strict=True):
        print(f"\n* {row[0]} ({r.seconds:.2f} s)", file=out)
        for label, cell in zip(rows[0][1:], row[1:], strict=True):
            print(f"    {label}: {cell}", file=out)
        if r.scenario_path:
            print(f"    scenario: {r.scenario_path} ({r.broken})", file=out)
    print(f"reach: {len(reaches)} findings in {wall:.1f} s wall", file=out)


def print_mutants(mutants: Sequence[MutantOutcome], out: TextIO) -> None:
    print("\nmutants (buggy twins of the ledger code):", file=out)
    for m in mutants:
        status = "killed" if m.killed_by else "SURVIVED"
        print(
            f"  {m.name:<30} {m.profile:<15} {status:<8} by {len(m.killed_by):>3}"
            f" obligations ({m.seconds:.1f}s): {m.description}",
            file=out,
        )
        for name in m.killed_by[:4]:
            print(f"      {name}", file=out)
        if len(m.killed_by) > 4:
            print(f"      ... and {len(m.killed_by) - 4} more", file=out)
        if m.unknown:
            print(f"      unknown: {', '.join(m.unknown[:4])}", file=out)


def print_summary(report: dict[str, object], out: TextIO) -> None:
    print(
        f"\nsummary: {report['obligations']} obligations: {report['holds']} hold,"
        f" {report['fails']} fail ({report['expected_failures']} expected),"
        f" {report['unknown']} unknown, {report['vacuous']} vacuous,"
        f" {report['bounded']} bounded;"
        f" {report['matching_manifest']} match the manifest;"
        f" {report['witnesses']} witnesses written",
        file=out,
    )
    mismatches = report["mismatches"]
    if isinstance(mismatches, list) and mismatches:
        print(f"MISMATCH with proofs/manifest.toml: {', '.join(mismatches)}", file=out)
    if "mutants" in report:
        print(
            f"mutants: {report['mutants_killed']}/{report['mutants']} killed"
            f" in {report['mutants_wall_seconds']} s",
            file=out,
        )
    verdict = "OK" if report["ok"] else "FAILED"
    print(f"prove: {verdict} in {report['wall_seconds']} s wall", file=out)


def write_junit(
    outcomes: Sequence[Outcome], mutants: Sequence[MutantOutcome] | None, path: Path
) -> None:
    suite = ElementTree.Element("testsuite", name="dualbudget.prove")
    failures = 0
    for o in outcomes:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=f"prove.{o.profile}.{o.layout}",
            name=o.check,
            time=f"{o.seconds:.3f}",
        )
        if not o.matches:
            failures += 1
            failure = ElementTree.SubElement(
                case, "failure", message=f"verdict {o.verdict}, manifest expects {o.expected}"
            )
            failure.text = "\n".join([*o.reasons, o.table or ""])
    for m in mutants or ():
        case = ElementTree.SubElement(suite, "testcase", classname="prove.mutants", name=m.name)
        if not m.killed_by:
            failures += 1
            ElementTree.SubElement(case, "failure", message="mutant survived every obligation")
    suite.set("tests", str(len(outcomes) + len(mutants or ())))
    suite.set("failures", str(failures))
    ElementTree.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
