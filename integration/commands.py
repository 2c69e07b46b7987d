"""``dualbudget fuzz`` and ``dualbudget bench``: the stages that drive the installed vLLM.

Each stage takes its typed options (``FuzzOptions``, ``BenchOptions``); the command line
(``dualbudget/``) fills them from its flags, whose defaults are the options' own. Exit
codes: 0 all agreed (and, for fuzz, every coverage counter above zero), 1 a divergence,
an unknown contract finding or zero coverage, 2 bad input (including a missing vLLM:
there is nothing to check against).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualbudget.campaign.executor import DEFAULT_EXECUTOR
from dualbudget.reference.events import Event
from dualbudget.reference.formats.scenario import Scenario
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUT_NAMES
from dualbudget.spec.profiles import profile_named

from .live import quiet_vllm
from .vllm_source import provenance, use_vllm_source

if TYPE_CHECKING:
    from .fuzz import FuzzPlan
    from .monitor import MonitorViolation
    from .outcome import FindingKey, FuzzResult

DEFAULT_OUT_DIR = "fuzz-divergences"
"""Where divergence and finding scenarios go."""
FUZZ_EXAMPLES = 200
"""The examples of a fuzz, ``dualbudget fuzz`` and ``dualbudget check`` alike: every
(method, aim) unit gets its share (``integration.fuzz.shares``); about a minute on a
2-core machine, most of it vLLM's one-off import and model inspection."""
FUZZ_TOP_UP_ROUNDS = 2
"""Top-up rounds of a fuzz, ``dualbudget fuzz`` and ``dualbudget check`` alike: a unit
whose aim draws a required event some method left at zero runs again with a fresh seed
(``integration.fuzz.run_fuzz``). At 200 examples seeds 0, 3 and 4 left one to three such
events at zero under vLLM 0.32 (seed 1 none, so its run is unchanged)."""


def write_json(path: str | Path | None, obj: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def jobs_or_cores(jobs: int | None) -> int:
    """Worker processes: ``jobs``, or one per core when None (``--jobs`` not given)."""
    return jobs or os.cpu_count() or 1


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
    """(profile, how it was chosen): ``profile`` if given, else detected; bad input when
    no profile matches (for the commands that need one: the fuzz falls back to the
    contract monitor instead, ``fuzz_profile``)."""
    found, how = detected_profile(profile)
    if found is None:
        raise BadInput(how.replace("\n", "; "))
    return found, how


def detected_profile(profile: str | None) -> tuple[str | None, str]:
    """(profile, how it was chosen): ``profile`` if given, else detected; (None, the
    detection's report) when no profile matches the scheduler's decisions."""
    from .detect import detect

    if profile:
        return profile, "--profile"
    found = detect()
    if found.profile is None:
        return None, found.report()
    return found.profile, found.how_chosen()


MONITOR_ALONE = "no profile matches: the contract monitor alone"
"""How a fuzz's profile was chosen when none matches (``fuzz_profile``)."""


class NoProfileMatches(Exception):
    """Detection found the scheduler deciding as no profile: its report and the verdict
    that names the nearest profile and where it first differs."""

    def __init__(self, report: str, verdict: str) -> None:
        super().__init__(verdict)
        self.report = report
        self.verdict = verdict


def fuzz_profile(options: FuzzOptions, version: str) -> tuple[str, str, frozenset[FindingKey]]:
    """The fuzz's profile, how it was chosen and its known findings. Where no profile
    matches, the scheduler differs from every profile detection ran: ``NoProfileMatches``
    names the nearest and its first difference, unless the user asked ``--monitor-only``,
    where the contract monitor runs alone on the configs of the installed release's profile
    (the newest release's for a version this project does not know), with no finding
    known: none of the manifest's is this scheduler's."""
    from dualbudget.spec.releases import RELEASE_VERSIONS, RELEASES, release_of

    from .detect import detect

    if options.profile:
        return options.profile, "--profile", options.known_findings
    found = detect()
    if found.profile is not None:
        return found.profile, found.how_chosen(), options.known_findings
    if not options.monitor_only:
        raise NoProfileMatches(found.report(), found.nearest_verdict())
    release = release_of(version) or RELEASES[RELEASE_VERSIONS[-1]]
    print(found.report(), flush=True)
    print(
        "dualbudget fuzz: no profile matches this scheduler's decisions: the contract"
        " monitor checks it alone (--monitor-only), on configs drawn as for"
        f" {release.profile_name}",
        flush=True,
    )
    return release.profile_name, MONITOR_ALONE, frozenset()


# -- fuzz -----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FuzzOptions:
    """One ``dualbudget fuzz`` run (``run_fuzz_stage``); its defaults are the flags'."""

    known_findings: frozenset[FindingKey]
    """(profile, layout, contract) breaks that are findings, not failures; no flag: the
    command line takes them from the proofs' manifest."""
    examples: int = FUZZ_EXAMPLES
    seed: int = 0
    jobs: int | None = None
    """Worker processes; None: one per core. Any number gives the same result."""
    profile: str | None = None
    """None: detected from the installed vLLM."""
    max_seconds: float | None = None
    json_path: str | Path | None = None
    out_dir: str | Path = DEFAULT_OUT_DIR
    """Where divergence and finding scenarios go."""
    replay: str | None = None
    """A scenario file: lockstep it alone (``replay_scenario``) instead of fuzzing."""
    layouts: tuple[str, ...] | None = None
    """The methods (method-table rows) to fuzz; None: every row the profile's release
    builds (``Release.layouts``)."""
    coverage_gate: bool = True
    """Fail on a required coverage counter left at zero."""
    scheduler_cls: str | None = None
    """An import path of a vLLM ``Scheduler`` subclass to check instead of vLLM's."""
    top_up_rounds: int = FUZZ_TOP_UP_ROUNDS
    """Rounds rerunning units for required coverage left at zero (``run_fuzz``); none
    without the coverage gate, which they serve."""
    executor: str = DEFAULT_EXECUTOR
    """Where the units run: ``local`` processes (``jobs``) or ``ray`` (docs/campaigns.md)."""
    ray_address: str | None = None
    """The Ray cluster of ``--executor ray``; None: ``RAY_ADDRESS``'s, else a local Ray."""
    campaign: str | None = None
    """A directory that keeps every finished unit (``campaign.store``): a rerun resumes."""
    budget: float | None = None
    """Seconds: draw seeds into ``campaign`` until they are spent (``fuzz.draw_for``)."""
    vllm_src: str | None = None
    """A vLLM source tree whose Python runs over the installed vLLM (``vllm_source``)."""
    monitor_only: bool = False
    """Run the live scheduler alone, judged by the contract monitor only (no reference,
    no coverage gate: the coverage counters are the reference's); also chosen when no
    profile matches the scheduler's decisions."""


def run_fuzz_stage(options: FuzzOptions) -> int:
    """The fuzz with its progress, its coverage table and its verdict; its exit code
    (with ``options.replay``: that scenario's lockstep, ``replay_scenario``)."""
    from .fuzz import require_campaign

    require_campaign(options.budget, options.campaign)
    use_vllm_source(options.vllm_src)
    if options.replay is not None:
        return replay_scenario(
            options.replay, options.profile, options.scheduler_cls, options.monitor_only
        )
    quiet_vllm()
    version = vllm_or_exit("fuzz")
    if version is None:
        return 2
    from .live import probe_adapter

    probe_adapter()  # a vLLM the adapter cannot drive is named before any check starts
    try:
        profile, how, known_findings = fuzz_profile(options, version)
    except NoProfileMatches as differs:
        return _no_profile_matches(options, version, differs)
    monitor_only = options.monitor_only or how == MONITOR_ALONE
    if options.scheduler_cls:
        from .live import scheduler_class

        scheduler_class(options.scheduler_cls)  # refused here, before any process starts
    from .fuzz import run_fuzz

    plan = _fuzz_plan(options, version, profile, how, known_findings, monitor_only)
    layouts = list(plan.layouts or ())
    result = run_fuzz(plan, progress=lambda line: print(line, flush=True))
    code, table = fuzz_verdict(result, layouts, gate=options.coverage_gate)
    origin = provenance()  # under --vllm-src: which vllm.v1.core files the run took
    if origin is not None:
        print(origin.report())
    print(table)
    verdict = table.rsplit("verdict: ", 1)[-1]
    write_json(options.json_path, {**fuzz_json(result), "verdict": verdict, "exit_code": code})
    return code


def _no_profile_matches(options: FuzzOptions, version: str, differs: NoProfileMatches) -> int:
    """A fuzz asked of a profile the installed vLLM does not decide as: the report of
    where it departs, the verdict and its JSON; exit 1."""
    print(differs.report, flush=True)
    print(f"verdict: {differs.verdict}", flush=True)
    write_json(
        options.json_path,
        {
            "vllm_version": version,
            "profile": None,
            "steps": 0,
            "verdict": differs.verdict,
            "exit_code": 1,
        },
    )
    return 1


def _fuzz_plan(
    options: FuzzOptions,
    version: str,
    profile: str,
    how: str,
    known_findings: frozenset[FindingKey],
    monitor_only: bool,
) -> FuzzPlan:
    """The fuzz the options ask of ``profile`` on ``version``, its first line printed."""
    from .fuzz import FuzzPlan

    built = profile_named(profile).release.layouts
    layouts = list(options.layouts or built)
    unbuilt = [name for name in LAYOUT_NAMES if name not in built]
    jobs = jobs_or_cores(options.jobs)
    checked = f", scheduler {options.scheduler_cls}" if options.scheduler_cls else ""
    alone = ", contract monitor alone" if monitor_only else ""
    print(
        f"dualbudget fuzz: vLLM {version}{checked}, profile {profile} ({how}){alone}, seed"
        f" {options.seed}, {options.examples} examples, layouts {', '.join(layouts)},"
        f" {jobs} job{'s' if jobs > 1 else ''}",
        flush=True,
    )
    if unbuilt and not options.layouts:
        print(f"  not fuzzed: {', '.join(unbuilt)} (the release builds no such drafter)")
    return FuzzPlan(
        profile=profile,
        vllm_version=version,
        examples=options.examples,
        seed=options.seed,
        out_dir=options.out_dir,
        known_findings=known_findings,
        max_seconds=options.max_seconds,
        layouts=layouts,
        scheduler_cls=options.scheduler_cls,
        jobs=jobs,
        executor_name=options.executor,
        ray_address=options.ray_address,
        campaign=options.campaign,
        budget_seconds=options.budget,
        # The rounds serve the gate: a run without it has nothing to top up for.
        top_up_rounds=options.top_up_rounds if options.coverage_gate else 0,
        monitor_only=monitor_only,
    )


def fuzz_json(result: FuzzResult) -> dict[str, Any]:
    return {
        "vllm_version": result.vllm_version,
        "profile": result.profile,
        "examples": result.examples,
        "steps": result.steps,
        "steps_by_method": result.steps_by_layout,
        "refusals_by_method": {
            layout: {"configs": count, "first": reason}
            for layout, (count, reason) in result.refusals_by_layout.items()
        },
        "monitor_only": result.monitor_only,
        "divergences": [d.to_json() for d in result.divergences],
        "coverage": result.totals(),
        "coverage_by_method": result.coverage,
        "constructions": {k: sorted(v) for k, v in result.constructions.items()},
        "examples_by_unit": result.examples_by_unit,
        "required_coverage": {layout: list(result.required(layout)) for layout in result.coverage},
        "stopped_by_time": result.stopped_by_time,
        "findings": [f.to_json() for f in result.findings],
        "monitor": result.monitor_json(),
        "refused_configs": result.refused_configs,
        "mirrored_crashes": result.mirrored_crashes,
        "crash_scenarios": result.crash_scenarios,
        "seconds": round(result.seconds, 2),
        "warm_up_seconds": round(result.warm_up_seconds, 2),
        **({} if (origin := provenance()) is None else {"vllm_source": origin.to_json()}),
    }


def fuzz_verdict(result: FuzzResult, layouts: list[str], *, gate: bool) -> tuple[int, str]:
    """(exit code, the coverage table and the verdict line)."""
    from .aims import AIMS
    from .coverage import COVERAGE, EVENT_NAMES
    from .outcome import LIVE_ALONE_CRASH
    from .upstream import load_crashes

    head = f"{'method':<16}{'ex':>4}{'steps':>7}" + "".join(f"{e.short:>14}" for e in COVERAGE)
    lines = ["", "coverage (events per method):", head + "  built as"]
    for layout in layouts:
        per = result.coverage.get(layout, {})
        required = result.required(layout)
        built = ", ".join(sorted(result.constructions.get(layout, set()))) or "-"
        # A count the gate does not require is shown in parentheses.
        cells = [f"{per.get(e, 0)}" if e in required else f"({per.get(e, 0)})" for e in EVENT_NAMES]
        lines.append(
            f"{layout:<16}{result.examples_by_layout.get(layout, 0):>4}"
            + f"{result.steps_by_layout.get(layout, 0):>7}"
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
        f" {result.refused_configs} configs refused by"
        + (" vLLM," if result.monitor_only else " both sides,")
        + f" {sum(result.mirrored_crashes.values())}"
        + (" crashes of vLLM alone" if result.monitor_only else " mirrored crashes")
        + (
            " (stopped by the time limit: not reproducible by the seed alone)"
            if result.stopped_by_time
            else ""
        )
    )
    for finding in result.findings:
        tag = f"known finding {finding.manifest_key}" if finding.known else "UNKNOWN FINDING"
        lines.append(
            f"{tag}: {finding.contract} ({finding.profile}, {finding.layout}) at step"
            f" {finding.step}: {finding.scenario_path}"
        )
    recorded = load_crashes()
    new_crashes = []
    for crash, count in sorted(result.mirrored_crashes.items()):
        if crash == LIVE_ALONE_CRASH:
            tag = "vLLM crashed with no reference beside it"
        elif crash in recorded:
            tag = f"mirrored crash {crash} (proofs/manifest.toml [crashes])"
        else:
            tag = f"NEW MIRRORED CRASH {crash} (not in proofs/manifest.toml [crashes])"
            new_crashes.append(crash)
        lines.append(f"{tag}: {count} examples, the first {result.crash_scenarios[crash]}")
    lines.append(result.monitor_summary())
    for divergence in result.divergences:
        lines.append(divergence.report())
    code, verdict = verdict_of(result, layouts, gate=gate, new_crashes=new_crashes)
    lines.append(f"verdict: {verdict}")
    return code, "\n".join(lines)


def first_error(result: FuzzResult) -> str:
    """The first thing that stopped an example, for a run that checked nothing."""
    from .outcome import LIVE_ALONE_CRASH

    if result.divergences:
        divergence = result.divergences[0]
        return f"{divergence.kind} at step {divergence.step}: live {divergence.live}"
    for crash, path in result.crash_scenarios.items():
        who = "vLLM" if crash == LIVE_ALONE_CRASH else f"both sides ({crash})"
        return f"{who} crashed, the first in {path}"
    if result.first_refusal:
        return f"every config refused: {result.first_refusal}"
    return "no example ran"


def verdict_of(
    result: FuzzResult, layouts: list[str], *, gate: bool, new_crashes: list[str]
) -> tuple[int, str]:
    """(exit code, the verdict's words): a pass rests on live steps checked for every
    method the run covers; a run that checked none exits 2, naming its first error."""
    from .outcome import LIVE_ALONE_CRASH

    if result.steps == 0:
        return 2, f"ERROR: nothing checked (0 live steps in {result.examples} examples): " + (
            first_error(result)
        )
    if result.divergences:
        seeds = ", ".join(str(s) for s in sorted({d.seed for d in result.divergences}, key=str))
        return 1, f"FAIL: {len(result.divergences)} divergence(s) (seed {seeds})"
    if result.unknown_findings:
        return 1, "FAIL: the reference flagged a contract break not known as a finding"
    if new_crashes:
        # vLLM fails an assertion on a config it accepts: a finding of its own, until the
        # manifest records how the engine reaches it.
        return 1, f"FAIL: vLLM fails an assertion no crash record names: {', '.join(new_crashes)}"
    alone_crashes = result.mirrored_crashes.get(LIVE_ALONE_CRASH, 0)
    if alone_crashes:
        # With no reference beside it nothing names the assertion: never mirrored.
        return 1, f"FAIL: vLLM failed on {alone_crashes} examples with no reference beside it"
    if result.unknown_monitor_findings:
        return 1, "FAIL: the contract monitor flagged a violation not known as a finding"
    unchecked, not_built, unrun = [], [], []
    for layout in layouts:
        if result.steps_by_layout.get(layout, 0):
            continue
        refused = result.refusals_by_layout.get(layout)
        examples = result.examples_by_layout.get(layout, 0)
        if not (examples or refused):
            # No example of it ran (fewer examples than methods): not a method the run
            # covers, and named as such.
            unrun.append(layout)
        elif result.monitor_only and refused and not examples:
            not_built.append(f"{layout} ({refused[1]})")
        else:
            unchecked.append(layout)
    if unchecked:
        return 1, f"FAIL: no live step checked for {', '.join(unchecked)}"
    zeros = result.zero_coverage([name for name in layouts if result.steps_by_layout.get(name)])
    if gate and zeros:
        return 1, f"FAIL: coverage at zero for {', '.join(zeros)}"
    checked = len(layouts) - len(not_built) - len(unrun)
    work = f"{result.steps} live steps of {checked} methods"
    if not_built:
        work += f"; not built by this vLLM: {'; '.join(not_built)}"
    if unrun:
        work += f"; no example ran of {', '.join(unrun)}"
    if result.monitor_only:
        return 0, f"PASS: the contract monitor found no violation outside the known ones ({work})"
    verdict = f"PASS: live vLLM and the reference agree on all {work}"
    if zeros:
        verdict += f" (coverage at zero: {', '.join(zeros)})"
    return 0, verdict


def replay_scenario(
    path: str,
    profile: str | None = None,
    scheduler_cls: str | None = None,
    monitor_only: bool = False,
) -> int:
    """``dualbudget fuzz --replay``: one scenario file in lockstep (against
    ``scheduler_cls``, a ``--scheduler-cls`` path, or vLLM's own scheduler), the contract
    monitor's violations printed beside; its exit code. ``monitor_only``: the live
    scheduler alone, failing on any violation of the monitor's."""
    from dualbudget.reference.formats.scenario import load_scenario

    from .live import scheduler_class, use_scheduler_class
    from .lockstep import MirroredCrash, run_in_lockstep
    from .monitor_run import run_alone
    from .upstream import load_crashes

    quiet_vllm()
    version = vllm_or_exit("fuzz")
    if version is None:
        return 2
    scenario = load_scenario(path)
    if profile and profile != scenario.profile:
        scenario = scenario.with_profile(profile)
    cls = scheduler_class(scheduler_cls) if scheduler_cls else None
    monitored: list[MonitorViolation] = []
    against = f", scheduler {scheduler_cls}" if scheduler_cls else ""
    if monitor_only:
        with use_scheduler_class(cls):
            steps, monitored, crash = run_alone(scenario)
        print(
            f"dualbudget fuzz --replay --monitor-only: vLLM {version}{against},"
            f" {steps} steps of {path}"
        )
        for violation in monitored:
            print(f"monitor: {violation.contract} at step {violation.step}: {violation.message}")
        if crash:
            print(f"vLLM crashed: {crash}")
        failed = bool(monitored or crash)
        print(f"verdict: {'FAIL: violation reproduced' if failed else 'PASS: no violation'}")
        return int(failed)
    both_failed = None
    with use_scheduler_class(cls):
        try:
            steps, divergence = run_in_lockstep(scenario, monitored=monitored)
        except MirroredCrash as mirrored:
            steps, divergence, both_failed = mirrored.step, None, mirrored
    print(
        f"dualbudget fuzz --replay: vLLM {version}{against}, profile {scenario.profile},"
        f" {steps} steps of {path}"
    )
    for violation in monitored:
        print(f"monitor: {violation.contract} at step {violation.step}: {violation.message}")
    if both_failed is not None:
        name = both_failed.crash
        print(f"mirrored crash {name} at step {both_failed.step}: {both_failed}")
        if name in load_crashes():
            print(f"verdict: PASS: both fail vLLM's assertion {name}, a crash record")
            return 0
        print(f"verdict: FAIL: vLLM fails an assertion no crash record names: {name}")
        return 1
    if divergence is None:
        print("verdict: PASS: no divergence")
        return 0
    divergence.scenario_path = str(path)
    print(divergence.report())
    print("verdict: FAIL: divergence reproduced")
    return 1


# -- bench ----------------------------------------------------------------------------
BENCH_SYSTEM_PROMPT_LEN = 64
"""Tokens of the system prompt every bench request's prompt starts with (four blocks of
16): with prefix caching on, as vLLM's default has it, later requests hit it."""


def bench_workloads(profile: str) -> list[Scenario]:
    """The bench's streams, each with vLLM's default ``enable_prefix_caching`` and a shared
    system prompt: every method of the table, vLLM's default async scheduling for a
    model-based drafter, and a hybrid KV layout."""
    from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, validate
    from dualbudget.reference.token_ids import segment, unique_prompt
    from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig

    # Shaped like gpt-oss + EAGLE3: a sliding window of 128 tokens beside full attention,
    # whose group holds the drafter's layers.
    hybrid = (
        KVGroup("sliding_window", 16, sliding_window=128),
        KVGroup("full_attention", 16, is_eagle_group=True),
    )

    system = segment("bench:system", BENCH_SYSTEM_PROMPT_LEN)
    requests = []
    for i in range(128):
        own = 32 + (i * 37) % 96
        requests.append(
            RequestSpec(
                str(i),
                len(system) + own,
                48 + (i * 53) % 80,
                i // 16,
                prompt_token_ids=system + unique_prompt(str(i), own),
            )
        )
    acceptance = Acceptance(fixed=None, per_position=(0.7, 0.6, 0.5, 0.4), seed=1)
    workloads = []
    for spec, async_scheduling, kv_groups in (
        (None, False, ()),
        (SpeculativeConfig("ngram", 3), False, ()),
        (SpeculativeConfig("eagle3", 4), False, ()),
        (SpeculativeConfig("dflash", 4, True), False, ()),
        (SpeculativeConfig("eagle3", 4), True, ()),
        (SpeculativeConfig("eagle3", 4), True, hybrid),
    ):
        config = EngineConfig(
            max_num_batched_tokens=512,
            max_num_seqs=64,
            max_model_len=1024,
            block_size=16,
            num_gpu_blocks=4096,
            speculative_config=spec,
            async_scheduling=async_scheduling,
            enable_prefix_caching=True,
            kv_groups=kv_groups,
        )
        workloads.append(validate(Scenario(profile, config, tuple(requests), acceptance)))
    return workloads


def workload_method(scenario: Scenario) -> str:
    """A bench workload's name: its speculative method (or ``none``), ``+async`` under
    async scheduling, ``+hybrid`` on several KV groups."""
    config = scenario.config
    spec = config.speculative_config
    name = str(spec.method) if spec else "none"
    if config.async_scheduling:
        name += "+async"
    if len(config.groups) > 1:
        name += "+hybrid"
    return name


def _record_events(scenario: Scenario) -> tuple[list[list[Event]], int]:
    """The event stream of a reference run, step by step (each list ends with the
    step's ModelOutput/DraftProposals), and how many admissions hit the prefix cache."""
    from dualbudget.reference.async_scheduler import make_scheduler
    from dualbudget.reference.runs.driver import EventDriver, drive
    from dualbudget.spec.profiles import profile_named

    reference = make_scheduler(scenario.config, profile_named(scenario.profile), check="collect")
    stream = [step.events for step in drive(EventDriver.of(scenario), reference)]
    return stream, reference.observed["prefix_hit"]


BENCH_TARGET_RATIO = 10
"""The speed the reference keeps over live vLLM, so that a fuzz is bounded by vLLM's
scheduler, not the reference's; printed beside the measured ratio, never asserted."""


class _Diverged(Exception):
    """vLLM decided otherwise than the reference whose events a bench run replays."""


def _time_stream(scenario: Scenario, profile: str, mode: str, stream: list[list[Event]]) -> float:
    """Seconds to feed ``stream`` to a fresh reference, live scheduler, or both (lockstep).

    Building the schedulers is not timed (vLLM's is built once per fuzz example, and its
    construction is not a scheduling step), nor is collecting earlier runs' garbage."""
    from dualbudget.reference.async_scheduler import make_scheduler
    from dualbudget.reference.scheduler import Scheduler
    from dualbudget.spec.profiles import profile_named

    from .live import LiveEventError, LiveScheduler

    consumers: list[Scheduler | LiveScheduler] = []
    if mode in ("reference", "lockstep"):
        consumers.append(make_scheduler(scenario.config, profile_named(profile), check="collect"))
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


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """One ``dualbudget bench`` run (``bench``); its defaults are the flags'."""

    profile: str | None = None
    """None: detected from the installed vLLM."""
    repeat: int = 7
    """Timed runs per workload and mode, interleaved; each mode's figure is the median run
    (on a shared 2-core machine single runs of one stream vary by up to 1.6x, so fewer
    runs let one slow spell move the ratio)."""
    json_path: str | None = None
    vllm_src: str | None = None
    """A vLLM source tree whose Python runs over the installed vLLM (``vllm_source``)."""


def bench(options: BenchOptions) -> int:
    """Steps/s of each mode on every bench workload; its exit code."""
    use_vllm_source(options.vllm_src)
    quiet_vllm()
    version = vllm_or_exit("bench")
    if version is None:
        return 2
    profile, how = choose_profile(options.profile)
    repeat = options.repeat
    modes = ("reference", "live", "lockstep")
    print(
        f"dualbudget bench: vLLM {version}, profile {profile} ({how}),"
        f" median of {repeat} runs per mode",
        flush=True,
    )
    totals = {mode: [0, 0.0] for mode in modes}
    rows = []
    for scenario in bench_workloads(profile):
        stream, hits = _record_events(scenario)
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
        hit_rate = hits / len(scenario.requests)
        rows.append((method, len(stream), hit_rate, timings))
        print(
            f"  {method:<20} {len(stream):>5} steps, prefix hits {hit_rate:>4.0%}:"
            f" reference {timings['reference']:>7.0f}/s  live {timings['live']:>5.0f}/s"
            f"  lockstep {timings['lockstep']:>5.0f}/s"
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
            {
                "method": m,
                "steps": n,
                "prefix_hit_rate": round(h, 3),
                "ratio": round(t["reference"] / t["live"], 2),
                **{f"{k}_steps_per_s": round(v, 1) for k, v in t.items()},
            }
            for m, n, h, t in rows
        ],
    }
    print(
        f"all: reference {out['reference_steps_per_s']}/s, live {out['live_steps_per_s']}/s,"
        f" lockstep {out['lockstep_steps_per_s']}/s, ratio reference/live {out['ratio']}x"
        f" (target >= {BENCH_TARGET_RATIO}x)"
    )
    write_json(options.json_path, out)
    return 0
