"""One seam for every command that runs independent units: local processes or Ray.

A command hands an executor a module-level function and its units (both picklable);
``Executor.map`` yields each unit's result in unit order, whatever order they finish in,
so a command's merged result is the same for any executor and any width. Three things a
fuzz needs of its workers are the seam's, not the command's:

- warm workers: ``initializer(*initargs)`` runs once in every worker (local process or
  Ray actor) before its first unit, so that vLLM's import and first builds are paid once
  per worker, not once per unit;
- an early stop: ``UnitStream.stop_after(i)`` tells the units after ``i`` of the same
  ``map`` (``cancelled()`` in a unit) that their results will be dropped;
- failures: a unit that raises is that unit's ``UnitFailed`` (carrying its id), raised
  from the stream in unit order; a worker that dies mid-unit (a killed process, a lost
  Ray node) has its unit run again, up to ``retries`` times, and is never a hang.

This package imports nothing of dualbudget's: ``campaign`` sits beside ``reference`` and
``proofs``, and the commands above pass it what they run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from . import unit as unit_module
from .unit import (
    RETRIES,
    Executor,
    ExecutorUnavailable,
    Result,
    Unit,
    UnitFailed,
    UnitStream,
    WorkerMismatch,
    _call,
    _ids,
    cancelled,
)

__all__ = [
    "DEFAULT_EXECUTOR",
    "EXECUTORS",
    "RETRIES",
    "Executor",
    "ExecutorUnavailable",
    "LocalExecutor",
    "UnitFailed",
    "UnitStream",
    "WorkerMismatch",
    "cancelled",
    "executor_for",
]

EXECUTORS = ("local", "ray")
"""The values of ``--executor``."""
DEFAULT_EXECUTOR = "local"


class _LocalBoard:
    """The stop mark of a local executor: shared memory read by every worker process."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def read(self) -> tuple[int, int]:
        return int(self.array[0]), int(self.array[1])


def _init_local(
    board: Any, initializer: Callable[..., object] | None, args: tuple[Any, ...]
) -> None:
    unit_module.board = _LocalBoard(board) if board is not None else None
    if initializer is not None:
        initializer(*args)


class LocalExecutor:
    """``jobs`` local worker processes (``jobs`` 1: this process, no worker).

    ``start_method`` and ``preload`` choose how workers start. Workers start from a
    forkserver by default, never by a fork of the caller: a unit's result may depend on
    nothing but the unit, and a fork would hand each worker whatever state the caller
    holds (a test session's patches, a Ray client's threads; a fork of a process holding
    threads is not safe either). A command that imports a package that starts threads
    (vLLM does) preloads it in the server, so each worker skips the import."""

    def __init__(
        self,
        jobs: int = 1,
        *,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        start_method: str = "forkserver",
        preload: Sequence[str] = (),
        retries: int = RETRIES,
    ) -> None:
        import multiprocessing

        self.width = jobs
        self.retries = retries
        self._runs = 0
        start = time.monotonic()
        self._pool: ProcessPoolExecutor | None = None
        if jobs == 1:
            if initializer is not None:
                initializer(*initargs)
        else:
            context = multiprocessing.get_context(start_method)
            if preload and start_method == "forkserver":
                context.set_forkserver_preload(list(preload))
            self._board = context.Array("q", [-1, -1])

            def make_pool() -> ProcessPoolExecutor:
                return ProcessPoolExecutor(
                    jobs,
                    mp_context=context,
                    initializer=_init_local,
                    initargs=(self._board, initializer, initargs),
                )

            self._make_pool = make_pool
            self._pool = self._make_pool()
            # Every worker started and warm before the clock of the run starts.
            list(self._pool.map(_nothing, range(jobs)))
        self.warm_up_seconds = time.monotonic() - start

    def map(
        self,
        fn: Callable[[Unit], Result],
        units: Sequence[Unit],
        ids: Sequence[str] | None = None,
        on_done: Callable[[int, Result], None] | None = None,
    ) -> UnitStream[Result]:
        self._runs += 1
        run, names = self._runs, _ids(units, ids)
        stopped = [len(units)]

        def stop(index: int) -> None:
            stopped[0] = min(stopped[0], index)
            if self._pool is not None:
                with self._board.get_lock():
                    self._board[0], self._board[1] = run, index

        if self._pool is None:
            return UnitStream(self._here(fn, units, names, run, on_done, stopped), stop)
        return UnitStream(self._pooled(fn, units, names, run, on_done, stopped), stop)

    def _here(
        self,
        fn: Callable[[Unit], Result],
        units: Sequence[Unit],
        names: list[str],
        run: int,
        on_done: Callable[[int, Result], None] | None,
        stopped: list[int],
    ) -> Iterator[Result]:
        for index, unit in enumerate(units):
            if index > stopped[0]:
                return
            result = _call(fn, run, index, names[index], unit)
            if on_done is not None:
                on_done(index, result)
            yield result

    def _pooled(
        self,
        fn: Callable[[Unit], Result],
        units: Sequence[Unit],
        names: list[str],
        run: int,
        on_done: Callable[[int, Result], None] | None,
        stopped: list[int],
    ) -> Iterator[Result]:
        done: dict[int, Result] = {}
        failed: dict[int, UnitFailed] = {}
        tries = dict.fromkeys(range(len(units)), 0)
        pending: dict[Future[Result], int] = {}

        def submit(index: int) -> None:
            assert self._pool is not None
            tries[index] += 1
            future = self._pool.submit(_call, fn, run, index, names[index], units[index])
            pending[future] = index

        for index in range(len(units)):
            submit(index)
        next_index = 0
        try:
            while next_index < len(units) and next_index <= stopped[0]:
                while next_index not in done and next_index not in failed:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    broken = False
                    for future in finished:
                        index = pending.pop(future)
                        try:
                            result = future.result()
                        except UnitFailed as err:
                            failed[index] = err
                        except BrokenProcessPool:
                            broken = True
                            pending[future] = index  # to run again below
                        else:
                            done[index] = result
                            if on_done is not None and index <= stopped[0]:
                                on_done(index, result)
                    if broken:
                        self._restart(pending, tries, names, failed, submit)
                if next_index in failed:
                    raise failed[next_index]
                yield done.pop(next_index)
                next_index += 1
        finally:
            for future in pending:
                future.cancel()

    def _restart(
        self,
        pending: dict[Future[Any], int],
        tries: dict[int, int],
        names: list[str],
        failed: dict[int, UnitFailed],
        submit: Callable[[int], None],
    ) -> None:
        """A worker died: every unit not finished runs again in a new pool (a unit is
        counted when its result reaches the driver, so none twice)."""
        lost = sorted(pending.values())
        pending.clear()
        assert self._pool is not None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._make_pool()
        for index in lost:
            if tries[index] > self.retries:
                failed[index] = UnitFailed(names[index], "its worker died on every try")
            else:
                submit(index)

    def close(self) -> None:
        if self._pool is not None:
            # A unit still running belongs to a run that was stopped or failed: told to
            # stop (``cancelled()``), then waited for, so that no worker is killed while
            # the pool still tracks it.
            with self._board.get_lock():
                self._board[0], self._board[1] = self._runs, -1
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _nothing(_: int) -> None:
    return None


def executor_for(
    name: str,
    jobs: int,
    ray_address: str | None = None,
    *,
    initializer: Callable[..., object] | None = None,
    initargs: tuple[Any, ...] = (),
    start_method: str = "forkserver",
    preload: Sequence[str] = (),
    fingerprint: Callable[[], str] | None = None,
) -> Executor:
    """The executor ``--executor name`` names: ``local`` with ``jobs`` processes, or
    ``ray`` on ``ray_address`` (``ray_executor.RayExecutor``) with ``jobs`` actors (0: one per CPU
    of the cluster). ``fingerprint`` (module-level) names what every worker must share
    with the driver (a vLLM's version and sources): a Ray worker that differs is refused."""
    if name == "local":
        return LocalExecutor(
            jobs,
            initializer=initializer,
            initargs=initargs,
            start_method=start_method,
            preload=preload,
        )
    if name == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(
            ray_address, jobs, initializer=initializer, initargs=initargs, fingerprint=fingerprint
        )
    raise ValueError(f"unknown executor {name!r} (known: {', '.join(EXECUTORS)})")


def default_width() -> int:
    return os.cpu_count() or 1
