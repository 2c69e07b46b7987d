"""``dualbudget simulate``: the reference over a workload under several profiles.

The simulation itself is ``dualbudget.reference.simulate`` (pure, standard library); this
module is the glue: the workload and engine overrides, one process per profile where
there are cores for it, the table, ``--json`` and ``--plot``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from dualbudget.reference.scenario import (
    Scenario,
    config_to_json,
    load_scenario,
    parse_config,
    validate,
)
from dualbudget.reference.scheduler import PREFIX_OBSERVED
from dualbudget.reference.simulate import (
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
from dualbudget.reference.trace import read_trace
from dualbudget.reference.workload import DEFAULT_WORKLOAD, preset
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

    workload: str | None = None
    """A preset of ``reference.workload.PRESETS``, run with ``seed``."""
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
    """The step-time coefficients (``reference.simulate.CALIBRATIONS``)."""
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
        name = options.workload or DEFAULT_WORKLOAD
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
