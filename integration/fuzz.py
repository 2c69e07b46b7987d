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
import multiprocessing
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Semaphore
from pathlib import Path

from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import LAYOUT_NAMES, layout_named

from .aims import AIMS, machine_for
from .coverage import EVENTS
from .lockstep import Divergence, DivergenceFound
from .outcome import FindingKey, FuzzResult, TimeUp, UnitRun, never_cancelled

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


@contextlib.contextmanager
def _without_source_constants() -> Iterator[None]:
    """Hypothesis draws, one time in twenty, a literal of the *local* modules the process
    has loaded (``hypothesis.internal.conjecture.providers``, Hypothesis 6.148). Left on,
    a seed's examples would depend on which of the project's modules a process imported so
    far and on every literal in them: a worker process, the order of the units, or an
    edit anywhere in the project would change the run. Off while the fuzz runs, so that a
    unit's examples depend on its seed alone."""
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    saved = providers._get_local_constants
    providers._get_local_constants = Constants  # an empty pool
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = saved
        providers.CONSTANTS_CACHE.cache.clear()


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
    with use_scheduler_class(cls), _without_source_constants():
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
    from .live import LiveScheduler, Unsupported

    start = time.monotonic()
    for layout in layouts:
        config = EngineConfig(
            max_num_batched_tokens=32,
            max_num_seqs=4,
            max_model_len=64,
            block_size=16,
            num_gpu_blocks=16,
            speculative_config=SpeculativeConfig.for_layout(layout_named(layout), 2),
        )
        with contextlib.suppress(Unsupported):
            LiveScheduler(config)
    return time.monotonic() - start


# -- worker processes -----------------------------------------------------------------------
WORKER_START_SECONDS = 900
"""A worker that has not imported vLLM and built every method by then is taken as lost."""

_worker_cancel: SynchronizedArray[int] | None = None
"""In a worker: the shared (run id, unit index) of the first unit that stopped a run."""


def _init_worker(layouts: list[str], cancel: SynchronizedArray[int], ready: Semaphore) -> None:
    global _worker_cancel
    _worker_cancel = cancel
    from .live import quiet_vllm

    quiet_vllm()
    warm_up(layouts)
    ready.release()


def _run_in_worker(plan: UnitPlan) -> UnitRun:
    cancel = _worker_cancel
    assert cancel is not None, "run only in a worker started by FuzzWorkers"

    def cancelled() -> bool:
        # An earlier unit of this run stopped it: this unit's result will be dropped.
        return bool(cancel[0] == plan.run_id and plan.index > cancel[1])

    return run_unit(plan, cancelled)


class FuzzWorkers:
    """``jobs`` worker processes, each warmed up (``warm_up``) for ``layouts``, that run
    units of any number of fuzz runs (``run_fuzz(..., workers=...)``), e.g. one per mutant.

    The processes come from a ``forkserver`` that has imported vLLM once: vLLM's import
    starts threads, and a fork of the main process holding them is not safe, while a
    fork of the single-threaded server is. Measured on 2 cores, 200 examples, 2 jobs:
    ``spawn`` pays vLLM's import in every worker (51 s of warm-up, 124 s in all), the
    forkserver once (12 s of warm-up, 52 s in all; 64 s with one job, in process)."""

    def __init__(self, jobs: int, layouts: Sequence[str] = LAYOUT_NAMES) -> None:
        from .live import quiet_vllm, set_environment

        set_environment()  # before the server's import of vLLM: it inherits the environment
        quiet_vllm()
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(
            ["dualbudget.integration.fuzz", "vllm.config", "vllm.v1.core.sched.scheduler"]
        )
        self.jobs = jobs
        self._cancel = context.Array("q", [-1, -1])
        self._runs = 0
        ready = context.Semaphore(0)
        start = time.monotonic()
        self._pool = context.Pool(
            jobs, initializer=_init_worker, initargs=(list(layouts), self._cancel, ready)
        )
        for _ in range(jobs):
            if not ready.acquire(timeout=WORKER_START_SECONDS):
                self.close()
                raise RuntimeError(f"a fuzz worker did not start in {WORKER_START_SECONDS}s")
        self.warm_up_seconds = time.monotonic() - start

    def run(self, plans: list[UnitPlan]) -> Iterator[UnitRun]:
        """Each plan's run, in plan order; after a run that stopped (``stopped``), the
        later units are told to stop at their next example and are not yielded."""
        self._runs += 1
        plans = [replace(plan, run_id=self._runs) for plan in plans]
        stopped = False
        for plan, run in zip(plans, self._pool.imap(_run_in_worker, plans), strict=True):
            if stopped:
                continue  # drained, so that the workers are free for the next run
            yield run
            if run.stopped:
                stopped = True
                with self._cancel.get_lock():
                    self._cancel[0], self._cancel[1] = plan.run_id, plan.index

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()

    def __enter__(self) -> FuzzWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_fuzz(
    *,
    profile: str,
    vllm_version: str,
    examples: int,
    seed: int,
    out_dir: str | Path,
    known_findings: frozenset[FindingKey],
    max_seconds: float | None = None,
    layouts: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    scheduler_cls: str | None = None,
    jobs: int = 1,
    workers: FuzzWorkers | None = None,
    top_up_rounds: int = 0,
) -> FuzzResult:
    """``examples`` shared out over ``layouts`` and ``AIMS`` (``shares``), one Hypothesis
    run per unit, merged in unit order; ``known_findings`` are the (profile, layout,
    contract) breaks that do not stop the run. ``scheduler_cls`` (an import path) replaces
    vLLM's ``Scheduler`` in every live scheduler built. ``jobs`` > 1 runs the units in
    that many worker processes (or ``workers``, kept by the caller across runs).

    Then up to ``top_up_rounds`` rounds: round r reruns, with a seed of its own and
    ``2**r`` times its planned count of examples, every unit whose aim draws a required
    event that a method still has at zero (``top_up_units``); a run whose planned units
    covered everything runs none, so its totals are the planned units' alone. Each rerun
    is named in ``examples_by_unit`` (``layout/aim-top-up<r>``), and its examples count
    in the totals.

    With ``max_seconds``, unit ``i`` of ``n`` starts no example after ``start +
    max_seconds * (i + 1) / n`` but its first (the time a unit leaves unused passes to
    the next), so every unit gets a turn whatever the count of examples asked; a run cut
    by time is no longer reproducible by its seed alone, and says so (``stopped_by_time``).
    """
    result = FuzzResult(profile=profile, vllm_version=vllm_version)
    layouts = list(layouts or LAYOUT_NAMES)
    own_workers = workers is None and jobs > 1
    if own_workers:
        workers = FuzzWorkers(jobs, layouts)
    try:
        if workers is not None:
            result.warm_up_seconds = workers.warm_up_seconds
            what = f"{workers.jobs} processes, each:"
        else:
            result.warm_up_seconds = warm_up(layouts)
            what = "its"
        if progress:
            progress(
                f"  vLLM warm-up ({what} import, one build per method):"
                f" {result.warm_up_seconds:.1f}s, not counted in the time of the fuzz"
            )
        start = time.monotonic()
        units = shares(examples, layouts)
        plans = [
            UnitPlan(
                index=index,
                profile=profile,
                layout=layout,
                aim=aim,
                examples=count,
                seed=seed,
                out_dir=str(out_dir),
                known_findings=known_findings,
                scheduler_cls=scheduler_cls,
                deadline=start + max_seconds * (index + 1) / len(units) if max_seconds else None,
            )
            for index, (layout, aim, count) in enumerate(units)
        ]
        _run_plans(plans, workers, result, progress, start)
        planned = {(plan.layout, plan.aim): plan for plan in plans}
        for top_up_round in range(1, top_up_rounds + 1):
            gaps = [] if result.stopped or result.stopped_by_time else top_up_units(result, layouts)
            if not gaps:
                break
            if progress:
                progress(
                    f"  top-up round {top_up_round}: required events at zero for"
                    f" {', '.join(result.zero_coverage(layouts))}; rerunning"
                    f" {', '.join(f'{layout}/{aim}' for layout, aim in gaps)}"
                )
            reruns = []
            for index, (layout, aim) in enumerate(gaps):
                # A unit too small a run left out counts as one planned example.
                plan = planned.get((layout, aim)) or replace(
                    plans[0], layout=layout, aim=aim, examples=1
                )
                reruns.append(
                    replace(
                        plan,
                        index=len(plans) + index,
                        examples=plan.examples * 2**top_up_round,
                        top_up_round=top_up_round,
                        deadline=start + max_seconds if max_seconds else None,
                    )
                )
            plans += reruns
            _run_plans(reruns, workers, result, progress, start)
        result.seconds = time.monotonic() - start
    finally:
        if own_workers and workers is not None:
            workers.close()
    return result


def _run_plans(
    plans: list[UnitPlan],
    workers: FuzzWorkers | None,
    result: FuzzResult,
    progress: Callable[[str], None] | None,
    start: float,
) -> None:
    """Run ``plans`` (in ``workers``, or here) and merge each into ``result`` in order,
    with its progress line; stop at the first unit that stops the run."""
    runs = workers.run(plans) if workers is not None else _run_here(plans)
    for run in runs:
        for finding in result.merge(run):
            if progress:
                tag = "known finding" if finding.known else "FINDING"
                progress(
                    f"{tag}: {finding.contract} under {finding.profile} with"
                    f" {finding.layout} at step {finding.step}: {finding.message}"
                    f" (scenario {finding.scenario_path})"
                )
        if progress:
            progress(
                f"  {run.unit_name:<24} {run.examples:>4} examples"
                f" {run.steps:>6} steps {run.seconds:>6.1f}s"
                f"  (total {result.examples} examples, {result.steps} steps,"
                f" {len(result.divergences)} divergences, {time.monotonic() - start:.0f}s)"
            )
        if result.stopped:
            break


def _run_here(plans: list[UnitPlan]) -> Iterator[UnitRun]:
    for plan in plans:
        run = run_unit(plan)
        yield run
        if run.stopped:
            return


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
    workers: FuzzWorkers | None = None,
) -> tuple[Divergence | None, FuzzResult]:
    """Fuzz ``scheduler_cls`` (an import path; None: vLLM's own) against ``profile`` until
    the first divergence: (that divergence or None, the run's result). An unknown
    finding also stops the run; it is in the result, with no divergence."""
    from .live import require_vllm

    result = run_fuzz(
        profile=profile,
        vllm_version=require_vllm(),
        examples=examples,
        seed=seed,
        out_dir=out_dir,
        known_findings=known_findings,
        layouts=layouts,
        scheduler_cls=scheduler_cls,
        jobs=jobs,
        workers=workers,
    )
    return (result.divergences[0] if result.divergences else None), result
