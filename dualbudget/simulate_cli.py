"""``dualbudget simulate``: the reference over a workload under several profiles.

The simulation itself is ``dualbudget.reference.runs.simulate`` (pure, standard library); this
module is the glue: the workload and engine overrides, one process per profile where
there are cores for it, the table, ``--json`` and ``--plot``.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from dualbudget.reference.formats.scenario import (
    Scenario,
    config_to_json,
    load_scenario,
    parse_config,
    validate,
)
from dualbudget.reference.formats.trace import read_trace
from dualbudget.reference.runs.simulate import (
    DEFAULT_CALIBRATION,
    DEFAULT_PROFILES,
    Calibration,
    SimResult,
    StepTimeModel,
    calibration_named,
    ratios,
    scenario_from_trace,
    simulate,
    to_json,
)
from dualbudget.reference.runs.sweep import (
    Cell,
    CellVerdict,
    SweepRow,
    SweepUnit,
    cell_label,
    csv_rows,
    parse_grid,
    run_unit,
    sweep_units,
    table_json,
    verdicts,
)
from dualbudget.reference.runs.workload import DEFAULT_WORKLOAD, preset
from dualbudget.reference.scheduler import PREFIX_OBSERVED
from dualbudget.spec.errors import BadInput

TIME_NOTE = (
    "Step counts, rows and their ratios are exact consequences of the policies; seconds come"
    " from t(step) = a + b*T + c*D and are only as good as the coefficients"
    " (see docs/simulate.md for fitting them to a `vllm bench serve` run)."
)


@dataclass(frozen=True, kw_only=True)
class SimulateOptions:
    """One ``dualbudget simulate`` run (``simulate_command``); its defaults are the flags'.

    The workload is one of ``trace``, ``scenario`` and ``workload``, in that order; none
    given: the preset ``DEFAULT_WORKLOAD``."""

    workload: tuple[str, ...] = ()
    """A preset of ``reference.runs.workload.PRESETS``, run with ``seed``; several only with
    ``sweep``."""
    scenario: str | None = None
    """A scenario JSON file."""
    trace: str | None = None
    """A recorded trace: its config, arrivals and measured acceptance."""
    seed: int = 0
    enable_prefix_caching: bool | None = None
    """vLLM's prefix caching on or off; None: the workload's own setting."""
    profiles: tuple[str, ...] = DEFAULT_PROFILES
    max_num_batched_tokens: int | None = None
    """Overrides the workload's; so do the next two."""
    max_num_seqs: int | None = None
    speculative_config: str | None = None
    """JSON, as vLLM takes it."""
    calibration: str = DEFAULT_CALIBRATION
    """The step-time coefficients (``reference.runs.simulate.CALIBRATIONS``)."""
    step_time_a: float | None = None
    """Replaces the calibration's coefficient ``a`` (seconds); so do the next two."""
    step_time_b: float | None = None
    step_time_c: float | None = None
    max_steps: int | None = None
    """Stop each run after this many steps; None: when every request has finished."""
    jobs: int | None = None
    """Processes; None: one per profile, at most one per core."""
    json_path: str | None = None
    plot: str | None = None
    """A folder for PNG plots; None: no plots."""
    quiet: bool = False
    """No progress lines."""
    sweep: bool = False
    """Simulate every cell of ``grid`` under every profile, on every ``workload`` preset,
    as units of the executor (``reference.runs.sweep``), into one table."""
    grid: tuple[str, ...] = ()
    """``KEY=V1,V2,...`` items, each key one of vLLM's config names
    (``reference.runs.sweep.GRID_KEYS``); empty: the one cell of the workload's own config."""
    num_requests: int | None = None
    """A sweep runs at most this many of each preset's requests; None: all."""
    differ_above: float = 0.05
    """A sweep marks a cell where the worst profile's time per output token exceeds the
    best's by more than this fraction."""
    csv_path: str | None = None
    """Where a sweep writes its table as CSV."""
    executor: str = "local"
    """Where a sweep's units run: ``local`` processes (``jobs`` of them) or ``ray``."""
    ray_address: str | None = None
    """The Ray cluster of ``--executor ray``; None: a local Ray started for the run."""


def load_workload(options: SimulateOptions) -> tuple[str, Scenario]:
    """The workload's name and scenario, with the engine overrides applied."""
    prefix_caching = options.enable_prefix_caching
    if options.trace:
        trace = read_trace(options.trace)
        name, scenario = options.trace, scenario_from_trace(trace, "dual", options.seed)
        caching = (
            scenario.config.enable_prefix_caching if prefix_caching is None else prefix_caching
        )
        if caching and any(r.prompt_token_ids is None for r in scenario.requests):
            # The driver would give each request ids of its own: no hit, silently.
            raise BadInput(
                f"--trace {options.trace}: prefix caching is on, but the trace's requests"
                " carry no token ids, so a what-if cannot reproduce its hits; simulate it"
                " with --no-enable-prefix-caching"
            )
    elif options.scenario:
        name, scenario = options.scenario, load_scenario(options.scenario)
    else:
        if len(options.workload) > 1:
            raise BadInput("--workload: give one workload, or several with --sweep")
        name = options.workload[0] if options.workload else DEFAULT_WORKLOAD
        scenario = preset(name).scenario(options.seed)
        name = f"{name} (seed {options.seed})"
    return name, with_overrides(
        scenario,
        options.max_num_batched_tokens,
        options.max_num_seqs,
        options.speculative_config,
        prefix_caching,
    )


def with_overrides(
    scenario: Scenario,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    speculative_config: str | None,
    enable_prefix_caching: bool | None = None,
) -> Scenario:
    config = config_to_json(scenario.config)
    if max_num_batched_tokens is not None:
        config["max_num_batched_tokens"] = max_num_batched_tokens
    if max_num_seqs is not None:
        config["max_num_seqs"] = max_num_seqs
    if speculative_config is not None:
        try:
            spec = json.loads(speculative_config)
        except json.JSONDecodeError as err:
            raise BadInput(f"--speculative-config: malformed JSON: {err.msg}") from None
        config["speculative_config"] = spec
    if enable_prefix_caching is not None:
        config["enable_prefix_caching"] = enable_prefix_caching
    return validate(replace(scenario, config=parse_config(config)))


def check_profiles(names: Sequence[str]) -> None:
    from dualbudget.spec.profiles import profile_named

    for name in names:
        profile_named(name)  # raises UnknownProfile (BadInput)


def time_model(options: SimulateOptions) -> Calibration:
    """The calibration named by ``--calibration``, with any ``--step-time-X`` replacing
    its coefficient (then named ``custom``, so no output passes it off as the named one)."""
    calibration = calibration_named(options.calibration)
    given: dict[str, float] = {}
    steps = {"a": options.step_time_a, "b": options.step_time_b, "c": options.step_time_c}
    for name, value in steps.items():
        if value is None:
            continue
        if value < 0:
            raise BadInput(f"--step-time-{name}: must be >= 0")
        given[name] = value
    if not given:
        return calibration
    flags = ", ".join(f"--step-time-{name}" for name in given)
    return Calibration(
        "custom",
        replace(calibration.model, **given),
        f"{calibration.name} with {flags} from the command line",
    )


def _progress(profile: str, steps: int, finished: int, total: int) -> None:
    print(
        f"simulate: {profile}: step {steps}, {finished}/{total} requests finished",
        file=sys.stderr,
        flush=True,
    )


def _run_one(job: tuple[Scenario, str, int | None, bool]) -> SimResult:
    scenario, profile, max_steps, quiet = job
    return simulate(scenario, profile, max_steps=max_steps, progress=None if quiet else _progress)


def run_profiles(
    scenario: Scenario,
    profiles: Sequence[str],
    *,
    max_steps: int | None = None,
    jobs: int | None = None,
    quiet: bool = False,
    refused: list[str] | None = None,
) -> list[SimResult]:
    """One ``simulate`` per profile, in parallel processes when ``jobs`` > 1; results in
    the order of ``profiles``. Each profile is validated against the workload first;
    a profile whose admission rules refuse the config is left out, with its reason in
    ``refused`` (when given), and BadInput if every profile refuses."""
    accepted, reasons = [], []
    for profile in profiles:
        try:
            scenario.with_profile(profile)  # BadInput here, not in a worker
        except BadInput as err:
            reasons.append(f"{profile}: refuses the config: {err}")
            continue
        accepted.append(profile)
    if refused is not None:
        refused.extend(reasons)
    if not accepted:
        raise BadInput("; ".join(reasons))
    profiles = accepted
    work = [(scenario, p, max_steps, quiet) for p in profiles]
    if jobs is None:
        jobs = min(os.cpu_count() or 1, len(profiles))
    if jobs <= 1 or len(profiles) <= 1:
        return [_run_one(job) for job in work]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return list(pool.imap(_run_one, work, chunksize=1))


def simulate_command(options: SimulateOptions) -> int:
    if options.sweep:
        return sweep_command(options)
    if options.grid:
        raise BadInput("--grid: only with --sweep")
    started = time.perf_counter()
    profiles = list(options.profiles)
    check_profiles(profiles)
    calibration = time_model(options)
    if options.max_steps is not None and options.max_steps < 1:
        raise BadInput("--max-steps: must be >= 1")
    if options.jobs is not None and options.jobs < 1:
        raise BadInput("--jobs: must be >= 1")
    name, scenario = load_workload(options)
    refused: list[str] = []
    results = run_profiles(
        scenario,
        profiles,
        max_steps=options.max_steps,
        jobs=options.jobs,
        quiet=options.quiet,
        refused=refused,
    )
    wall = time.perf_counter() - started
    print_report(name, scenario, results, calibration, sys.stdout)
    for line in refused:
        print(f"REFUSED {line}")
    print(
        f"wall time: {wall:.1f} s for {len(profiles)} profiles"
        f" (per profile: {', '.join(f'{r.profile} {r.wall_seconds:.1f} s' for r in results)})"
    )
    if options.json_path:
        document = to_json(name, results, calibration)
        Path(options.json_path).write_text(json.dumps(document, indent=1) + "\n")
    if options.plot:
        from dualbudget.plots import write_plots

        for path in write_plots(results, Path(options.plot)):
            print(f"plot: {path}")
    return 0


def _fmt(x: float) -> str:
    if isinstance(x, int) or float(x).is_integer():
        return str(int(x))
    return f"{x:.2f}"


def _d(d: dict[str, Any]) -> str:
    return "/".join(_fmt(d[k]) for k in ("mean", "p50", "p99", "max"))


def table_rows(results: Sequence[SimResult], model: StepTimeModel) -> list[list[str]]:
    """The table of ``print_report`` and the design-review document: a header row, then
    one row per profile."""
    rows = [
        [
            "profile",
            "steps",
            "req/step mean/p50/p99/max",
            "T/step",
            "D/step",
            "peak max(T,D) / B",
            "TTFT steps mean/p99",
            "steps/out tok",
            "out tokens",
            "tok/s*",
            "TTFT s* mean/p99",
            "ITL ms*",
            "ratio steps",
            "ratio tok/s",
            "ratio TTFT",
            "prefix hit tokens / prompt",
            "requests with a hit",
            *PREFIX_OBSERVED,
            "contract",
        ]
    ]
    for r, ratio in zip(results, ratios(results, model), strict=True):
        s, t = r.summary(), r.timing(model)
        broken = ", ".join(
            f"{v['contract']} x{v['count']} (first step {v['first_step']})" for v in r.violations
        )
        if r.stall:
            broken = (broken + "; " if broken else "") + "C4 stall"
        rows.append(
            [
                r.profile,
                str(s["steps"]),
                _d(s["requests_per_step"]),
                _d(s["target_tokens_per_step"]),
                _d(s["draft_rows_per_step"]),
                f"{s['peak_rows']} / {r.budget}" + (" OVER" if s["peak_rows"] > r.budget else ""),
                f"{s['ttft_steps']['mean']:.1f}/{_fmt(s['ttft_steps']['p99'])}",
                f"{s['steps_per_output_token']:.3f}",
                str(s["output_tokens"]),
                f"{t['output_tokens_per_s']:.0f}",
                f"{t['ttft_s_mean']:.2f}/{t['ttft_s_p99']:.2f}",
                f"{t['itl_s_mean'] * 1000:.2f}",
                f"{ratio['steps']:.3f}",
                f"{ratio['output_tokens_per_s']:.3f}",
                f"{ratio['ttft_s_mean']:.3f}",
                *prefix_cells(r),
                broken or "ok",
            ]
        )
    return rows


def prefix_cells(result: SimResult) -> list[str]:
    """The table's prefix-cache cells: hit tokens over prompt tokens, requests with a hit
    over requests admitted, then each of the scheduler's counters (``PREFIX_OBSERVED``);
    ``off`` without prefix caching."""
    if not result.prefix_caching:
        return ["off"] * (2 + len(PREFIX_OBSERVED))
    stats = result.prefix
    return [
        f"{stats.hit_tokens} / {stats.prompt_tokens} ({100 * stats.hit_rate:.1f}%)",
        f"{stats.requests_with_hit} / {stats.requests}",
        *(str(stats.events[name]) for name in PREFIX_OBSERVED),
    ]


def print_report(
    name: str,
    scenario: Scenario,
    results: Sequence[SimResult],
    calibration: Calibration,
    out: TextIO,
) -> None:
    config = scenario.config
    model = calibration.model
    print(
        f"workload: {name}: {len(scenario.requests)} requests,"
        f" B={config.max_num_batched_tokens}, max_num_seqs={config.max_num_seqs},"
        f" speculative_config={config_to_json(config).get('speculative_config')},"
        f" enable_prefix_caching={config.enable_prefix_caching}",
        file=out,
    )
    print(
        f"step time model: t = {model.a:g} s + {model.b:g} s*T + {model.c:g} s*D"
        f" (* = predicted by it), calibration {calibration.name}",
        file=out,
    )
    for line in calibration.notes():
        print(f"  {line}", file=out)
    rows = table_rows(results, model)
    # Transposed: one column per profile reads better in a terminal.
    width = max(len(row[0]) for row in zip(*rows, strict=True))
    columns = [max(len(c) for c in row) for row in rows]
    for i, label in enumerate(rows[0]):
        cells = [row[i].ljust(columns[j + 1]) for j, row in enumerate(rows[1:])]
        print(f"{label.ljust(width)}  {'  '.join(cells)}".rstrip(), file=out)
    for r in results:
        for v in r.violations:
            print(
                f"CONTRACT {v['contract']} BROKEN under {r.profile}: {v['count']} steps,"
                f" first at step {v['first_step']}: {v['message']}",
                file=out,
            )
        if r.stall:
            print(f"{r.profile}: {r.stall}", file=out)
    print(TIME_NOTE, file=out)


# -- the sweep ---------------------------------------------------------------------------


def sweep_command(options: SimulateOptions) -> int:
    """``simulate --sweep``: every (workload, cell, profile) a unit of the executor, the
    rows merged in unit order into one table (stdout, ``--json``, ``--csv``) and a plot
    per workload (``--plot``)."""
    _check_sweep_options(options)
    grid = parse_grid(options.grid)
    profiles = list(options.profiles)
    check_profiles(profiles)
    workloads = list(dict.fromkeys(options.workload or (DEFAULT_WORKLOAD,)))
    for name in workloads:
        preset(name)  # BadInput here, not in a worker
    calibration = time_model(options)
    units = sweep_units(
        grid,
        profiles,
        workloads,
        seed=options.seed,
        model=calibration.model,
        num_requests=options.num_requests,
        max_steps=options.max_steps,
    )
    rows, wall, width = _run_sweep(options, units)
    header = {
        "seed": options.seed,
        "num_requests": options.num_requests,
        "max_steps": options.max_steps,
        "workloads": workloads,
        "profiles": profiles,
        "calibration": {
            "name": calibration.name,
            "a": calibration.model.a,
            "b": calibration.model.b,
            "c": calibration.model.c,
        },
    }
    cells = verdicts(rows, options.differ_above)
    print_sweep(rows, cells, calibration, options.differ_above, sys.stdout)
    print(
        f"wall time: {wall:.1f} s for {len(units)} units on {options.executor}"
        f" x {width or 'every CPU'}"
    )
    if options.json_path:
        document = table_json(grid, rows, options.differ_above, header)
        Path(options.json_path).write_text(json.dumps(document, indent=1) + "\n")
    if options.csv_path:
        with Path(options.csv_path).open("w", newline="") as out:
            csv.writer(out).writerows(csv_rows(grid, rows))
    if options.plot:
        from dualbudget.plots import write_sweep_plots

        for path in write_sweep_plots(rows, cells, Path(options.plot), options.differ_above):
            print(f"plot: {path}")
    return 0


def _check_sweep_options(options: SimulateOptions) -> None:
    """Refuses, before any unit runs, the options a sweep cannot take."""
    from dualbudget.campaign.executor import EXECUTORS

    if options.scenario or options.trace:
        raise BadInput("--sweep: sweeps presets (--workload); not --scenario or --trace")
    if options.executor not in EXECUTORS:
        raise BadInput(f"--executor: unknown {options.executor!r} (known: {', '.join(EXECUTORS)})")
    if options.jobs is not None and options.jobs < 1:
        raise BadInput("--jobs: must be >= 1")
    if options.num_requests is not None and options.num_requests < 1:
        raise BadInput("--num-requests: must be >= 1")
    if options.max_steps is not None and options.max_steps < 1:
        raise BadInput("--max-steps: must be >= 1")
    if options.differ_above < 0:
        raise BadInput("--differ-above: must be >= 0")
    overrides = (
        options.max_num_batched_tokens,
        options.max_num_seqs,
        options.speculative_config,
        options.enable_prefix_caching,
    )
    if any(value is not None for value in overrides):
        raise BadInput("--sweep: vary the config with --grid, not with the override flags")


def _run_sweep(
    options: SimulateOptions, units: list[SweepUnit]
) -> tuple[list[SweepRow], float, int]:
    """Every unit on the chosen executor, its rows in unit order; the wall time and the
    executor's width (0: every CPU of a Ray cluster)."""
    from dualbudget.campaign.executor import (
        ExecutorUnavailable,
        UnitFailed,
        default_width,
        executor_for,
    )

    ids = [f"{u.workload} {cell_label(u.cell)} {u.profile}" for u in units]
    started = time.perf_counter()
    local = options.executor == "local"
    width = options.jobs or (default_width() if local else 0)
    done = [0]

    def progress(index: int, _: object) -> None:
        done[0] += 1
        if not options.quiet:
            print(f"sweep: {done[0]}/{len(units)} units ({ids[index]})", file=sys.stderr)

    try:
        with executor_for(options.executor, width, options.ray_address) as executor:
            rows = list(executor.map(run_unit, units, ids, on_done=progress))
    except UnitFailed as err:
        raise BadInput(f"--sweep: {err}") from None
    except ExecutorUnavailable as err:
        raise BadInput(f"--executor {options.executor}: {err}") from None
    return rows, time.perf_counter() - started, width


def print_sweep(
    rows: Sequence[SweepRow],
    cells: Sequence[CellVerdict],
    calibration: Calibration,
    differ_above: float,
    out: TextIO,
) -> None:
    """Per workload and cell, each profile's output tokens per step and milliseconds per
    output token, the best profile and whether the profiles differ above the threshold."""
    model = calibration.model
    print(
        f"step time model: t = {model.a:g} s + {model.b:g} s*T + {model.c:g} s*D,"
        f" calibration {calibration.name}; per profile: output tokens/step,"
        " ms per output token*",
        file=out,
    )
    by_cell: dict[tuple[str, Cell], list[SweepRow]] = {}
    for row in rows:
        by_cell.setdefault((row.workload, row.cell), []).append(row)
    for verdict in cells:
        parts = []
        for row in by_cell[(verdict.workload, verdict.cell)]:
            if row.refused is not None:
                parts.append(f"{row.profile} refused")
                continue
            broken = f" [{', '.join(row.violations)}]" if row.violations else ""
            parts.append(
                f"{row.profile} {row.output_tokens_per_step:.2f}"
                f" {1000 * row.time_per_output_token:.3f}{broken}"
            )
        mark = f" DIFFER by {100 * verdict.spread:.1f}%" if verdict.differs else ""
        print(
            f"{verdict.workload} {cell_label(verdict.cell)}: {'; '.join(parts)};"
            f" best {verdict.best or 'none'}{mark}",
            file=out,
        )
    differing = sum(v.differs for v in cells)
    print(
        f"{differing} of {len(cells)} cells differ by more than {100 * differ_above:g}%",
        file=out,
    )
    print(TIME_NOTE, file=out)
