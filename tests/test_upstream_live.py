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
from dualbudget.integration.testing import require_live_vllm
from dualbudget.integration.upstream import (
    MANIFEST_NAME,
    check_junit,
    pytest_args,
    read_junit,
    run_pytest,
)
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

    # The contract tests on a scheduler that follows the contract: the split draft budget.
    contract = [t for t in tests if not t["finding"].startswith("crash/")]
    assert contract, f"vLLM {version}: no contract finding exhibited"
    chosen = tmp_path / "contract"
    chosen.mkdir()
    for t in contract:
        shutil.copy(out / t["file"], chosen / t["file"])
    tree = vllm_trees.split_draft_budget_tree(
        tmp_path / "pr-53080", vllm_trees.development_version(version)
    )
    tree_junit = tmp_path / "tree.xml"
    vllm_trees.run_in_tree(
        tree,
        "import json, pytest\n"
        f"code = pytest.main({pytest_args(chosen, tree_junit)!r})\n"
        "print(json.dumps(int(code)))\n",
    )
    on_tree = read_junit(tree_junit)
    assert set(on_tree) == {t["test"] for t in contract}
    failing = {name: o.message for name, o in on_tree.items() if o.outcome != "passed"}
    assert not failing, f"fail on the pr-53080 tree: {failing}"
