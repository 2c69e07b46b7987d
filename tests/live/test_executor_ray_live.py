"""The executor seam on Ray (``campaign.ray_executor``), on a local Ray of 2 CPUs: results
in unit order, a raising unit reported as that unit's failure, an actor killed mid-unit
restarted by Ray with its unit retried and counted once. Live: Ray is pinned in the vLLM
environments (requirements/ray.txt) only."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualbudget.campaign.executor import UnitFailed, WorkerMismatch, executor_for
from tests.executor_units import (
    dies_once,
    fails_at_three,
    process_fingerprint,
    square,
    waits_for_cancel,
)
from tests.ray_support import RAY_GROUP, local_ray

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("local_ray"), RAY_GROUP]
__all__ = ["local_ray"]


def test_results_come_in_unit_order_and_a_raising_unit_fails_alone() -> None:
    done: list[int] = []
    with executor_for("ray", 2) as executor:
        units = list(range(10))
        assert list(executor.map(square, units, on_done=lambda i, r: done.append(i))) == [
            x * x for x in units
        ]
        assert sorted(done) == units
        with pytest.raises(UnitFailed) as failure:
            list(executor.map(fails_at_three, list(range(6)), ids=[f"u{i}" for i in range(6)]))
        assert failure.value.unit == "u3"
        assert "ValueError: three is refused" in str(failure.value)
        # A stop is told to the later units of that map only.
        stream = executor.map(waits_for_cancel, [0, 1])
        assert next(stream) is False
        stream.stop_after(0)
        assert list(executor.map(square, [3])) == [9]


def test_an_actor_killed_mid_unit_is_restarted_and_its_unit_counted_once(tmp_path: Path) -> None:
    for i in (0, 2, 3):
        (tmp_path / f"marker-{i}").write_text("")
    units = [(i, str(tmp_path / f"marker-{i}")) for i in range(4)]
    done: list[int] = []
    with executor_for("ray", 2) as executor:
        results = list(executor.map(dies_once, units, on_done=lambda i, r: done.append(i)))
    assert results == [0, 1, 2, 3]
    assert sorted(done) == [0, 1, 2, 3]
    assert (tmp_path / "marker-1").read_text() == "died"


def test_a_worker_whose_environment_differs_is_refused() -> None:
    with pytest.raises(WorkerMismatch, match=r"a Ray worker has process \d+, the driver process"):
        executor_for("ray", 1, fingerprint=process_fingerprint)
