"""A campaign: every finished unit's result kept in SQLite, so that a rerun resumes.

``Campaign(directory, key)`` keeps ``campaign.sqlite`` in ``directory``: one row per
finished unit (its id, its inputs as JSON, its result pickled, when it finished),
written by the driver as each unit finishes, in its own transaction, so a driver killed
at any moment loses no finished unit. ``key`` names what every unit's result depends on
besides the unit (a command, a profile, the vLLM's fingerprint); a directory kept for
another key is refused, since its results would not be this run's. ``map_resumed``
yields what ``Executor.map`` would, taking every unit already in the campaign from it
and running only the rest: a unit is counted by its id, once, however often it ran (a
retried task, a rerun after a kill).
"""

from __future__ import annotations

import json
import pickle
import sqlite3
import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .executor import Executor, ExecutorUnavailable, UnitStream
from .progress import progress_bar

Unit = TypeVar("Unit")
Result = TypeVar("Result")

FILE = "campaign.sqlite"
SCHEMA = """
create table if not exists meta (name text primary key, value text not null);
create table if not exists units (
    id text primary key,
    inputs text not null,
    result blob not null,
    finished real not null
);
"""


class CampaignMismatch(ExecutorUnavailable):
    """The directory holds a campaign of another command or environment."""


class Campaign:
    def __init__(self, directory: str | Path, key: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / FILE
        # autocommit: each finished unit is its own transaction.
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.executescript(SCHEMA)
        self._db.execute("insert or ignore into meta values ('key', ?)", (key,))
        (kept,) = self._db.execute("select value from meta where name = 'key'").fetchone()
        if kept != key:
            self.close()
            raise CampaignMismatch(f"{self.path} is a campaign of {kept}, not of {key}")
        self.ran = 0
        """Units this process ran and recorded (not those taken from the campaign)."""

    def results(self, ids: Sequence[str]) -> dict[str, Any]:
        """The kept results of ``ids``."""
        found: dict[str, Any] = {}
        for unit_id in ids:
            row = self._db.execute("select result from units where id = ?", (unit_id,))
            kept = row.fetchone()
            if kept is not None:
                found[unit_id] = pickle.loads(kept[0])
        return found

    def all_results(self) -> dict[str, Any]:
        """Every kept result, by unit id, in id order."""
        rows = self._db.execute("select id, result from units order by id")
        return {unit_id: pickle.loads(blob) for unit_id, blob in rows}

    def record(self, unit_id: str, inputs: Any, result: Any) -> bool:
        """Keep ``result`` unless the unit is already kept; whether it was new."""
        cursor = self._db.execute(
            "insert or ignore into units values (?, ?, ?, ?)",
            (unit_id, json.dumps(inputs, sort_keys=True, default=str), pickle.dumps(result),
             time.time()),
        )  # fmt: skip
        new = cursor.rowcount == 1
        self.ran += new
        return new

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Campaign:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def map_resumed(
    executor: Executor,
    campaign: Campaign | None,
    fn: Callable[[Unit], Result],
    units: Sequence[Unit],
    ids: Sequence[str],
    inputs: Callable[[Unit], Any] = repr,
    progress: str | None = None,
) -> UnitStream[Result]:
    """``executor.map(fn, units, ids)``, with the units kept in ``campaign`` taken from
    it and every other unit recorded there as it finishes (``inputs(unit)`` its inputs'
    record); ``progress``: the description of a bar of units done (``progress_bar``)."""
    kept = campaign.results(ids) if campaign is not None else {}
    todo = [i for i, unit_id in enumerate(ids) if unit_id not in kept]
    bar = progress_bar(progress, len(units), len(kept))

    def record(j: int, result: Result) -> None:
        index = todo[j]
        if campaign is not None:
            campaign.record(ids[index], inputs(units[index]), result)
        bar.update()

    ran = executor.map(fn, [units[i] for i in todo], [ids[i] for i in todo], on_done=record)

    def merged() -> Generator[Result, None, None]:
        try:
            for unit_id in ids:
                yield kept[unit_id] if unit_id in kept else next(ran)
        finally:
            bar.close()

    results = merged()

    def stop(index: int) -> None:
        ran.stop_after(sum(1 for i in todo if i <= index) - 1)
        results.close()

    return UnitStream(results, stop)
