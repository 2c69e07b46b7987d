"""Campaigns (``campaign.store``): a driver killed after k units loses none of them, and
its rerun runs exactly the others and ends where an uninterrupted run ends."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dualbudget.campaign.executor import LocalExecutor
from dualbudget.campaign.store import Campaign, CampaignMismatch, map_resumed
from tests.campaign_driver import KEY, run
from tests.executor_units import dies_once, logged_square
from tests.paths import REPO

UNITS = 12


def _kept(directory: Path) -> int:
    with sqlite3.connect(directory / "campaign.sqlite") as db:
        (count,) = db.execute("select count(*) from units").fetchone()
    return int(count)


def test_a_killed_campaign_resumes_with_exactly_the_remaining_units(tmp_path: Path) -> None:
    whole, whole_ran = run(str(tmp_path / "whole"), str(tmp_path / "whole.log"), UNITS)
    assert whole_ran == UNITS

    directory, log = tmp_path / "killed", tmp_path / "killed.log"
    driver = subprocess.Popen(
        [sys.executable, "-m", "tests.campaign_driver", str(directory), str(log), str(UNITS)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (directory / "campaign.sqlite").exists() and _kept(directory) >= 3:
            break
        time.sleep(0.05)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    kept = _kept(directory)
    assert 3 <= kept < UNITS

    resumed, ran = run(str(directory), str(log), UNITS)
    assert resumed == whole
    assert ran == UNITS - kept  # exactly the units not kept
    runs = [int(line) for line in log.read_text().split()]
    # Every unit ran once, but the one the kill may have caught between its run and
    # its record: it ran twice and was counted once.
    assert sorted(set(runs)) == list(range(UNITS))
    assert len(runs) - UNITS in (0, 1)
    assert _kept(directory) == UNITS


def test_a_worker_killed_mid_unit_is_counted_once(tmp_path: Path) -> None:
    # Unit 1's worker dies on its first try; the executor runs it again.
    for i in (0, 2, 3):
        (tmp_path / f"marker-{i}").write_text("")
    units = [(i, str(tmp_path / f"marker-{i}")) for i in range(4)]
    ids = [f"u{i}" for i in range(4)]
    with Campaign(tmp_path / "c", "dies_once") as campaign, LocalExecutor(2) as executor:
        results = list(map_resumed(executor, campaign, dies_once, units, ids))
        assert campaign.ran == 4
    assert results == [0, 1, 2, 3]
    assert _kept(tmp_path / "c") == 4


def test_a_campaign_of_another_command_is_refused(tmp_path: Path) -> None:
    Campaign(tmp_path, KEY).close()
    with pytest.raises(CampaignMismatch, match="is a campaign of logged_square"):
        Campaign(tmp_path, "something else")


def test_a_finished_campaign_runs_nothing_again(tmp_path: Path) -> None:
    log = tmp_path / "log"
    units = [(i, str(log)) for i in range(3)]
    ids = ["a", "b", "c"]
    for expected_ran in (3, 0):
        with Campaign(tmp_path / "c", "x") as campaign, LocalExecutor(1) as executor:
            assert list(map_resumed(executor, campaign, logged_square, units, ids)) == [0, 1, 4]
            assert campaign.ran == expected_ran
    assert log.read_text().split() == ["0", "1", "2"]
