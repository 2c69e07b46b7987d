"""``dualbudget fuzz`` and ``dualbudget bench``: the stages that drive the installed vLLM.

Each stage takes typed parameters (``FuzzOptions``); the command line (``dualbudget/``)
fills them from its flags. Exit codes: 0 all agreed (and, for fuzz, every coverage counter
above zero), 1 a divergence, an unknown contract finding or zero coverage, 2 bad input
(including a missing vLLM: there is nothing to check against).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualbudget.reference.events import Event
from dualbudget.reference.scenario import Scenario
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUT_NAMES

if TYPE_CHECKING:  # both import Hypothesis: loaded only when the fuzz runs
    from .fuzz import FuzzResult
    from .machine import FindingKey

DEFAULT_OUT_DIR = "fuzz-divergences"
"""Where divergence and finding scenarios go."""


def quiet_vllm() -> None:
    # vLLM logs config warnings for every scheduler it builds; keep errors only.
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)


def write_json(path: str | Path | None, obj: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def vllm_or_exit(command: str) -> str | None:
    """The installed vLLM's version; None, after one line on stderr, without vLLM."""
    from .live import installed_vllm_version

    version = installed_vllm_version()
    if version is None:
        print(
            f"dualbudget {command}: error: vLLM is not installed in {sys.executable}"
            " (see docs/vllm-environments.md)",
            file=sys.stderr,
        )
    return version


def choose_profile(profile: str | None) -> tuple[str, str]:
    """(profile, how it was chosen): ``profile`` if given, else detected."""
    from .detect import DetectionFailed, detect

    if profile:
        return profile, "--profile"
    try:
        found = detect()
    except DetectionFailed as err:
        raise BadInput(str(err).replace("\n", "; ")) from None
    return found.profile, f"detected by {found.how}"


# -- fuzz -----------------------------------------------------------------------------
@dataclass(frozen=True)
class FuzzOptions:
    """One ``dualbudget fuzz`` run (``run_fuzz_stage``)."""

    examples: int
    seed: int
    known_findings: frozenset[FindingKey]
    """(profile, layout, contract) breaks that are findings, not failures."""
    jobs: int = 1
    profile: str | None = None
    """None: detected from the installed vLLM."""
    max_seconds: float | None = None
    json_path: str | Path | None = None
    out_dir: str | Path = DEFAULT_OUT_DIR
    layouts: tuple[str, ...] = LAYOUT_NAMES
    coverage_gate: bool = True
    scheduler_cls: str | None = None
    """An import path of a vLLM ``Scheduler`` subclass to check instead of vLLM's."""
    top_up_rounds: int = 0
    """Rounds rerunning units for required coverage left at zero (``run_fuzz``)."""


def run_fuzz_stage(options: FuzzOptions) -> int:
    """The fuzz with its progress, its coverage table and its verdict; its exit code."""
    quiet_vllm()
    version = vllm_or_exit("fuzz")
    if version is None:
        return 2
    profile, how = choose_profile(options.profile)
    if options.scheduler_cls:
        from .live import scheduler_class

        scheduler_class(options.scheduler_cls)  # refused here, before any process starts
    from .fuzz import run_fuzz

    layouts = list(options.layouts)
    checked = f", scheduler {options.scheduler_cls}" if options.scheduler_cls else ""
    print(
        f"dualbudget fuzz: vLLM {version}{checked}, profile {profile} ({how}), seed"
        f" {options.seed}, {options.examples} examples, layouts {', '.join(layouts)},"
        f" {options.jobs} job{'s' if options.jobs > 1 else ''}",
        flush=True,
    )
    result = run_fuzz(
        profile=profile,
        vllm_version=version,
        examples=options.examples,
        seed=options.seed,
        out_dir=options.out_dir,
        known_findings=options.known_findings,
        max_seconds=options.max_seconds,
        layouts=layouts,
        progress=lambda line: print(line, flush=True),
        scheduler_cls=options.scheduler_cls,
        jobs=options.jobs,
        # The rounds serve the gate: a run without it has nothing to top up for.
        top_up_rounds=options.top_up_rounds if options.coverage_gate else 0,
    )
    code, table = fuzz_verdict(result, layouts, gate=options.coverage_gate)
    print(table)
    write_json(options.json_path, fuzz_json(result))
    return code


def fuzz_json(result: FuzzResult) -> dict[str, Any]:
    return {
        "vllm_version": result.vllm_version,
        "profile": result.profile,
        "examples": result.examples,
        "steps": result.steps,
        "divergences": [d.to_json() for d in result.divergences],
        "coverage": result.totals(),
        "coverage_by_method": result.coverage,
        "constructions": {k: sorted(v) for k, v in result.constructions.items()},
        "examples_by_unit": result.examples_by_unit,
        "required_coverage": {layout: list(result.required(layout)) for layout in result.coverage},
        "stopped_by_time": result.stopped_by_time,
        "findings": [f.to_json() for f in result.findings],
        "refused_configs": result.refused_configs,
        "mirrored_crashes": result.mirrored_crashes,
        "seconds": round(result.seconds, 2),
        "warm_up_seconds": round(result.warm_up_seconds, 2),
    }


SHORT_EVENT_NAMES = {
    "input_budget_bound": "input-bound",
    "chunked_prefill": "chunked",
    "preemption": "preempt",
    "preempt_scheduled": "preempt-sched",
    "padded_decode": "padded",
    "rejected_drafts": "rejected",
    "max_model_len_cap": "len-cap",
    "bound_after_refund": "after-refund",
    "token_budget_bound": "token-bound",
    "async_in_flight": "in-flight",
    "stale_output": "stale",
    "in_flight_max_tokens_skip": "max-tok-skip",
    "natural_stop": "stop",
    "prefix_hit": "hit",
    "full_prefix_hit": "full-hit",
    "cached_block_evicted": "evicted",
    "hit_on_running_block": "hit-running",
    "resume_rehit": "rehit",
}
"""The coverage table's column heads."""


def fuzz_verdict(result: FuzzResult, layouts: list[str], *, gate: bool) -> tuple[int, str]:
    """(exit code, the coverage table and the verdict line)."""
    from .fuzz import AIMS
    from .lockstep import COVERAGE_EVENTS

    short = SHORT_EVENT_NAMES
    head = f"{'method':<16}{'ex':>4}" + "".join(f"{short[e]:>14}" for e in COVERAGE_EVENTS)
    lines = ["", "coverage (events per method):", head + "  built as"]
    for layout in layouts:
        per = result.coverage.get(layout, {})
        required = result.required(layout)
        built = ", ".join(sorted(result.constructions.get(layout, set()))) or "-"
        # A count the gate does not require is shown in parentheses.
        cells = [
            f"{per.get(e, 0)}" if e in required else f"({per.get(e, 0)})" for e in COVERAGE_EVENTS
        ]
        lines.append(
            f"{layout:<16}{result.examples_by_layout.get(layout, 0):>4}"
            + "".join(f"{cell:>14}" for cell in cells)
            + f"  {built}"
        )
    by_aim = {
        aim: sum(n for unit, n in result.examples_by_unit.items() if unit.endswith(f"/{aim}"))
        for aim in AIMS
    }
    lines.append("examples by aim: " + ", ".join(f"{aim} {n}" for aim, n in by_aim.items()))
    lines.append(
        f"{result.examples} examples, {result.steps} steps in {result.seconds:.1f}s"
        f" (+{result.warm_up_seconds:.1f}s vLLM warm-up);"
        f" {result.refused_configs} configs refused by both sides,"
        f" {result.mirrored_crashes} mirrored crashes"
        + (
            " (stopped by the time limit: not reproducible by the seed alone)"
            if result.stopped_by_time
            else ""
        )
    )
    for finding in result.findings:
        tag = "known finding" if finding.known else "UNKNOWN FINDING"
        lines.append(
            f"{tag}: {finding.contract} ({finding.profile}, {finding.layout}) at step"
            f" {finding.step}: {finding.scenario_path}"
        )
    for divergence in result.divergences:
        lines.append(divergence.report())
    zeros = result.zero_coverage(layouts)
    code = 0
    if result.divergences:
        seeds = ", ".join(str(s) for s in sorted({d.seed for d in result.divergences}, key=str))
        verdict = f"FAIL: {len(result.divergences)} divergence(s) (seed {seeds})"
        code = 1
    elif result.unknown_findings:
        verdict = "FAIL: the reference flagged a contract break not known as a finding"
        code = 1
    elif gate and zeros:
        verdict = f"FAIL: coverage at zero for {', '.join(zeros)}"
        code = 1
    else:
        verdict = "PASS: live vLLM and the reference agree on every step"
        if zeros:
            verdict += f" (coverage at zero: {', '.join(zeros)})"
    lines.append(f"verdict: {verdict}")
    return code, "\n".join(lines)


def replay_scenario(path: str, profile: str | None = None, scheduler_cls: str | None = None) -> int:
    """``dualbudget fuzz --replay``: one scenario file in lockstep (against
    ``scheduler_cls``, a ``--scheduler-cls`` path, or vLLM's own scheduler); its exit code."""
    from dualbudget.reference.scenario import load_scenario

    from .live import scheduler_class, use_scheduler_class
    from .lockstep import run_in_lockstep

    quiet_vllm()
    version = vllm_or_exit("fuzz")
    if version is None:
        return 2
    scenario = load_scenario(path)
    if profile and profile != scenario.profile:
        scenario = scenario.with_profile(profile)
    cls = scheduler_class(scheduler_cls) if scheduler_cls else None
    with use_scheduler_class(cls):
        steps, divergence = run_in_lockstep(scenario)
    against = f", scheduler {scheduler_cls}" if scheduler_cls else ""
    print(
        f"dualbudget fuzz --replay: vLLM {version}{against}, profile {scenario.profile},"
        f" {steps} steps of {path}"
    )
    if divergence is None:
        print("verdict: PASS: no divergence")
        return 0
    divergence.scenario_path = str(path)
    print(divergence.report())
    print("verdict: FAIL: divergence reproduced")
    return 1


# -- bench ----------------------------------------------------------------------------
def bench_workloads(profile: str) -> list[Scenario]:
    from dualbudget.reference.scenario import Acceptance, RequestSpec, validate
    from dualbudget.spec.config import EngineConfig, SpeculativeConfig

    workloads = []
    # The last stream is vLLM's default for a model-based drafter: async scheduling.
    for spec, async_scheduling in (
        (None, False),
        (SpeculativeConfig("ngram", 3), False),
        (SpeculativeConfig("eagle3", 4, True), False),
        (SpeculativeConfig("dflash", 4, True), False),
        (SpeculativeConfig("eagle3", 4, True), True),
    ):
        config = EngineConfig(
            max_num_batched_tokens=512,
            max_num_seqs=64,
            max_model_len=1024,
            block_size=16,
            num_gpu_blocks=4096,
            speculative_config=spec,
            async_scheduling=async_scheduling,
        )
        requests = tuple(
            RequestSpec(str(i), 32 + (i * 37) % 96, 48 + (i * 53) % 80, i // 16) for i in range(128)
        )
        acceptance = Acceptance(fixed=None, per_position=(0.7, 0.6, 0.5, 0.4), seed=1)
        workloads.append(validate(Scenario(profile, config, requests, acceptance)))
    return workloads


def workload_method(scenario: Scenario) -> str:
    """A bench workload's name: its speculative method (or ``none``), ``+async`` under
    async scheduling."""
    spec = scenario.config.speculative_config
    name = str(spec.method) if spec else "none"
    return f"{name}+async" if scenario.config.async_scheduling else name


def _record_events(scenario: Scenario) -> list[list[Event]]:
    """The event stream of a reference run, step by step (each list ends with the
    step's ModelOutput/DraftProposals)."""
    from dualbudget.reference.driver import EventDriver, drive
    from dualbudget.reference.scheduler import Scheduler
    from dualbudget.spec.profiles import profile_named

    reference = Scheduler(scenario.config, profile_named(scenario.profile), check="collect")
    return [step.events for step in drive(EventDriver.of(scenario), reference)]


BENCH_TARGET_RATIO = 10
"""Issue 4's target for reference/live; printed beside the measured ratio, never asserted."""


class _Diverged(Exception):
    """vLLM decided otherwise than the reference whose events a bench run replays."""


def _time_stream(scenario: Scenario, profile: str, mode: str, stream: list[list[Event]]) -> float:
    """Seconds to feed ``stream`` to a fresh reference, live scheduler, or both (lockstep).

    Building the schedulers is not timed (vLLM's is built once per fuzz example, and its
    construction is not a scheduling step), nor is collecting earlier runs' garbage."""
    from dualbudget.reference.scheduler import Scheduler
    from dualbudget.spec.profiles import profile_named

    from .live import LiveEventError, LiveScheduler

    consumers: list[Scheduler | LiveScheduler] = []
    if mode in ("reference", "lockstep"):
        consumers.append(Scheduler(scenario.config, profile_named(profile), check="collect"))
    if mode in ("live", "lockstep"):
        consumers.append(LiveScheduler(scenario.config))
    # Collect the garbage of earlier runs now, so that no mode pays for another's.
    gc.collect()
    index = 0
    start = time.perf_counter()
    try:
        if mode == "lockstep":
            reference, live = consumers
            for index, events in enumerate(stream):  # noqa: B007 (read by the except)
                for event in events:
                    ref, got = reference.handle(event), live.handle(event)
                    if ref is not None and got is not None and ref.decision() != got.decision():
                        raise _Diverged(f"at step {ref.step}, the decisions differ")
        else:
            # One consumer: the loop adds nothing per event but the call it times.
            handle = consumers[0].handle
            for index, events in enumerate(stream):  # noqa: B007 (read by the except)
                for event in events:
                    handle(event)
    except LiveEventError as err:
        # The stream is the reference's: vLLM decided otherwise at an earlier step.
        raise _Diverged(f"at or before step {index}, vLLM cannot take it: {err}") from None
    return time.perf_counter() - start


def bench(args: argparse.Namespace) -> int:
    """``dualbudget bench``: its flags to ``run_bench``."""
    return run_bench(profile=args.profile, repeat=args.repeat, json_path=args.json)


def run_bench(*, profile: str | None, repeat: int, json_path: str | None) -> int:
    """Steps/s of each mode on every bench workload (``profile`` None: detected); its
    exit code."""
    quiet_vllm()
    version = vllm_or_exit("bench")
    if version is None:
        return 2
    profile, how = choose_profile(profile)
    modes = ("reference", "live", "lockstep")
    print(
        f"dualbudget bench: vLLM {version}, profile {profile} ({how}), median of {repeat} runs"
        " per mode",
        flush=True,
    )
    totals = {mode: [0, 0.0] for mode in modes}
    rows = []
    for scenario in bench_workloads(profile):
        stream = _record_events(scenario)
        method = workload_method(scenario)
        runs: dict[str, list[float]] = {mode: [] for mode in modes}
        # Interleaved, so that a slow spell of the machine falls on every mode alike.
        for _ in range(repeat):
            for mode in modes:
                try:
                    runs[mode].append(_time_stream(scenario, profile, mode, stream))
                except _Diverged as diverged:
                    print(
                        f"dualbudget bench: {method}: vLLM diverges from the reference {profile}"
                        f" {diverged} ({mode} run; dualbudget fuzz finds and reports it)",
                        file=sys.stderr,
                    )
                    return 1
        timings = {}
        for mode in modes:
            elapsed = statistics.median(runs[mode])
            timings[mode] = len(stream) / elapsed
            totals[mode][0] += len(stream)
            totals[mode][1] += elapsed
        rows.append((method, len(stream), timings))
        print(
            f"  {method:<12} {len(stream):>5} steps: reference {timings['reference']:>9.0f}/s"
            f"  live {timings['live']:>7.0f}/s  lockstep {timings['lockstep']:>7.0f}/s"
            f"  ratio {timings['reference'] / timings['live']:.1f}x",
            flush=True,
        )
    rates = {mode: n / t for mode, (n, t) in totals.items()}
    out = {
        "vllm_version": version,
        "profile": profile,
        "repeat": repeat,
        "reference_steps_per_s": round(rates["reference"], 1),
        "live_steps_per_s": round(rates["live"], 1),
        "lockstep_steps_per_s": round(rates["lockstep"], 1),
        "ratio": round(rates["reference"] / rates["live"], 2),
        "workloads": [
            {"method": m, "steps": n, **{f"{k}_steps_per_s": round(v, 1) for k, v in t.items()}}
            for m, n, t in rows
        ],
    }
    print(
        f"all: reference {out['reference_steps_per_s']}/s, live {out['live_steps_per_s']}/s,"
        f" lockstep {out['lockstep_steps_per_s']}/s, ratio reference/live {out['ratio']}x"
        f" (target >= {BENCH_TARGET_RATIO}x)"
    )
    write_json(json_path, out)
    return 0
