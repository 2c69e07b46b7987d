"""Each item of the scheduler's books (C7-C13) broken by one planted edit of the installed
vLLM's own code (``vllm_trees.BOOKS_BROKEN``) and caught by ``fuzz --vllm-src`` with the
contract monitor alone, by name.

Each plant is caught on a fixed scenario (``planted_scenarios/books-ITEM.json``) that
reaches the state the plant breaks: the seeded fuzz through the planted 0.32 tree wrote
it, and the test depends on what vLLM does on it, not on which examples a seed draws.
The path from a drawn example to a scenario file that replays its violation is
``test_monitor_live.py``'s."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dualbudget.spec.contract import BOOKS_IDS
from tests import vllm_trees
from tests.planted_scenario import SCENARIOS

pytestmark = pytest.mark.live

Done = subprocess.CompletedProcess[str]


def _replay(tree: Path, profile: str, item: str) -> Done:
    return vllm_trees.dualbudget(
        "fuzz", "--vllm-src", str(tree), "--profile", profile, "--monitor-only",
        "--replay", str(SCENARIOS / f"books-{item}.json"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    version = vllm_trees.development_version(vllm_trees.installed_version())
    root = tmp_path_factory.mktemp("books")
    return {item: vllm_trees.books_broken_tree(root / item, version, item) for item in BOOKS_IDS}


@pytest.fixture(scope="module")
def replayed(trees: dict[str, Path], profile: str) -> dict[str, Done]:
    """Every planted tree's scenario replayed, two at a time (each a process of its own)."""
    with ThreadPoolExecutor(2) as pool:
        runs = {item: pool.submit(_replay, tree, profile, item) for item, tree in trees.items()}
        return {item: run.result() for item, run in runs.items()}


@pytest.mark.parametrize("item", BOOKS_IDS)
def test_a_planted_break_of_each_item_is_caught_by_name(
    replayed: dict[str, Done], item: str
) -> None:
    done = replayed[item]
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    named = [line for line in done.stdout.splitlines() if line.startswith("monitor: ")]
    assert named and named[0].startswith(f"monitor: {item} at step"), named[:3]
