"""No reference run imports z3: ``dualbudget schedule`` on every shipped example, and the
reference scheduler driven through a scenario under every profile, each in a fresh
interpreter whose ``sys.modules`` is read at the end. The budget rules they run are the
spec's ``StepBook`` on ints (``spec.arith`` imports z3 only when handed a z3 term)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.json"))


def _run_without_z3(code: str) -> str:
    probe = code + "\nimport sys\nprint('z3 loaded:', 'z3' in sys.modules)\n"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_schedule_imports_no_z3(example: Path) -> None:
    out = _run_without_z3(
        "import contextlib, io\n"
        "from dualbudget.cli import main\n"
        "sink = io.StringIO()\n"
        "with contextlib.redirect_stdout(sink):\n"
        f"    code = main(['schedule', {str(example)!r}])\n"
        "assert code == 0, code\n"
        "assert sink.getvalue().count('\\n') >= 1\n"
    )
    assert out.strip().endswith("z3 loaded: False"), out


def test_a_scenario_run_under_every_profile_imports_no_z3() -> None:
    out = _run_without_z3(
        "from dualbudget.reference.runs.driver import ScenarioRun\n"
        "from dualbudget.reference.formats.scenario import ScenarioError, load_scenario\n"
        "from dualbudget.spec.profiles import PROFILE_NAMES\n"
        "steps = 0\n"
        f"for path in {[str(path) for path in EXAMPLES]!r}:\n"
        "    for profile in PROFILE_NAMES:\n"
        "        try:\n"
        "            run = ScenarioRun(load_scenario(path), profile=profile, check='collect')\n"
        "        except ScenarioError:\n"
        "            continue  # a config this profile refuses\n"
        "        steps += sum(1 for _ in run.records())\n"
        "print('steps:', steps)\n"
    )
    assert "z3 loaded: False" in out, out
    assert int(out.split("steps:")[1].split()[0]) > 0, out


def test_the_probe_sees_z3_when_it_is_loaded() -> None:
    out = _run_without_z3("import dualbudget.proofs.obligations")
    assert "z3 loaded: True" in out, out
