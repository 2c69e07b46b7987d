"""Each item of the scheduler's books (C7-C13) broken by one planted edit of the installed
vLLM's own code (``vllm_trees.BOOKS_BROKEN``) and caught by ``fuzz --vllm-src`` with the
contract monitor alone: exit 1, the broken item counted and written as a scenario, which
``fuzz --replay`` through the same tree reproduces."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dualbudget.integration.testing import require_live_vllm
from dualbudget.spec.contract import BOOKS_IDS
from dualbudget.spec.releases import release_of
from tests import vllm_trees

pytestmark = pytest.mark.live

Done = subprocess.CompletedProcess[str]
Caught = tuple[Done, dict[str, Any], Done | None]
"""The fuzz, its JSON, and the replay of its first kept scenario of the planted item."""


def _fuzz(tree: Path, out: Path, profile: str, item: str) -> Caught:
    report = out / "fuzz.json"
    done = vllm_trees.dualbudget(
        "fuzz", "--vllm-src", str(tree), "--profile", profile, "--monitor-only",
        "--no-coverage-gate", "--layout", "eagle", "--examples", "30", "--seed", "1",
        "--jobs", "1", "--json", str(report), "--out-dir", str(out / "scenarios"),
    )  # fmt: skip
    found = json.loads(report.read_text()) if report.exists() else {}
    named = [v for v in found.get("monitor", {}).get("violations", []) if v["contract"] == item]
    replayed = None
    if named:
        replayed = vllm_trees.dualbudget(
            "fuzz", "--vllm-src", str(tree), "--monitor-only",
            "--replay", named[0]["scenario_path"],
        )  # fmt: skip
    return done, found, replayed


@pytest.fixture(scope="module")
def caught(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Caught]:
    """Every planted tree fuzzed, two at a time (each a process of one worker): the
    machine's two cores serve six trees in the time of three."""
    release = release_of(require_live_vllm())
    assert release is not None
    version = vllm_trees.development_version(vllm_trees.installed_version())
    root = tmp_path_factory.mktemp("books")
    trees = {
        item: vllm_trees.books_broken_tree(root / item / "tree", version, item)
        for item in BOOKS_IDS
    }
    with ThreadPoolExecutor(2) as pool:
        runs = {
            item: pool.submit(_fuzz, tree, root / item, f"vllm-{release.version}", item)
            for item, tree in trees.items()
        }
        return {item: run.result() for item, run in runs.items()}


@pytest.mark.parametrize("item", BOOKS_IDS)
def test_a_planted_break_of_each_item_is_caught_by_name(
    caught: dict[str, Caught], item: str
) -> None:
    done, report, replayed = caught[item]
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    monitor = report["monitor"]
    assert monitor["counts"][item] > 0, monitor["counts"]
    assert report["steps"] > 0
    named = [v for v in monitor["violations"] if v["contract"] == item]
    assert named and Path(named[0]["scenario_path"]).exists(), monitor["violations"][:3]
    assert f"{item} {monitor['counts'][item]}" in done.stdout
    # The scenario replays the violation through the same tree, by name.
    assert replayed is not None
    assert replayed.returncode == 1, replayed.stdout[-3000:] + replayed.stderr[-3000:]
    assert f"monitor: {item} at step" in replayed.stdout
