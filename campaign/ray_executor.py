"""The Ray side of the executor seam: warm actors, on a local Ray or a cluster.

``RayExecutor(address, jobs)`` connects to ``address`` (``ray.init(address)``; ``auto``:
the cluster ``ray start --head`` left up on this machine); with no address, to the
cluster ``RAY_ADDRESS`` names, or else it starts a local Ray for the run, with no
dashboard and no usage report, so that it starts without network access. Each of its ``jobs``
actors (0: one per CPU of the cluster) runs the initializer once, so a worker stays warm
across units and across ``map`` calls (a mutate run's many fuzzes). A task lost with its
actor (a killed worker process, a lost node) is retried by Ray on the restarted actor;
the driver counts a unit when its result arrives, so a retried unit counts once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .unit import (
    RETRIES,
    ExecutorUnavailable,
    UnitFailed,
    UnitStream,
    WorkerMismatch,
    _call,
    _ids,
)

WORKER_START_SECONDS = 900
"""A worker that has not imported vLLM and run its warm-up by then is taken as lost (a
cluster without a free CPU never starts it)."""
QUIET_ENVIRONMENT = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DISABLE_IMPORT_WARNING": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}
"""Set before Ray starts: no usage report (it would reach for the network)."""


def _ray() -> Any:
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    try:
        import ray
    except ImportError:
        raise ExecutorUnavailable(
            "Ray is not installed here (requirements/vllm-*.lock pin it)"
        ) from None
    return ray


def start_ray(address: str | None, num_cpus: int | None = None) -> Any:
    """Connect to ``address`` (``auto``: the cluster ``ray start`` left up here); None:
    the cluster ``RAY_ADDRESS`` names, else a local Ray for this run (of ``num_cpus``,
    default every core)."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    if address is not None:
        try:
            ray.init(address=address, **options)
        except Exception as err:
            raise ExecutorUnavailable(f"cannot join the Ray cluster at {address}: {err}") from None
        return ray
    try:
        if os.environ.get("RAY_ADDRESS"):
            ray.init(**options)  # Ray's own variable: the cluster it names
        else:
            # Not "auto": that joins any Ray up on this machine, another run's local
            # one included, whose CPUs its own actors hold.
            ray.init(address="local", num_cpus=num_cpus, **options)
    except Exception as err:
        raise ExecutorUnavailable(f"Ray did not start: {err}") from None
    return ray


class _Worker:
    """One warm worker: the initializer at start, then units; the stop mark read from the
    driver's board actor (cached briefly: a unit reads it once per example)."""

    def __init__(
        self,
        initializer: Callable[..., object] | None,
        initargs: tuple[Any, ...],
        board: Any,
    ) -> None:
        from . import unit

        unit.board = _RayBoard(board)
        if initializer is not None:
            initializer(*initargs)

    def fingerprint(self, fn: Callable[[], str] | None) -> str:
        return fn() if fn is not None else ""

    def run(self, fn: Callable[[Any], Any], run: int, index: int, unit_id: str, unit: Any) -> Any:
        try:
            return ("ok", _call(fn, run, index, unit_id, unit))
        except UnitFailed as err:
            return ("failed", err.message)


class _RayBoard:
    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.value = (-1, -1)
        self.read_at = 0.0

    def read(self) -> tuple[int, int]:
        now = time.monotonic()
        if now - self.read_at > 0.5:
            ray = _ray()
            run, index = ray.get(self.actor.read.remote())
            self.value = (int(run), int(index))
            self.read_at = now
        return self.value


class _BoardActor:
    def __init__(self) -> None:
        self.mark = (-1, -1)

    def set(self, run: int, index: int) -> None:
        self.mark = (run, index)

    def read(self) -> tuple[int, int]:
        return self.mark


class RayExecutor:
    def __init__(
        self,
        address: str | None,
        jobs: int = 0,
        *,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        fingerprint: Callable[[], str] | None = None,
        retries: int = RETRIES,
    ) -> None:
        start = time.monotonic()
        ray = start_ray(address)
        self._ray = ray
        self.width = jobs or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._board = ray.remote(num_cpus=0)(_BoardActor).remote()
        worker = ray.remote(num_cpus=1, max_restarts=retries, max_task_retries=retries)(_Worker)
        self._workers = [
            worker.remote(initializer, initargs, self._board) for _ in range(self.width)
        ]
        expected = fingerprint() if fingerprint is not None else ""
        try:
            seen = ray.get(
                [w.fingerprint.remote(fingerprint) for w in self._workers],
                timeout=WORKER_START_SECONDS,
            )
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise ExecutorUnavailable(
                f"{self.width} Ray workers did not start in {WORKER_START_SECONDS}s"
                f" (the cluster has {ray.available_resources().get('CPU', 0)} CPUs free)"
            ) from None
        for got in seen:
            if got != expected:
                self.close()
                raise WorkerMismatch(f"a Ray worker has {got}, the driver {expected}")
        self._runs = 0
        self.warm_up_seconds = time.monotonic() - start

    def map(
        self,
        fn: Callable[[Any], Any],
        units: Sequence[Any],
        ids: Sequence[str] | None = None,
        on_done: Callable[[int, Any], None] | None = None,
    ) -> UnitStream[Any]:
        self._runs += 1
        run, names = self._runs, _ids(units, ids)
        stopped = [len(units)]

        def stop(index: int) -> None:
            stopped[0] = min(stopped[0], index)
            self._ray.get(self._board.set.remote(run, index))

        return UnitStream(self._stream(fn, units, names, run, on_done, stopped), stop)

    def _stream(
        self,
        fn: Callable[[Any], Any],
        units: Sequence[Any],
        names: list[str],
        run: int,
        on_done: Callable[[int, Any], None] | None,
        stopped: list[int],
    ) -> Iterator[Any]:
        ray = self._ray
        idle = list(self._workers)
        queue = list(range(len(units)))
        pending: dict[Any, tuple[int, Any]] = {}
        done: dict[int, Any] = {}
        failed: dict[int, UnitFailed] = {}

        def feed() -> None:
            # One unit per actor at a time: a free actor takes the next unit in order.
            while idle and queue and queue[0] <= stopped[0]:
                index, worker = queue.pop(0), idle.pop()
                ref = worker.run.remote(fn, run, index, names[index], units[index])
                pending[ref] = (index, worker)

        next_index = 0
        try:
            while next_index < len(units) and next_index <= stopped[0]:
                feed()
                while next_index not in done and next_index not in failed:
                    ready, _ = ray.wait(list(pending), num_returns=1)
                    for ref in ready:
                        index, worker = pending.pop(ref)
                        idle.append(worker)
                        try:
                            status, value = ray.get(ref)
                        except ray.exceptions.RayError as err:
                            failed[index] = UnitFailed(names[index], f"lost by Ray: {err}")
                            continue
                        if status == "failed":
                            failed[index] = UnitFailed(names[index], value)
                        else:
                            done[index] = value
                            if on_done is not None and index <= stopped[0]:
                                on_done(index, value)
                    feed()
                if next_index in failed:
                    raise failed[next_index]
                yield done.pop(next_index)
                next_index += 1
        finally:
            for ref in pending:
                ray.cancel(ref)

    def close(self) -> None:
        for worker in self._workers:
            self._ray.kill(worker)
        self._workers = []

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
