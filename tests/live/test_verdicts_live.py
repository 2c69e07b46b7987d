"""No verdict without checked work, against the installed vLLM: a scheduler that fails
every step checks nothing (exit 2, its first error named); a tree whose vLLM renamed a
field the adapter passes is a vLLM the adapter cannot drive (exit 2, the field named); a
tree that decides as no profile fails with its nearest profile and where it departs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dualbudget.integration.testing import require_live_vllm
from dualbudget.spec.releases import release_of
from tests import vllm_trees
from tests.paths import REPO
from tests.scheduler_plugin import RAISED

pytestmark = pytest.mark.live


def _release() -> str:
    release = release_of(require_live_vllm())
    assert release is not None
    return release.version


@pytest.mark.parametrize("alone", [False, True], ids=["lockstep", "monitor-only"])
def test_a_scheduler_failing_every_step_checks_nothing(alone: bool, tmp_path: Path) -> None:
    require_live_vllm()
    flags = ["--monitor-only"] if alone else []
    done = vllm_trees.dualbudget(
        "fuzz", "--scheduler-cls", "tests.scheduler_plugin:AlwaysRaises", "--examples", "4",
        "--seed", "1", "--layout", "eagle", "--out-dir", str(tmp_path), "--jobs", "1", *flags,
        cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("verdict: ERROR: nothing checked (0 live steps"), verdict
    if alone:
        assert "vLLM crashed, the first in" in verdict, verdict
    else:
        assert f"RuntimeError: {RAISED}" in verdict, verdict


def test_a_field_renamed_in_a_vllm_constructor_is_named_in_one_line(tmp_path: Path) -> None:
    version = vllm_trees.development_version(vllm_trees.installed_version())
    tree = vllm_trees.copy_installed_sources(tmp_path / "tree", version)
    outputs = tree / "vllm" / "v1" / "outputs.py"
    outputs.write_text(outputs.read_text().replace("sampled_token_ids", "sampled_ids"))
    done = vllm_trees.dualbudget(
        "fuzz", "--vllm-src", str(tree), "--examples", "2", "--out-dir", str(tmp_path / "o")
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    # One line says why (torch's or vLLM's own warnings may stand beside it), never a
    # traceback.
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "ModelRunnerOutput takes no 'sampled_token_ids'" in errors[0], errors[0]
    assert "sampled_ids" in errors[0], errors[0]


def test_a_forgotten_refund_fails_on_its_nearest_profile(tmp_path: Path) -> None:
    version = vllm_trees.development_version(vllm_trees.installed_version())
    tree = vllm_trees.forgotten_refund_tree(tmp_path / "tree", version)
    done = vllm_trees.dualbudget(
        "fuzz", "--vllm-src", str(tree), "--examples", "20", "--out-dir", str(tmp_path / "o")
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    verdict = done.stdout.strip().splitlines()[-1]
    own = f"vllm-{_release()}"
    assert re.match(
        rf"verdict: FAIL: vLLM \S+ decides as no profile; nearest {own}, which it first"
        r" departs from on [\w-]+/refund(-one-slot)?: decision at step \d+",
        verdict,
    ), verdict
    # Asked for the monitor alone, the same tree gets the monitor's verdict instead.
    report = tmp_path / "alone.json"
    alone = vllm_trees.dualbudget(
        "fuzz", "--vllm-src", str(tree), "--examples", "20", "--monitor-only",
        "--no-coverage-gate", "--out-dir", str(tmp_path / "m"), "--json", str(report),
    )  # fmt: skip
    assert "contract monitor checks it alone" in alone.stdout, alone.stdout[-3000:]
    # The monitor's verdict (no finding of the manifest is this scheduler's), on steps.
    assert json.loads(report.read_text())["steps"] > 0
    verdict = alone.stdout.strip().splitlines()[-1]
    assert "contract monitor" in verdict, alone.stdout[-2000:]
    assert alone.returncode in (0, 1), alone.stdout[-2000:] + alone.stderr[-2000:]
