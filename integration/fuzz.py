"""Stateful differential fuzzing of the live vLLM scheduler against the reference.

The examples are shared out, not drawn from one pool: every method (layout) gets its own
share, and each share is split over *aims* (``aims.AIMS``): ``mixed`` draws configs
over the whole space, the others draw configs and requests aimed at one coverage event
or one rule's boundary that a uniform draw reaches rarely (a bound input budget, a
preemption of a request already scheduled in the step, a padded decode, a long-prefill
threshold with one request alone). Each (layout, aim) unit is one Hypothesis run of its
aim's ``machine.LockstepMachine`` with its own seed derived from ``--seed``
(``unit_seed``), so a unit's examples depend on nothing but its seed: units run in any
process (``jobs``) and are merged in unit order, so any ``jobs`` gives the same result.
A run stops at the first unit, in unit order, with a divergence or an unknown finding
(a C1-C3 break not in ``known_findings``).

Coverage is counted per method (the events of ``coverage.COVERAGE``) so that a run that
never reached an event says so; ``FuzzResult.zero_coverage`` lists the (method, event)
pairs that ``coverage.required_events`` demands of the run's release still at zero.
Before the gate reads it, a run's top-up rounds rerun, each with seeds of its own, the
units whose aims draw those events (each event's row names its aim; ``top_up_units``):
a rare event left at zero by one seed's planned units is looked for again rather than
failing the run.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dualbudget.campaign.budget import spoken
from dualbudget.campaign.executor import (
    DEFAULT_EXECUTOR,
    Executor,
    ExecutorUnavailable,
    cancelled,
    executor_for,
)
from dualbudget.campaign.store import Campaign, CampaignMismatch, map_resumed
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUT_NAMES, layout_named
from dualbudget.spec.profiles import profile_named

from .aims import AIMS, machine_for
from .coverage import EVENTS
from .lockstep import Divergence, DivergenceFound
from .outcome import (
    UNIT_RESULTS_FORMAT,
    FindingKey,
    FuzzResult,
    TimeUp,
    UnitRun,
    monitor_line,
    never_cancelled,
)
from .seeded import without_source_constants
from .sources import project_digest, vllm_digest
from .vllm_api import AdapterFailure

STATEFUL_STEP_COUNT = 80
"""Rules one example runs at most (Hypothesis' ``stateful_step_count``)."""


def unit_seed(seed: int, layout: str, aim: str, top_up_round: int = 0) -> int:
    """The Hypothesis seed of one (layout, aim) unit, or of its rerun in a top-up round:
    stable across processes."""
    suffix = f"/top-up {top_up_round}" if top_up_round else ""
    return zlib.crc32(f"{seed}/{layout}/{aim}{suffix}".encode())


def top_up_units(result: FuzzResult, layouts: Sequence[str]) -> list[tuple[str, str]]:
    """The (layout, aim) units to run again for the required events still at zero, in
    unit order: each event's aim (``coverage.COVERAGE``)."""
    wanted = {(layout, EVENTS[event].aim) for layout, event in result.zero_events(layouts)}
    return [(layout, aim) for layout in layouts for aim in AIMS if (layout, aim) in wanted]


def shares(examples: int, layouts: list[str]) -> list[tuple[str, str, int]]:
    """``examples`` split into (layout, aim, n), n > 0: layouts evenly (the first ones take
    the remainder); a layout's part over ``AIMS`` by weight, each aim at least one and
    ``mixed`` the rest (one of the largest part when the weights split it exactly), or,
    for a part smaller than ``len(AIMS)``, one each in ``AIMS`` order."""
    units: list[tuple[str, str, int]] = []
    base, extra = divmod(examples, len(layouts))
    total_weight = sum(aim.weight for aim in AIMS.values())
    for i, layout in enumerate(layouts):
        share = base + (i < extra)
        parts = dict.fromkeys(AIMS, 0)
        if share < len(AIMS):
            for name in list(AIMS)[:share]:
                parts[name] = 1
        else:
            for name, aim in AIMS.items():
                if name != "mixed":
                    parts[name] = max(1, share * aim.weight // total_weight)
            rest = share - sum(parts.values())
            largest = max(parts, key=parts.__getitem__)
            if rest == 0 and parts[largest] > 1:
                # The weights split the share exactly: mixed takes one of the largest part.
                parts[largest] -= 1
                parts["mixed"] = 1
            elif rest < 1:
                # The weights' floors of one took it all: one each, the rest to mixed.
                parts = dict.fromkeys(AIMS, 1)
                parts["mixed"] = share - (len(AIMS) - 1)
            else:
                parts["mixed"] = rest
        units += [(layout, name, n) for name, n in parts.items() if n > 0]
    return units


@dataclass(frozen=True)
class UnitPlan:
    """One (layout, aim) unit of a run, everything a worker process needs to run it."""

    index: int
    profile: str
    layout: str
    aim: str
    examples: int
    seed: int
    out_dir: str
    known_findings: frozenset[FindingKey]
    scheduler_cls: str | None
    """An import path (``module:Class`` or ``module.Class``), resolved in the process."""
    deadline: float | None = None
    """``time.monotonic()`` after which the unit starts no example but its first (Linux's
    monotonic clock is the machine's, the same in every worker process)."""
    run_id: int = 0
    stateful_step_count: int = STATEFUL_STEP_COUNT
    top_up_round: int = 0
    """0: the planned unit; r >= 1: its rerun, with its own seed, in top-up round r."""
    monitor_only: bool = False
    """The live scheduler alone, judged by the contract monitor only."""


def run_unit(plan: UnitPlan, cancelled: Callable[[], bool] | None = None) -> UnitRun:
    """One Hypothesis run of ``plan.examples`` examples for one (layout, aim)."""
    import hypothesis
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis.errors import Unsatisfiable
    from hypothesis.stateful import run_state_machine_as_test

    from .live import scheduler_class, use_scheduler_class

    run = UnitRun(
        plan.profile,
        plan.layout,
        plan.aim,
        plan.seed,
        Path(plan.out_dir),
        plan.known_findings,
        deadline=plan.deadline,
        top_up_round=plan.top_up_round,
        monitor_only=plan.monitor_only,
    )
    if cancelled is not None:
        run.cancelled = cancelled
    seed = unit_seed(plan.seed, plan.layout, plan.aim, plan.top_up_round)
    machine = hypothesis.seed(seed)(machine_for(run))
    unit_settings = settings(
        max_examples=plan.examples,
        stateful_step_count=plan.stateful_step_count,
        deadline=None,
        database=None,
        derandomize=False,
        # The first divergence stops the run: no shrinking, no replay of old failures.
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        # Divergences and findings are reported by this module, with their scenario files;
        # Hypothesis' own print of the failing rule sequence would only repeat them.
        verbosity=Verbosity.quiet,
    )
    start = time.monotonic()
    cls = scheduler_class(plan.scheduler_cls) if plan.scheduler_cls else None
    with use_scheduler_class(cls), without_source_constants():
        try:
            # Hypothesis leaves this one function unannotated.
            run_state_machine_as_test(machine, settings=unit_settings)  # type: ignore[no-untyped-call]
        except (DivergenceFound, TimeUp, Unsatisfiable):
            pass
        except AssertionError:
            if not run.unknown_findings:
                raise
        except Exception:
            # Hypothesis re-runs a failing example to report it; the re-run stops early
            # (the run is over) and Hypothesis calls that flaky. Keep what was found.
            if not (run.stopped or run.stopped_by_time or run.cancelled()):
                raise
    run.seconds = time.monotonic() - start
    run.cancelled = never_cancelled  # a plain function again: the run is pickled back
    return run


def warm_up(layouts: Iterable[str]) -> float:
    """Pay vLLM's one-off costs before the clock of the fuzz starts: its import and the
    first build of each method (vLLM inspects every model architecture once per process,
    seconds each). Returns the seconds spent. A build vLLM refuses is left to the fuzz."""
    from .live import LiveScheduler, Unsupported, small_config

    start = time.monotonic()
    for layout in layouts:
        with contextlib.suppress(Unsupported):
            LiveScheduler(small_config(layout_named(layout)))
    return time.monotonic() - start


# -- workers -------------------------------------------------------------------------------
PRELOAD = ("dualbudget.integration.fuzz", "vllm.config", "vllm.v1.core.sched.scheduler")
"""What a local executor's forkserver imports once, before it forks the workers."""


def vllm_fingerprint() -> str:
    """The installed vLLM's version and a hash of its Python (``sources.vllm_digest``):
    what every worker of a run must share with the driver
    (``campaign.executor.WorkerMismatch``), and what a kept campaign's results hold for."""
    from .live import require_vllm

    version = require_vllm()
    import vllm

    digest = vllm_digest(Path(vllm.__file__).parent)
    return f"vLLM {version} (sources {digest[:12]})"


def warm_worker(layouts: list[str]) -> None:
    """A worker's start: vLLM's environment and quiet logging, then ``warm_up``."""
    from .live import quiet_vllm, set_environment

    set_environment()
    quiet_vllm()
    # The driver named any adapter failure before it started workers (probe_adapter);
    # a worker's warm-up never ends its pool.
    with contextlib.suppress(AdapterFailure):
        warm_up(layouts)


def fuzz_executor(
    jobs: int,
    layouts: Sequence[str] = LAYOUT_NAMES,
    executor: str = DEFAULT_EXECUTOR,
    ray_address: str | None = None,
) -> Executor:
    """Warm workers (``warm_worker``) for ``layouts`` that run units of any number of
    fuzz runs (``run_fuzz(..., executor=...)``), e.g. one per mutant.

    Local workers come from a ``forkserver`` that has imported vLLM once: vLLM's import
    starts threads, and a fork of the main process holding them is not safe, while a
    fork of the single-threaded server is. Measured on 2 cores, 200 examples, 2 jobs:
    ``spawn`` pays vLLM's import in every worker (51 s of warm-up, 124 s in all), the
    forkserver once (12 s of warm-up, 52 s in all; 64 s with one job, in process).

    A Ray worker whose vLLM differs from this process's (``vllm_fingerprint``), or a
    missing Ray, is bad input naming ``--executor``."""
    from .live import set_environment

    set_environment()  # before the server's import of vLLM: it inherits the environment
    try:
        return executor_for(
            executor,
            jobs,
            ray_address,
            initializer=warm_worker,
            initargs=(list(layouts),),
            start_method="forkserver",
            preload=PRELOAD,
            fingerprint=vllm_fingerprint,
        )
    except ExecutorUnavailable as err:
        raise BadInput(f"--executor {executor}: {err}") from None


def run_plan(plan: UnitPlan) -> UnitRun:
    """One unit in a worker: told to stop when an earlier unit of its run stopped it."""
    return run_unit(plan, cancelled)


@dataclass(frozen=True)
class FuzzPlan:
    """One fuzz run: what it checks, how much, where its units run and what it keeps.

    ``examples`` are shared out over ``layouts`` (every method the profile's release
    builds when None) and ``AIMS`` (``shares``), one Hypothesis run per unit, merged in
    unit order; ``known_findings`` are the (profile, layout, contract) breaks that do not
    stop the run. ``scheduler_cls`` (an import path) replaces vLLM's ``Scheduler`` in
    every live scheduler built. ``monitor_only``: the live scheduler alone, judged by the
    contract monitor only (``monitor_run``), no reference. The units run on ``jobs``
    workers of ``executor_name`` (on ``ray_address``) unless the caller hands
    ``run_fuzz`` an executor of its own.

    Then up to ``top_up_rounds`` rounds: round r reruns, with a seed of its own and
    ``2**r`` times its planned count of examples, every unit whose aim draws a required
    event that a method still has at zero (``top_up_units``); a run whose planned units
    covered everything runs none, so its totals are the planned units' alone. Each rerun
    is named in ``examples_by_unit`` (``layout/aim-top-up<r>``), and its examples count
    in the totals.

    With ``campaign`` (a directory, ``campaign.store``), every finished unit's result is
    kept there as it finishes and a unit already kept is not run again, so a rerun after
    a kill resumes; divergence scenarios go to its ``scenarios/`` instead of ``out_dir``.

    With ``max_seconds``, unit ``i`` of ``n`` starts no example after ``start +
    max_seconds * (i + 1) / n`` but its first (the time a unit leaves unused passes to
    the next), so every unit gets a turn whatever the count of examples asked; a run cut
    by time is no longer reproducible by its seed alone, and says so (``stopped_by_time``).

    With ``budget_seconds`` (and ``campaign``, which it needs): ``draw_for`` instead of
    one seed's units, no top-up rounds; the result is every unit kept in the campaign,
    merged (``merge_campaign``).
    """

    profile: str
    vllm_version: str
    examples: int
    seed: int
    out_dir: str | Path
    known_findings: frozenset[FindingKey]
    layouts: Sequence[str] | None = None
    scheduler_cls: str | None = None
    monitor_only: bool = False
    max_seconds: float | None = None
    top_up_rounds: int = 0
    campaign: str | Path | None = None
    budget_seconds: float | None = None
    jobs: int = 1
    executor_name: str = DEFAULT_EXECUTOR
    ray_address: str | None = None

    def methods(self) -> list[str]:
        """The methods fuzzed: those named, else every one the profile's release builds."""
        return list(self.layouts or profile_named(self.profile).release.layouts)

    def scenarios_dir(self) -> str:
        """Where divergence scenarios go: the campaign's ``scenarios/``, else ``out_dir``."""
        if self.campaign is not None:
            return str(Path(self.campaign) / "scenarios")
        return str(self.out_dir)

    def units(
        self, unit_seed: int, deadline_of: Callable[[int, int], float | None]
    ) -> list[UnitPlan]:
        """The units of one seed; ``deadline_of(index, count)``: unit ``index``'s."""
        units = shares(self.examples, self.methods())
        return [
            UnitPlan(
                index=index,
                profile=self.profile,
                layout=layout,
                aim=aim,
                examples=count,
                seed=unit_seed,
                out_dir=self.scenarios_dir(),
                known_findings=self.known_findings,
                scheduler_cls=self.scheduler_cls,
                monitor_only=self.monitor_only,
                deadline=deadline_of(index, len(units)),
            )
            for index, (layout, aim, count) in enumerate(units)
        ]


def _kept_campaign(plan: FuzzPlan) -> Campaign | None:
    """The campaign ``plan`` keeps its units in, opened under the key of what decides a
    unit's result (None without one)."""
    if plan.campaign is None:
        return None
    # A monitor-only unit checks less than a lockstep one: the two never share a DIR.
    mode = "monitor only" if plan.monitor_only else "lockstep"
    key = (
        f"fuzz of {vllm_fingerprint()}, profile {plan.profile}, scheduler"
        f" {plan.scheduler_cls}, {mode}, unit results v{UNIT_RESULTS_FORMAT},"
        f" dualbudget {project_digest()[:12]}"
    )
    try:
        return Campaign(plan.campaign, key)
    except CampaignMismatch as err:
        raise BadInput(f"--campaign: {err}") from None


def run_fuzz(
    plan: FuzzPlan,
    *,
    executor: Executor | None = None,
    progress: Callable[[str], None] | None = None,
) -> FuzzResult:
    """Run ``plan`` (``FuzzPlan`` says how) on ``executor`` (kept by the caller across
    runs), or on a ``fuzz_executor`` of the plan's workers started for the run."""
    require_campaign(plan.budget_seconds, plan.campaign)
    result = FuzzResult(
        profile=plan.profile, vllm_version=plan.vllm_version, monitor_only=plan.monitor_only
    )
    layouts = plan.methods()
    kept = _kept_campaign(plan)
    own_executor = executor is None
    if executor is None:
        executor = fuzz_executor(plan.jobs, layouts, plan.executor_name, plan.ray_address)
    try:
        result.warm_up_seconds = executor.warm_up_seconds
        what = f"{executor.width} workers, each:" if executor.width > 1 else "its"
        if progress:
            progress(
                f"  vLLM warm-up ({what} import, one build per method):"
                f" {result.warm_up_seconds:.1f}s, not counted in the time of the fuzz"
            )
        start = time.monotonic()
        if plan.budget_seconds is not None and kept is not None:
            return draw_for(
                plan.budget_seconds,
                lambda unit_seed, deadline: plan.units(unit_seed, lambda _, __: deadline),
                plan.seed,
                executor,
                kept,
                result,
                layouts,
                progress,
            )
        max_seconds = plan.max_seconds
        plans = plan.units(
            plan.seed,
            lambda index, count: start + max_seconds * (index + 1) / count if max_seconds else None,
        )
        _run_plans(plans, executor, kept, result, progress, start)
        _top_up(plan, plans, executor, kept, result, progress, start)
        result.seconds = time.monotonic() - start
    finally:
        if own_executor:
            executor.close()
        if kept is not None:
            kept.close()
    return result


def _top_up(
    plan: FuzzPlan,
    plans: list[UnitPlan],
    executor: Executor,
    kept: Campaign | None,
    result: FuzzResult,
    progress: Callable[[str], None] | None,
    start: float,
) -> None:
    """The top-up rounds of ``plan`` after its planned units ``plans`` ran
    (``FuzzPlan``): each reruns the units whose aim draws an event still at zero."""
    layouts = plan.methods()
    planned = {(unit.layout, unit.aim): unit for unit in plans}
    ran = len(plans)
    for top_up_round in range(1, plan.top_up_rounds + 1):
        gaps = [] if result.stopped or result.stopped_by_time else top_up_units(result, layouts)
        if not gaps:
            return
        if progress:
            progress(
                f"  top-up round {top_up_round}: required events at zero for"
                f" {', '.join(result.zero_coverage(layouts))}; rerunning"
                f" {', '.join(f'{layout}/{aim}' for layout, aim in gaps)}"
            )
        reruns = []
        for index, (layout, aim) in enumerate(gaps):
            # A unit too small a run left out counts as one planned example.
            unit = planned.get((layout, aim)) or replace(
                plans[0], layout=layout, aim=aim, examples=1
            )
            reruns.append(
                replace(
                    unit,
                    index=ran + index,
                    examples=unit.examples * 2**top_up_round,
                    top_up_round=top_up_round,
                    deadline=start + plan.max_seconds if plan.max_seconds else None,
                )
            )
        ran += len(reruns)
        _run_plans(reruns, executor, kept, result, progress, start)


def require_campaign(budget_seconds: float | None, campaign: str | Path | None) -> None:
    """A budget draws seeds until it is spent, which only a campaign keeps: bad input
    without one (checked before any worker starts)."""
    if budget_seconds is not None and campaign is None:
        raise BadInput("--budget needs --campaign DIR, where the campaign keeps its units")


def draw_for(
    budget_seconds: float,
    plans_of: Callable[[int, float], list[UnitPlan]],
    first_seed: int,
    executor: Executor,
    campaign: Campaign,
    result: FuzzResult,
    layouts: Sequence[str],
    progress: Callable[[str], None] | None,
    unit: Callable[[UnitPlan], UnitRun] = run_plan,
    clock: Callable[[], float] = time.monotonic,
) -> FuzzResult:
    """A campaign with a time budget: seed after seed from ``first_seed``, each seed's
    units (``plans_of(seed, deadline)``: every layout and aim, round-robin) until
    ``budget_seconds`` are spent; then the units still running are told to stop at
    their next example, and what they ran is kept. A divergence stops its own unit
    only: the campaign goes on with the others. A seed whose units ``campaign`` holds
    already costs nothing, so a rerun with the same campaign runs the units a kill or
    the last budget left undone, then draws new seeds. Returns every unit kept in the
    campaign, merged (``merge_campaign``): this run's and the earlier ones'.

    Each ``map`` takes ``seeds_per_map`` seeds, enough for two units per worker: a
    worker that finishes waits for the map's last unit, so a map of one seed's units
    would leave most of a cluster wider than a seed idle.

    ``clock`` reads the time the budget is spent against: a test gives one that counts
    its calls, so that how many seeds a budget reaches does not hang on the machine's
    load."""
    start = clock()
    end = start + budget_seconds
    batch = seeds_per_map(len(plans_of(first_seed, end)), executor.width)
    seed, ran = first_seed, 0
    while clock() < end:
        before = campaign.ran
        plans = [plan for s in range(seed, seed + batch) for plan in plans_of(s, end)]
        _run_plans(
            plans, executor, campaign, result, progress, start,
            unit=unit, until=end, stop_at_first=False, clock=clock,
        )  # fmt: skip
        ran += campaign.ran - before
        seed += batch
    merged = FuzzResult(
        profile=result.profile, vllm_version=result.vllm_version, monitor_only=result.monitor_only
    )
    kept = merge_campaign(campaign, merged, layouts)
    merged.warm_up_seconds = result.warm_up_seconds
    merged.seconds = clock() - start
    if progress:
        progress(
            f"  campaign {campaign.directory}: budget {spoken(budget_seconds)} spent on seeds"
            f" {first_seed}..{seed - 1}: {ran} units run now, {kept} units kept in all"
            f" ({merged.examples} examples, {len(merged.divergences)} divergences)"
        )
    return merged


def seeds_per_map(units_per_seed: int, width: int) -> int:
    """Seeds of a budget campaign's ``map`` (``draw_for``): at least two units a worker."""
    return max(1, -(-2 * max(1, width) // max(1, units_per_seed)))


def merge_campaign(campaign: Campaign, result: FuzzResult, layouts: Sequence[str]) -> int:
    """Merge every unit ``campaign`` keeps into ``result``, in unit order (seed, then
    layout and aim in the run's order, then top-up round), whatever order they ran in
    and whichever run ran them; returns their count."""
    layout_order = {layout: i for i, layout in enumerate(layouts)}
    aim_order = {aim: i for i, aim in enumerate(AIMS)}
    runs = [run for run in campaign.all_results().values() if isinstance(run, UnitRun)]
    runs.sort(
        key=lambda run: (
            run.seed,
            layout_order.get(run.layout, len(layout_order)),
            run.layout,
            aim_order.get(run.aim, len(aim_order)),
            run.aim,
            run.top_up_round,
        )
    )
    for run in runs:
        result.merge(run)
    return len(runs)


def _run_plans(
    plans: list[UnitPlan],
    executor: Executor,
    campaign: Campaign | None,
    result: FuzzResult,
    progress: Callable[[str], None] | None,
    start: float,
    *,
    unit: Callable[[UnitPlan], UnitRun] = run_plan,
    until: float | None = None,
    stop_at_first: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Run ``plans`` (each as ``unit(plan)``) on ``executor`` and merge each into
    ``result`` in order, with its progress line; stop at the first unit that stops the
    run (``stop_at_first``), or at the first that ends after ``clock()`` passed
    ``until``: the later units are told to stop, and their results dropped."""
    ids = [unit_id(plan) for plan in plans]
    runs = map_resumed(
        executor, campaign, unit, plans, ids, asdict, "fuzz units" if progress else None
    )
    for index, run in enumerate(runs):
        monitored = len(result.monitor_findings)
        for finding in result.merge(run):
            if progress:
                tag = f"known finding {finding.manifest_key}" if finding.known else "FINDING"
                progress(
                    f"{tag}: {finding.contract} under {finding.profile} with"
                    f" {finding.layout} at step {finding.step}: {finding.message}"
                    f" (scenario {finding.scenario_path})"
                )
        if progress:
            for finding in result.monitor_findings[monitored:]:
                progress(monitor_line(finding))
            progress(
                f"  {run.unit_name:<24} {run.examples:>4} examples"
                f" {run.steps:>6} steps {run.seconds:>6.1f}s"
                f"  (total {result.examples} examples, {result.steps} steps,"
                f" {len(result.divergences)} divergences, {time.monotonic() - start:.0f}s)"
            )
        if (stop_at_first and result.stopped) or (until is not None and clock() > until):
            runs.stop_after(index)
            break


def unit_id(plan: UnitPlan) -> str:
    """A unit's name in a failure and in a campaign: what its examples depend on."""
    top_up = f"/top-up{plan.top_up_round}" if plan.top_up_round else ""
    return f"{plan.layout}/{plan.aim}{top_up}/seed{plan.seed}/{plan.examples}ex"


def first_divergence(
    *,
    profile: str,
    scheduler_cls: str | None,
    seed: int,
    examples: int,
    out_dir: str | Path,
    known_findings: frozenset[FindingKey],
    layouts: Sequence[str] | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
) -> tuple[Divergence | None, FuzzResult]:
    """Fuzz ``scheduler_cls`` (an import path; None: vLLM's own) against ``profile`` until
    the first divergence: (that divergence or None, the run's result). An unknown
    finding also stops the run; it is in the result, with no divergence."""
    from .live import require_vllm

    plan = FuzzPlan(
        profile=profile,
        vllm_version=require_vllm(),
        examples=examples,
        seed=seed,
        out_dir=out_dir,
        known_findings=known_findings,
        layouts=layouts,
        scheduler_cls=scheduler_cls,
        jobs=jobs,
    )
    result = run_fuzz(plan, executor=executor)
    return (result.divergences[0] if result.divergences else None), result
