"""``dualbudget report --upstream`` against the installed vLLM: it writes at least one
test, each fails on this release with its predicted message (CI's JUnit check), and each
contract test passes on the installed sources transformed as vllm-project/vllm#53080
proposes (so it tests the contract, not a recorded outcome)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dualbudget.cli import main
from dualbudget.integration.detect import same_rule_elsewhere
from dualbudget.integration.testing import require_live_vllm
from dualbudget.integration.upstream import MANIFEST_NAME, check_junit, exhibits, run_pytest
from tests import vllm_trees

pytestmark = pytest.mark.live


def test_upstream_tests_fail_as_predicted_and_pass_on_the_split_draft_budget(
    tmp_path: Path,
) -> None:
    version = require_live_vllm()
    out = tmp_path / "upstream"
    # Exit 0: what ran is what the manifest's findings and crash records predict.
    assert main(["report", "--upstream", str(out)]) == 0
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["vllm_version"] == version
    tests = manifest["tests"]
    assert tests, f"vLLM {version}: no finding exhibited"
    assert sorted(p.name for p in out.glob("test_*.py")) == sorted(t["file"] for t in tests)

    # CI's step: a plain pytest run of the folder, its JUnit against the manifest.
    junit = tmp_path / "junit.xml"
    outcomes = run_pytest(out, junit)
    assert set(outcomes) == {t["test"] for t in tests}
    assert check_junit(out, junit) == []

    # The contract tests on a scheduler that follows the contract, the split draft budget,
    # through ``report --upstream --vllm-src``: the tree's Python runs every test, and the
    # predictions follow the profile its decisions match (no contract finding; the crash of
    # its base release, whose padding it keeps).
    contract = [t["test"] for t in tests if not t["finding"].startswith("crash/")]
    predicted = [
        e.name for e in exhibits() if not e.finding.startswith("crash/") and e.predicted(version)
    ]
    assert sorted(contract) == sorted(f"test_{name}" for name in predicted), manifest
    if contract:
        _contract_tests_pass_on_the_split_draft_budget(tmp_path, version, tests, contract)
    # else: the release exhibits no contract finding (0.34: its findings are admission
    # checks stricter than needed, C4-converse, which no scheduler test shows).
    _crash_tests_pass_where_the_padding_is_kept(tmp_path, version, out, tests)


def _contract_tests_pass_on_the_split_draft_budget(
    tmp_path: Path, version: str, tests: list[dict[str, str]], contract: list[str]
) -> None:
    tree = vllm_trees.split_draft_budget_tree(
        tmp_path / "pr-53080", vllm_trees.development_version(version)
    )
    on_tree = tmp_path / "on-tree"
    done = vllm_trees.dualbudget("report", "--upstream", str(on_tree), "--vllm-src", str(tree))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    written = json.loads((on_tree / MANIFEST_NAME).read_text())
    assert written["vllm_src"] == str(tree.resolve()) and written["profile"] in (
        "pr-53080",
        *same_rule_elsewhere("pr-53080"),
    ), written
    assert written["vllm_version"] == vllm_trees.development_version(version)
    passed = {t["test"] for t in written["not_exhibited"] if t["outcome"] == "passed"}
    assert set(contract) <= passed, f"fail on the pr-53080 tree: {written}"
    assert {t["test"] for t in written["tests"]} == {
        t["test"] for t in tests if t["finding"].startswith("crash/")
    }


def _crash_tests_pass_where_the_padding_is_kept(
    tmp_path: Path, version: str, out: Path, tests: list[dict[str, str]]
) -> None:
    # The crash tests on a tree whose scheduler keeps a padded request whole: each passes
    # there, so it tests vLLM's assertion, not the recorded failure.
    crashes = tmp_path / "crash-tests"
    crashes.mkdir()
    for t in tests:
        if t["finding"].startswith("crash/"):
            shutil.copy(out / t["file"], crashes / t["file"])
    assert list(crashes.iterdir()), f"vLLM {version}: no crash exhibited"
    fixed = vllm_trees.padding_kept_tree(
        tmp_path / "padding-kept", vllm_trees.development_version(version)
    )
    ran = vllm_trees.run_in_tree(
        fixed,
        "import json\n"
        "from pathlib import Path\n"
        "from dualbudget.integration.upstream import run_pytest\n"
        f"got = run_pytest(Path({str(crashes)!r}), Path({str(tmp_path / 'crash.xml')!r}))\n"
        "print(json.dumps({k: v.outcome for k, v in got.items()}))\n",
    )
    assert ran == {t["test"]: "passed" for t in tests if t["finding"].startswith("crash/")}, ran
