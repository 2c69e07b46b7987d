"""``--vllm-src``: trees made from the installed vLLM's Python, checked through the tree.

Each tree is built at test time (tests/vllm_trees.py) and run in a fresh process, as a
reviewer's ``dualbudget fuzz --vllm-src DIR`` would: the copy of the installed release
given a development version, two upstream proposals written into vLLM's own scheduler,
a planted refund bug, and a tree that needs a compiled part the installed vLLM lacks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dualbudget.integration.detect import rule_on_base, same_rule_elsewhere
from dualbudget.integration.testing import require_live_vllm
from dualbudget.spec.profiles import PROFILES, Profile
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


def _proposal(thread: str) -> Profile:
    """The profile that follows the upstream proposal ``thread``."""
    (found,) = [p for p in PROFILES.values() if p.thread == thread]
    return found


def _verdict(proposal: Profile) -> str | None:
    """The profile a tree written as ``proposal`` must be detected as: the proposal's own
    where it runs on the installed release; elsewhere the profile that runs its rule on
    the installed release, as the records say (``same_rule_elsewhere``); None where no
    profile does (0.34 has no proposal of its own)."""
    release = _release_version()
    if proposal.release.version == release:
        return proposal.name
    found = [
        p.name
        for p in PROFILES.values()
        if p.release.version == release and proposal.name in same_rule_elsewhere(p.name)
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


def _detected(tree: Path) -> dict[str, Any]:
    found: dict[str, Any] = vllm_trees.run_in_tree(tree, DETECT)
    return found


def _fuzz(tree: Path, out: Path, *flags: str) -> str:
    done = vllm_trees.dualbudget(
        "fuzz", "--vllm-src", str(tree), "--examples", "20", "--seed", "1",
        "--no-coverage-gate", "--out-dir", str(out), *flags,
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
    proposal = _proposal("vllm-project/vllm#53080")
    expected = _verdict(proposal)
    found = _detected(tree)
    if expected is None:
        # No profile runs the rule on this release: the tree decides as none, nearest its
        # release's own, from which the split budget departs where it admits a budget the
        # release refuses (at or below the lookahead).
        own = f"vllm-{_release_version()}"
        assert found["profile"] is None and found["nearest"]["profile"] == own, found
        assert found["nearest"]["scenario"].endswith("/below-lookahead"), found
        return
    assert found["profile"] == expected and found["matches"] == [expected], found
    header = _fuzz(tree, tmp_path / "out").splitlines()[0]
    assert f"profile {expected} (detected by decisions" in header, header
    if expected != proposal.name:
        # On another release's base the verdict names the proposal whose rule it runs.
        assert proposal.name in found["same_rule"][expected], found
        assert rule_on_base(expected) in header, header


def test_the_dspark_query_budget_of_52996(tmp_path: Path) -> None:
    dest, version = _dev(tmp_path)
    tree = vllm_trees.dspark_query_budget_tree(dest, version)
    proposal = _proposal("vllm-project/vllm#52996")
    found = _detected(tree)
    fuzzed = tmp_path / "fuzz.json"
    _fuzz(tree, tmp_path / "out", "--layout", "dspark-fill-in", "--json", str(fuzzed))
    monitor = json.loads(fuzzed.read_text())["monitor"]
    if proposal.release.version == _release_version():
        assert found["profile"] == proposal.name and found["matches"] == [proposal.name], found
        # #52996 charges K query rows but DSpark fill-in reads K + 1: the monitor, without
        # the reference, sees the buffer overflow live, a finding the manifest knows.
        c3 = [v for v in monitor["violations"] if v["contract"] == "C3"]
        assert monitor["counts"]["C3"] > 0 and c3, monitor
        assert all(v["profile"] == proposal.name and v["known"] for v in c3), c3
    else:
        # No profile runs #52996 on this release: the rule decides as the release's own
        # (DSpark reserves no slots there and the admission cap
        # max_num_batched_tokens // num_lookahead_tokens already keeps the K query rows
        # within the budget), and the release's C3 holds for DSpark fill-in.
        own = f"vllm-{_release_version()}"
        assert found["profile"] == own and found["matches"] == [own], found
        assert monitor["counts"]["C3"] == 0, monitor


def test_a_forgotten_slot_refund_matches_no_profile(tmp_path: Path) -> None:
    dest, version = _dev(tmp_path)
    tree = vllm_trees.forgotten_refund_tree(dest, version)
    found = _detected(tree)
    assert found["profile"] is None, found
    own = found["failures"][f"vllm-{_release_version()}"]
    # The release's own profile fails where a scheduled request is preempted (with the
    # drafters of 0.34, whose only slot is a draft model's, at K = 3).
    assert re.search(r"/refund(-one-slot)?$", own["scenario"]), own
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
