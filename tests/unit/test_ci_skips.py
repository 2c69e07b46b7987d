"""tests/conftest.py: under CI=true every skip fails its run; elsewhere a skip is a skip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

CONFTEST = REPO / "tests" / "conftest.py"

SKIPS_IN_A_TEST = """
import pytest

def test_skipped():
    pytest.skip("no vLLM here")

@pytest.mark.xfail(reason="expected")
def test_expected_failure():
    assert False

def test_passes():
    pass
"""

SKIPS_AT_COLLECTION = """
import pytest

pytest.skip("no vLLM here", allow_module_level=True)
"""


def _run(tmp_path: Path, source: str, ci: str | None) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_planted.py").write_text(source)
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("source", [SKIPS_IN_A_TEST, SKIPS_AT_COLLECTION])
def test_a_skip_fails_the_run_under_ci(tmp_path: Path, source: str) -> None:
    run = _run(tmp_path, source, "true")
    assert run.returncode != 0, run.stdout
    assert "CI=true: a skipped test fails the run. Skipped because:" in run.stdout
    assert "no vLLM here" in run.stdout


def test_the_failure_is_the_skipped_test_alone(tmp_path: Path) -> None:
    run = _run(tmp_path, SKIPS_IN_A_TEST, "true")
    assert "1 failed, 1 passed, 1 xfailed" in run.stdout, run.stdout


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_a_skip_stays_a_skip(tmp_path: Path, ci: str | None) -> None:
    run = _run(tmp_path, SKIPS_IN_A_TEST, ci)
    assert run.returncode == 0, run.stdout
    assert "1 passed, 1 skipped, 1 xfailed" in run.stdout, run.stdout
