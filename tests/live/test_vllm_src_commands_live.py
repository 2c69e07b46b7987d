"""``--vllm-src`` on ``mutate`` and ``bench``: each command runs the tree's Python.

The trees are made at test time from the installed vLLM (tests/vllm_trees.py) and each
carries a planted behaviour the command's output can only show if it ran the tree: the
scheduler shifted by a few comment lines (mutate's mutant sites are the tree's lines),
and the planted refund bug (no profile matches its decisions, so both commands refuse
it in one line). Short runs: one operator's mutants at a few examples each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualbudget.integration.testing import require_live_vllm
from tests import vllm_trees

pytestmark = pytest.mark.live

PLANTED_LINES = 7
"""Comment lines put above the tree's scheduler: every site of it moves down by these."""


def _version() -> str:
    require_live_vllm()
    return vllm_trees.development_version(vllm_trees.installed_version())


@pytest.fixture(scope="module")
def forgotten_refund(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vllm_trees.forgotten_refund_tree(tmp_path_factory.mktemp("refund"), _version())


def test_mutate_mutates_the_trees_scheduler(tmp_path: Path) -> None:
    version = _version()
    tree = vllm_trees.copy_installed_sources(tmp_path / "tree", version)
    scheduler = tree / "vllm" / vllm_trees.SCHEDULER_MODULE
    planted = "".join(f"# planted {i}: the tree's sites sit lower\n" for i in range(PLANTED_LINES))
    scheduler.write_text(planted + scheduler.read_text())
    report = tmp_path / "mutate.json"
    done = vllm_trees.dualbudget(
        "mutate", "--vllm-src", str(tree), "--operators", "remove-refund",
        "--examples", "40", "--jobs", "1", "--json", str(report),
        "--out-dir", str(tmp_path / "mutants"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    header = done.stdout.splitlines()[0]
    assert f"vLLM {version}" in header and "(detected by decisions)" in header, header
    result = json.loads(report.read_text())
    assert result["vllm_version"] == version
    lines = scheduler.read_text().splitlines()
    installed = (vllm_trees.installed_package() / vllm_trees.SCHEDULER_MODULE).read_text()
    mutants = result["mutants"]
    assert mutants and all(m["status"] == "killed" for m in mutants), mutants
    for mutant in mutants:
        # remove-refund drops a term of a refund ``x += restored ...``: the line it names
        # is the tree's, PLANTED_LINES below where the installed file has it.
        line = int(mutant["location"].rsplit(":", 1)[1])
        refund = lines[line - 1]
        assert "restored" in refund and "+=" in refund, (mutant, refund)
        assert installed.splitlines()[line - 1 - PLANTED_LINES] == refund, mutant


@pytest.mark.parametrize("command", ["mutate", "bench"])
def test_a_tree_of_no_profile_is_refused(command: str, forgotten_refund: Path) -> None:
    # Refused only because the tree's own scheduler decides as no profile does.
    done = vllm_trees.dualbudget(command, "--vllm-src", str(forgotten_refund))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    # One line says why (vLLM's own warnings may stand beside it), never a traceback.
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "no profile matches its decisions" in errors[0], done.stderr
    assert f"vLLM {_version()}" in errors[0] and "Traceback" not in done.stderr, errors
