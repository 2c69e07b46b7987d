"""``dualbudget report --out DIR``: the design-review document of a budget change.

One Markdown file (``DIR/design-review.md``) with its plots beside it: the contract
C1-C6, the profiles (the releases and the upstream proposals), the proof verdicts
(profiles x layouts x contract items, with the findings and their witness scenarios),
the reach of each finding in a realistic config space (``proofs/reach.py``, each
scenario replayed through the reference), where pairs of profiles decide differently
(z3 per layout, ``dualbudget diff`` on the standard workloads), the trace-replay status
of the bundled traces and whether a vLLM is installed for the
differential suite, and the simulation table on the standard workloads under a named
calibration of the step-time model.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dualbudget import TRACES
from dualbudget.integration.commands import FUZZ_EXAMPLES
from dualbudget.reference.runs.simulate import (
    CALIBRATIONS,
    DEFAULT_CALIBRATION,
    DEFAULT_PROFILES,
    SimResult,
    calibration_named,
)
from dualbudget.reference.runs.workload import preset
from dualbudget.spec.contract import contract_markdown
from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import PROFILES, PROPOSAL_NAMES

STANDARD_WORKLOADS = (
    ("long-prompts", "low concurrency, long prompts"),
    ("dspark-bench", "high concurrency, short prompts, the DSpark preset"),
    ("chat-poisson", "mixed, trace-shaped (Poisson arrivals, lognormal chat lengths)"),
    (
        "chat-system-prompt",
        "chat with a shared system prompt and follow-up turns, prefix caching on",
    ),
)

REPORT_PROFILES = (*DEFAULT_PROFILES, *PROPOSAL_NAMES)
"""The releases and ``dual``, then the upstream proposals, on every standard workload."""


def _table(rows: Sequence[Sequence[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in rows[0]) + " |"]
    lines.append("|" + "---|" * len(rows[0]))
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def proofs_section(out: Path) -> list[str]:
    from dualbudget.proofs.manifest import load_manifest
    from dualbudget.proofs.runner import BOUNDS, run, select, summary, write_witnesses

    started = time.perf_counter()
    manifest = load_manifest()
    obligations = select()
    outcomes = run(obligations, manifest)
    write_witnesses(outcomes, out / "witnesses")
    report = summary(outcomes, time.perf_counter() - started)
    reach = reach_lines(obligations, outcomes, manifest, out)
    lines = [
        "## Proof verdicts",
        "",
        f"`dualbudget prove`: {report['obligations']} obligations, {report['holds']} hold,"
        f" {report['fails']} fail ({report['expected_failures']} expected by"
        f" proofs/manifest.toml), {report['unknown']} unknown, {report['vacuous']} vacuous;"
        f" {report['matching_manifest']} match the manifest"
        f" ({'OK' if report['ok'] else 'MISMATCH: ' + ', '.join(report['mismatches'])});"
        f" {report['wall_seconds']} s.",
        "",
        f"Bounds: {BOUNDS.removeprefix('bounds: ')}",
        "",
    ]
    # profiles x layouts, one cell per contract item: the checks that fail, else "holds".
    contracts = sorted({o.contract for o in outcomes})
    cells: dict[tuple[str, str], dict[str, list[str]]] = {}
    for o in outcomes:
        row = cells.setdefault((o.profile, o.layout), {c: [] for c in contracts})
        if o.verdict != "holds":
            row[o.contract].append(f"{o.check}: {o.verdict}")
    rows = [["profile", "layout", *contracts]]
    for (profile, layout), by_contract in cells.items():
        rows.append(
            [
                profile,
                layout,
                *("; ".join(by_contract[c]) or "holds" for c in contracts),
            ]
        )
    lines += [_table(rows), ""]
    failed = [o for o in outcomes if o.verdict != "holds"]
    if failed:
        lines += ["### Findings and witnesses", ""]
        for o in failed:
            where = (
                f" — witness: [`{Path(o.witness).name}`](witnesses/{Path(o.witness).name})"
                if o.witness
                else ""
            )
            expected = "expected" if o.matches else f"UNEXPECTED (manifest: {o.expected})"
            lines.append(f"- **{o.name}**: {o.verdict}, {expected}{where}")
            for reason in o.reasons[:2]:
                lines.append(f"  - {reason}")
            if o.table:
                lines += ["", "```", o.table.strip("\n"), "```", ""]
        lines.append("")
    return [*lines, *reach]


def reach_lines(
    obligations: Sequence[Any], outcomes: Sequence[Any], manifest: Any, out: Path
) -> list[str]:
    """The reach table: each expected failure's minimal witness, its region in the
    realistic box (z3, proofs/reach.py) and whether the event flow produces it, with its
    scenario replayed here through the reference scheduler."""
    from dualbudget.proofs.commands import write_reach_scenarios
    from dualbudget.proofs.reach import REACH_BOX, minimal_witness, reach_rows
    from dualbudget.proofs.runner import run_reach
    from dualbudget.reach_replay import replay_reach

    started = time.perf_counter()
    reaches = run_reach(obligations, manifest)
    write_reach_scenarios(reaches, out / "witnesses" / "reach")
    rows = reach_rows(reaches, {o.name: minimal_witness(o.table) for o in outcomes})
    rows[0].append("reference replay")
    for r, row in zip(reaches, rows[1:], strict=True):
        shown = replay_reach(r.profile, r.contract, r.check, r.scenario) if r.scenario else None
        if r.scenario_path:
            name = Path(r.scenario_path).name
            row[3] += f" ([scenario](witnesses/reach/{name}))"
        row.append(shown or ("not replayed: no scenario" if not r.scenario else "NOT SHOWN"))
    return [
        "### The reach of each finding",
        "",
        f"Computed by z3 on each obligation's own queries with the config in {REACH_BOX.text()}"
        " (proofs/reach.py); a region is the set of K that fail, then per K the candidate z3"
        " proves every failing config lies in and finds failures at the corners of, or the"
        " failing set's bounding ranges. Each scenario is one step of prompts arriving"
        " together, replayed through the reference scheduler."
        f" {time.perf_counter() - started:.1f} s.",
        "",
        _table(rows),
        "",
    ]


DIFF_PAIRS = (
    ("vllm-0.32", "vllm-0.33"),
    ("vllm-0.33", "dual"),
    ("vllm-0.32", "dual"),
    ("dual", "pr-53080"),
    ("vllm-0.32", "pr-52996"),
    ("pr-52996", "fork-605"),
)
"""The profile pairs the review compares: each release step and each proposal against
what it changes."""


def differences_section(seed: int, quick: bool) -> list[str]:
    """Where pairs of profiles decide differently: z3 per layout within the diff search's
    bounds (not with ``--quick``), and the reference on the standard workloads."""
    lines = ["## Where the policies differ", ""]
    if quick:
        lines += ["The z3 comparison per layout is not run (`--quick`).", ""]
    else:
        lines += proved_differences()
    return [*lines, *workload_differences(seed, quick)]


def proved_differences() -> list[str]:
    """Per pair and layout, ``same (proved)`` or what separates them
    (proofs/same_decisions.py), for configs in the ``dualbudget diff --search`` bounds."""
    from dualbudget.diff_cli import SEARCH_BOUNDS
    from dualbudget.proofs.same_decisions import same_decisions
    from dualbudget.spec.methods import LAYOUT_NAMES

    bounds = SEARCH_BOUNDS.for_z3()
    rows = [["pair", *LAYOUT_NAMES]]
    for a, b in DIFF_PAIRS:
        cells = []
        for layout in LAYOUT_NAMES:
            proof = same_decisions(a, b, layout, bounds)
            cells.append("same (proved)" if proof.equal else proof.reason.split(" (K=")[0])
        rows.append([f"{a} vs {b}", *cells])
    return [
        "z3 per layout (proofs/same_decisions.py): `same (proved)` where the two accept the"
        " same configs, cap running requests alike (below the most requests of a scenario)"
        " and grant every request the same in every step, for B, max_num_seqs, K and the"
        " request count in the `dualbudget diff --search` bounds"
        f" ({SEARCH_BOUNDS.text()}); else the first item that separates them.",
        "",
        _table(rows),
        "",
    ]


def workload_differences(seed: int, quick: bool) -> list[str]:
    """``dualbudget diff`` of vllm-0.33 and vllm-0.32 against dual on each standard
    workload: the first differing step, steps and target tokens per step."""
    from dualbudget.reference.runs.diff import compare

    rows = [["workload", "pair", "first differing step", "steps", "target tokens/step"]]
    for name, _ in STANDARD_WORKLOADS:
        workload = preset(name)
        if quick:
            workload = replace(workload, num_requests=min(workload.num_requests, 64))
        scenario = workload.scenario(seed)
        for a, b in (("vllm-0.33", "dual"), ("vllm-0.32", "dual")):
            try:
                result = compare(scenario, a, b)
            except BadInput as err:
                rows.append([name, f"{a} vs {b}", f"refused: {err}", "", ""])
                continue
            ta, tb = result.totals
            first = "none" if result.first is None else str(result.first.step)
            rows.append(
                [
                    name,
                    f"{a} vs {b}",
                    first,
                    f"{ta.steps} vs {tb.steps}",
                    f"{ta.tokens_per_step:.1f} vs {tb.tokens_per_step:.1f}",
                ]
            )
    return [
        "On the standard workloads (`dualbudget diff`, the reference under each profile):",
        "",
        _table(rows),
        "",
        "See docs/diff.md for the `dualbudget diff --search` figures.",
        "",
    ]


def profiles_section() -> list[str]:
    """Every profile of spec/profiles.py: the releases, the project's own ``dual``, and the
    upstream proposals with the thread each cites."""
    rows = [["profile", "policy", "vLLM release", "what it does"]]
    for profile in PROFILES.values():
        rows.append(
            [
                f"`{profile.name}`",
                f"`{profile.policy.name}`",
                profile.vllm_version or "none",
                profile.summary,
            ]
        )
    return [
        "## The profiles",
        "",
        "The budget rules the proofs check and the reference runs (`spec/profiles.py`); a"
        " profile without a release is a proposal or the project's own `dual`.",
        "",
        _table(rows),
        "",
    ]


def calibration_lines(name: str) -> list[str]:
    """The calibration in use, and the others there are, each with its provenance."""
    used = calibration_named(name)
    lines = [f"Step-time calibration in use: **{used.name}**.", ""]
    lines += [f"- {note}" for note in used.notes()]
    others = [c for c in CALIBRATIONS.values() if c.name != used.name]
    if others:
        lines += ["", "Other calibrations (`dualbudget simulate --calibration NAME`):", ""]
        lines += [f"- {c.notes()[0]}" for c in others]
    return [*lines, ""]


def traces_section(fuzz_json: Path | None = None) -> list[str]:
    from dualbudget.reference.formats.trace import read_trace
    from dualbudget.reference.runs.replay import replay_trace

    rows = [["trace", "vLLM", "profile", "steps checked", "status"]]
    for path in sorted(TRACES.glob("*.ndjson*")):
        try:
            trace = read_trace(path)
            result = replay_trace(trace)
        except BadInput as err:
            rows.append([path.name, "?", "?", "0", f"cannot replay: {err}"])
            continue
        if result.divergence is not None:
            status = f"DIVERGES at step {result.divergence[0]}"
        elif result.free_blocks_divergence is not None:
            step, recorded, reference = result.free_blocks_divergence
            status = (
                f"DIVERGES at step {step}: vLLM's pool {recorded} free blocks,"
                f" the reference's {reference}"
            )
        elif result.violations:
            status = "; ".join(
                f"recorded scheduler broke {v.contract} at step {v.step}"
                for v in result.violations[:3]
            )
        elif result.steps_checked == 0:
            status = "no step checked (not a pass)"
        elif result.free_blocks_checked:
            status = "all decisions and every recorded pool agree"
        else:
            status = "all decisions agree"
        rows.append(
            [
                path.name,
                trace.header.vllm_version,
                result.profile,
                str(result.steps_checked),
                status,
            ]
        )
    lines = [
        "## Differential and trace-replay status",
        "",
        "Recorded vLLM traces (dualbudget/traces) replayed through the reference,"
        " decision by decision:",
        "",
        _table(rows),
        "",
    ]
    return [*lines, *differential_lines(fuzz_json), ""]


def differential_lines(fuzz_json: Path | None) -> list[str]:
    """The lockstep fuzz against the installed vLLM, from a ``dualbudget fuzz --json``
    file; without one, say plainly that it was not run here."""
    if fuzz_json is None:
        vllm = importlib.util.find_spec("vllm") is not None
        where = "A vLLM is importable here, but" if vllm else "No vLLM is installed here, so"
        return [
            f"{where} the live lockstep differential fuzz is **not in this document**: run"
            f" `dualbudget fuzz --examples {FUZZ_EXAMPLES} --seed 1 --json F` (or"
            " `dualbudget check`) in a vLLM environment and pass `--fuzz-json F`."
        ]
    try:
        result = json.loads(fuzz_json.read_text())
        divergences = result["divergences"]
        coverage = result["coverage"]
        head = (
            f"Lockstep fuzz against vLLM {result['vllm_version']} (profile"
            f" {result['profile']}): {result['examples']} examples, {result['steps']} steps,"
            f" {len(divergences)} divergences."
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BadInput(
            f"--fuzz-json {str(fuzz_json)!r}: not a dualbudget fuzz JSON ({err})"
        ) from None
    by_method = result.get("coverage_by_method") or {"all methods": coverage}
    counters = [(m, e, n) for m, events in sorted(by_method.items()) for e, n in events.items()]
    zero = [f"{m}:{e}" for m, e, n in counters if not n]
    lines = ["", head]
    if zero:
        lines.append(f"Coverage counters at zero (partly vacuous): {', '.join(zero)}.")
    else:
        lines.append(f"All {len(counters)} coverage counters (event x method) above zero.")
    for d in divergences[:3]:
        lines.append(f"- divergence at step {d['step']}: scenario `{d['scenario']}`")
    return lines


def simulation_section(
    out: Path, seed: int, quick: bool, calibration: str = DEFAULT_CALIBRATION
) -> list[str]:
    from dualbudget.plots import write_plots
    from dualbudget.simulate_cli import TIME_NOTE, run_profiles, table_rows

    model = calibration_named(calibration).model
    lines = [
        "## Simulation on the standard workloads",
        "",
        f"Profiles {', '.join(REPORT_PROFILES)}; ratios against {REPORT_PROFILES[0]}."
        f" Step time model t = {model.a:g} s + {model.b:g} s*T + {model.c:g} s*D,"
        f" calibration {calibration} (columns marked * use it)."
        f" {TIME_NOTE}",
        "",
        *calibration_lines(calibration),
    ]
    for name, label in STANDARD_WORKLOADS:
        workload = preset(name)
        if quick:
            workload = replace(workload, num_requests=min(workload.num_requests, 64))
        scenario = workload.scenario(seed)
        started = time.perf_counter()
        refused: list[str] = []
        results: list[SimResult] = run_profiles(
            scenario, REPORT_PROFILES, quiet=True, refused=refused
        )
        wall = time.perf_counter() - started
        plots = write_plots(results, out, prefix=f"{name}-")
        rows = table_rows(results, model)
        lines += [
            f"### {name}: {label}",
            "",
            f"{workload.num_requests} requests, seed {seed}. {workload.summary}."
            f" Simulated in {wall:.1f} s.",
            "",
            _table(rows),
            "",
        ]
        broken = [
            f"- **{r.profile}** breaks {v['contract']} on this workload in {v['count']} steps"
            f" (first at step {v['first_step']}): {v['message']}"
            for r in results
            for v in r.violations
        ]
        broken += [f"- REFUSED {line}" for line in refused]
        lines += [*broken, *([""] if broken else [])]
        lines += [f"![{p.stem}]({p.name})" for p in plots]
        lines.append("")
    return lines


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """One ``dualbudget report`` run (``report``); its defaults are the flags'."""

    out: str | None = None
    """The folder the document and its plots go to (required unless ``upstream``)."""
    seed: int = 0
    """The seed of the standard workloads."""
    quick: bool = False
    """Smaller workloads, no proofs."""
    fuzz_json: str | None = None
    """A ``dualbudget fuzz --json`` result to include; None: the document says it has none."""
    calibration: str = DEFAULT_CALIBRATION
    """The step-time model's calibration, as ``dualbudget simulate --calibration``."""
    upstream: str | None = None
    """A folder for the regression tests upstream: one standalone pytest file per finding
    or crash the installed vLLM exhibits, with their manifest (integration/upstream.py);
    instead of the document."""
    check_junit: str | None = None
    """With ``upstream``: write nothing, compare this pytest JUnit XML of a run of the
    folder with its manifest (exactly the predicted failures)."""
    vllm_src: str | None = None
    """With ``upstream``: a vLLM source tree whose Python the tests run over the installed
    vLLM (``vllm_source``); the predictions follow the profile its decisions match."""


def upstream_report(folder: Path, check_junit: str | None, vllm_src: str | None = None) -> int:
    """``report --upstream DIR``: exit 0 when what ran matches what the proofs and the
    crash records predict for the installed vLLM, or for ``vllm_src`` the profile
    detected (or, with ``check_junit``, when the run failed exactly the predicted
    tests), else 1."""
    from dualbudget.integration.commands import vllm_or_exit
    from dualbudget.integration.upstream import check_junit as check
    from dualbudget.integration.upstream import summary_lines, write_upstream
    from dualbudget.integration.vllm_source import use_vllm_source

    if check_junit is not None:
        problems = check(folder, Path(check_junit))
        for problem in problems:
            print(f"MISMATCH {problem}")
        print(f"{folder}: {'as predicted' if not problems else f'{len(problems)} mismatches'}")
        return 1 if problems else 0
    use_vllm_source(vllm_src)  # before any import of vLLM
    if vllm_or_exit("report --upstream") is None:
        return 2
    started = time.perf_counter()
    result = write_upstream(folder)
    print("\n".join(summary_lines(result, folder)))
    print(f"written in {time.perf_counter() - started:.1f} s")
    return 1 if result.mismatches else 0


def report(options: ReportOptions) -> int:
    if options.upstream is not None:
        return upstream_report(Path(options.upstream), options.check_junit, options.vllm_src)
    if options.check_junit is not None:
        raise BadInput("--check-junit: needs --upstream DIR, the folder it checks")
    if options.vllm_src is not None:
        raise BadInput("--vllm-src: needs --upstream DIR (the document runs no vLLM)")
    if options.out is None:
        raise BadInput("--out: required (the folder of the design-review document)")
    out = Path(options.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--out {str(out)!r}: cannot create: {err.strerror}") from None
    started = time.perf_counter()
    lines: list[str] = [
        "# Design review: token budgets under speculative decoding",
        "",
        "Generated by `dualbudget report`. Sections: the contract, the profiles, the proof"
        " verdicts with the reach of each finding, where the policies differ, the"
        " differential and trace-replay status, the simulation on standard workloads.",
        "",
        "## The contract",
        "",
        contract_markdown(),
        *profiles_section(),
    ]
    calibration = options.calibration
    calibration_named(calibration)  # an unknown name is bad input before any work
    sections: list[tuple[str, Any]] = []
    if options.quick:
        lines += ["## Proof verdicts", "", "Not run (`--quick`).", ""]
    else:
        sections.append(("proofs", lambda: proofs_section(out)))
    seed, quick = options.seed, options.quick
    sections.append(("differences", lambda: differences_section(seed, quick)))
    fuzz_json = Path(options.fuzz_json) if options.fuzz_json else None
    sections.append(("traces", lambda: traces_section(fuzz_json)))
    sections.append(("simulation", lambda: simulation_section(out, seed, quick, calibration)))
    for name, build in sections:
        t0 = time.perf_counter()
        print(f"report: {name} ...", file=sys.stderr, flush=True)
        lines += build()
        print(f"report: {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    document = out / "design-review.md"
    document.write_text("\n".join(lines) + "\n")
    print(f"{document} written in {time.perf_counter() - started:.1f} s")
    return 0
