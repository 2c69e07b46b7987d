"""What a unit sees of the executor seam, shared by the local and the Ray executor: its
failure, the stop mark of its ``map`` (``cancelled``), the stream of results."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

Unit = TypeVar("Unit")
Result = TypeVar("Result")

RETRIES = 2
"""Times a unit whose worker died is run again before the run fails: Ray's default
``max_task_retries`` for an actor task lost with its worker is the same idea."""


class UnitFailed(Exception):
    """Unit ``unit`` raised (or its worker died more than ``RETRIES`` times)."""

    def __init__(self, unit: str, message: str) -> None:
        super().__init__(unit, message)
        self.unit = unit
        self.message = message

    def __str__(self) -> str:
        return f"unit {self.unit}: {self.message}"


class ExecutorUnavailable(Exception):
    """The executor asked for cannot run this command's units (one line, for the user)."""


class WorkerMismatch(ExecutorUnavailable):
    """A worker's environment differs from the driver's (``fingerprint``)."""


# -- in a worker --------------------------------------------------------------------------
class _Board(Protocol):
    def read(self) -> tuple[int, int]: ...


board: _Board | None = None
"""In a worker: where the driver marks (map id, unit index) of the unit that stopped a map."""
_current: tuple[int, int] = (-1, -1)
"""In a worker: (map id, unit index) of the unit running now."""


def cancelled() -> bool:
    """In a unit: whether an earlier unit of the same ``map`` stopped it (its result will
    be dropped, so it may stop at its next chance). False outside an executor's worker."""
    if board is None:
        return False
    run, index = board.read()
    return run == _current[0] and _current[1] > index


def _call(fn: Callable[[Unit], Result], run: int, index: int, unit_id: str, unit: Unit) -> Result:
    """A unit in a worker, its exception turned into ``UnitFailed`` (picklable, with the
    unit's id; the original may not pickle back)."""
    global _current
    _current = (run, index)
    try:
        return fn(unit)
    except Exception as err:
        raise UnitFailed(unit_id, f"{type(err).__name__}: {err}") from None
    finally:
        _current = (-1, -1)


# -- the seam -----------------------------------------------------------------------------
class UnitStream(Generic[Result]):
    """The results of one ``map``, in unit order; ``stop_after(i)``: drop every result
    after unit ``i`` and tell those units to stop."""

    def __init__(self, results: Iterator[Result], stop: Callable[[int], None]) -> None:
        self._results = results
        self._stop = stop

    def __iter__(self) -> Iterator[Result]:
        return self._results

    def __next__(self) -> Result:
        return next(self._results)

    def stop_after(self, index: int) -> None:
        """Called after unit ``index``'s result: no later result is yielded."""
        self._stop(index)
        close = getattr(self._results, "close", None)
        if close is not None:
            close()  # its pending units are cancelled


class Executor(Protocol):
    width: int
    """Units that run at once."""
    warm_up_seconds: float
    """Seconds its workers took to start and run the initializer."""

    def map(
        self,
        fn: Callable[[Unit], Result],
        units: Sequence[Unit],
        ids: Sequence[str] | None = None,
        on_done: Callable[[int, Result], None] | None = None,
    ) -> UnitStream[Result]:
        """``fn(unit)`` for every unit, yielded in unit order; ``on_done(i, result)`` in
        the driver as each unit finishes (in the order they finish); ``ids`` name the
        units in a ``UnitFailed`` (default: their indexes)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...


def _ids(units: Sequence[Any], ids: Sequence[str] | None) -> list[str]:
    return list(ids) if ids is not None else [str(i) for i in range(len(units))]
