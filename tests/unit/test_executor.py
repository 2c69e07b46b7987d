"""The executor seam with local processes (``campaign.executor``): results in unit order,
a raising unit reported as that unit's failure, a worker killed mid-unit run again and
counted once, an early stop told to the later units. The same with Ray:
tests/live/test_executor_ray_live.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualbudget.campaign.executor import LocalExecutor, UnitFailed, executor_for
from tests.executor_units import dies_once, fails_at_three, square, waits_for_cancel


@pytest.mark.parametrize("jobs", [1, 2])
def test_results_come_in_unit_order(jobs: int) -> None:
    done: list[int] = []
    with executor_for("local", jobs) as executor:
        results = list(executor.map(square, list(range(10)), on_done=lambda i, r: done.append(i)))
    assert results == [x * x for x in range(10)]
    assert sorted(done) == list(range(10))


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_raising_unit_is_that_units_failure(jobs: int) -> None:
    ids = [f"unit-{i}" for i in range(6)]
    seen: list[int] = []
    with executor_for("local", jobs) as executor:
        with pytest.raises(UnitFailed) as failure:
            for result in executor.map(fails_at_three, list(range(6)), ids=ids):
                seen.append(result)
        # The executor stays usable for the next map.
        assert list(executor.map(square, [1, 2])) == [1, 4]
    assert failure.value.unit == "unit-3"
    assert "ValueError: three is refused" in str(failure.value)
    assert seen == [0, 1, 2]


def test_a_worker_killed_mid_unit_runs_its_unit_again_counted_once(tmp_path: Path) -> None:
    # Unit 2's worker dies on its first try (its marker is absent); the others have run.
    for i in (0, 1, 3, 4, 5):
        (tmp_path / f"marker-{i}").write_text("")
    units = [(i, str(tmp_path / f"marker-{i}")) for i in range(6)]
    done: list[int] = []
    with LocalExecutor(2) as executor:
        results = list(executor.map(dies_once, units, on_done=lambda i, r: done.append(i)))
    assert results == list(range(6))
    assert sorted(done) == list(range(6))  # each unit counted once, unit 2 run twice
    assert (tmp_path / "marker-2").read_text() == "died"


def test_a_unit_that_kills_its_worker_every_time_fails_not_hangs(tmp_path: Path) -> None:
    executor = LocalExecutor(2, retries=0)
    try:
        with pytest.raises(UnitFailed, match="worker died"):
            list(executor.map(dies_once, [(0, str(tmp_path / "m"))]))
    finally:
        executor.close()


def test_stop_after_tells_the_later_units_and_yields_no_more() -> None:
    with LocalExecutor(2) as executor:
        stream = executor.map(waits_for_cancel, [0, 1, 2])
        first = next(stream)
        stream.stop_after(0)
        assert first is False
        assert list(stream) == []
        # Units of the next map are not cancelled by the earlier map's stop.
        assert list(executor.map(square, [3])) == [9]
