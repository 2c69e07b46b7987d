"""``--vllm-src``: trees made from the installed vLLM's Python, checked through the tree.

Each tree is built at test time (tests/vllm_trees.py) and run in a fresh process, as a
reviewer's ``dualbudget fuzz --vllm-src DIR`` would: the copy of the installed release
given a development version, two upstream proposals written into vLLM's own scheduler,
a planted refund bug, and a tree that needs a compiled part the installed vLLM lacks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dualbudget.integration.testing import require_live_vllm
from dualbudget.spec.profiles import PROFILES
from dualbudget.spec.releases import release_of
from tests import vllm_trees

pytestmark = pytest.mark.live

DETECT = (
    "import json\n"
    "from dualbudget.integration.live import quiet_vllm\n"
    "from dualbudget.integration.detect import detect\n"
    "quiet_vllm()\n"
    "print(json.dumps(detect().to_json()))\n"
)


def _release_version() -> str:
    version = require_live_vllm()
    release = release_of(version)
    assert release is not None, f"vLLM {version}: no release record"
    return release.version


def _profile_of(policy_names: tuple[str, ...]) -> str | None:
    """The profile running one of ``policy_names`` on the installed release, if any."""
    release = _release_version()
    found = [
        p.name
        for p in PROFILES.values()
        if p.policy.name in policy_names and p.release.version == release
    ]
    return found[0] if found else None


def _detected(tree: Path) -> dict[str, Any]:
    found: dict[str, Any] = vllm_trees.run_in_tree(tree, DETECT)
    return found


def _fuzz(tree: Path, out: Path) -> str:
    done = vllm_trees.dualbudget(
        "fuzz", "--vllm-src", str(tree), "--examples", "20", "--seed", "1",
        "--no-coverage-gate", "--out-dir", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _dev(tmp_path: Path) -> tuple[Path, str]:
    require_live_vllm()
    return tmp_path / "tree", vllm_trees.development_version(vllm_trees.installed_version())


def test_the_installed_sources_as_a_development_tree(tmp_path: Path) -> None:
    dest, version = _dev(tmp_path)
    tree = vllm_trees.copy_installed_sources(dest, version)
    own = f"vllm-{_release_version()}"
    output = _fuzz(tree, tmp_path / "out")
    header = output.splitlines()[0]
    assert f"vLLM {version}" in header and f"profile {own} (detected by decisions)" in header
    assert "verdict: PASS" in output
    # Worker processes import the tree's vLLM too.
    where = vllm_trees.run_in_tree(
        tree,
        "import json, multiprocessing\n"
        "with multiprocessing.get_context('forkserver').Pool(1) as pool:\n"
        "    print(json.dumps(pool.apply(eval, ('__import__(\"vllm\").__version__',))))\n",
    )
    assert where == version


def test_the_split_draft_budget_of_53080(tmp_path: Path) -> None:
    dest, version = _dev(tmp_path)
    tree = vllm_trees.split_draft_budget_tree(dest, version)
    expected = _profile_of(("split-draft-budget", "dual"))
    found = _detected(tree)
    assert found["profile"] == expected, found
    assert f"profile {expected} (detected by decisions" in _fuzz(tree, tmp_path / "out")


def test_the_dspark_query_budget_of_52996(tmp_path: Path) -> None:
    dest, version = _dev(tmp_path)
    tree = vllm_trees.dspark_query_budget_tree(dest, version)
    # Where no profile runs #52996 on the installed release (0.33), the rule decides as
    # the release's own: its DSpark requests reserve no slots and its admission cap
    # (max_num_batched_tokens // num_lookahead_tokens running requests) already keeps their
    # K query rows within the budget, so charging them changes no decision.
    expected = _profile_of(("dspark-query-budget",)) or f"vllm-{_release_version()}"
    found = _detected(tree)
    assert found["profile"] == expected, found


def test_a_forgotten_slot_refund_matches_no_profile(tmp_path: Path) -> None:
    dest, version = _dev(tmp_path)
    tree = vllm_trees.forgotten_refund_tree(dest, version)
    found = _detected(tree)
    assert found["profile"] is None, found
    own = found["failures"][f"vllm-{_release_version()}"]
    # The release's own profile fails where a scheduled request is preempted.
    assert own["scenario"].endswith("/refund"), own
    assert re.match(r"decision at step \d+", own["how"]), own


def test_a_tree_needing_a_missing_compiled_part_is_refused(tmp_path: Path) -> None:
    dest, version = _dev(tmp_path)
    tree = vllm_trees.copy_installed_sources(dest, version)
    scheduler = tree / "vllm" / vllm_trees.SCHEDULER_MODULE
    scheduler.write_text("import vllm._dualbudget_absent_C\n" + scheduler.read_text())
    done = vllm_trees.dualbudget("fuzz", "--vllm-src", str(tree), "--examples", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "vllm._dualbudget_absent_C" in lines[0], done.stderr
