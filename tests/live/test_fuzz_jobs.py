"""The fuzz in worker processes (``--jobs``) and with a scheduler class of the user's own
(``--scheduler-cls``), against the installed vLLM (docs/vllm-environments.md).

Every (layout, aim) unit is seeded by ``unit_seed`` alone and the units are merged in unit
order, so ``--jobs 1`` and ``--jobs 2`` give the same examples, steps and coverage; a
scheduler class given by its import path reaches the live schedulers of every worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dualbudget.cli import main
from dualbudget.integration.aims import AIMS
from dualbudget.integration.fuzz import FuzzPlan, run_fuzz
from dualbudget.integration.outcome import FuzzResult
from dualbudget.integration.testing import live_profile_name, require_live_vllm

pytestmark = pytest.mark.live

LAYOUTS = ["ngram", "dflash"]


def _fuzz(tmp_path: Path, jobs: int) -> FuzzResult:
    return run_fuzz(
        FuzzPlan(
            profile=live_profile_name(),
            vllm_version=require_live_vllm(),
            examples=2 * len(AIMS),  # one unit per (layout, aim)
            seed=5,
            out_dir=tmp_path / f"jobs{jobs}",
            known_findings=frozenset(),
            layouts=LAYOUTS,
            jobs=jobs,
        )
    )


def _totals(result: FuzzResult) -> dict[str, Any]:
    return {
        "examples": result.examples,
        "steps": result.steps,
        "coverage": result.coverage,
        "examples_by_unit": result.examples_by_unit,
        "refused_configs": result.refused_configs,
        "mirrored_crashes": result.mirrored_crashes,
        "divergences": [d.to_json() for d in result.divergences],
        "findings": [(f.key, f.step) for f in result.findings],
    }


def test_one_and_two_jobs_give_the_same_run(tmp_path: Path) -> None:
    one, two = _fuzz(tmp_path, 1), _fuzz(tmp_path, 2)
    assert one.examples >= 2 * len(AIMS) and one.steps > 0
    assert set(one.examples_by_unit) == {f"{lay}/{aim}" for lay in LAYOUTS for aim in AIMS}
    assert _totals(one) == _totals(two)


def test_a_scheduler_class_of_ones_own_is_checked_in_every_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheduler_plugin: str
) -> None:
    out = tmp_path / "fuzz.json"
    argv = ["fuzz", "--scheduler-cls", scheduler_plugin, "--layout", "ngram", "--examples", "8"]
    argv += ["--seed", "1", "--jobs", "2", "--json", str(out), "--out-dir", str(tmp_path)]
    assert main(argv) == 1
    result = json.loads(out.read_text())
    [divergence] = result["divergences"]
    assert divergence["kind"] == "decision" and Path(divergence["scenario"]).exists()
    assert f"scheduler {scheduler_plugin}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("no_such_module_here.Scheduler", "is not importable"),
        ("dualbudget.integration.live:NoSuchClass", "has no 'NoSuchClass'"),
        ("dualbudget.integration.live:ENVIRONMENT", "not a class"),
        ("collections:OrderedDict", "not a subclass of vLLM's"),
        ("Scheduler", "not of the form module:Class"),
    ],
)
@pytest.mark.parametrize("command", ["fuzz", "check"])
def test_a_bad_scheduler_class_is_bad_input(
    command: str, path: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    require_live_vllm()
    assert main([command, "--scheduler-cls", path]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith(f"dualbudget {command}: error: --scheduler-cls {path!r}: ")
    assert why in line
    assert "== proofs" not in captured.out  # refused before any stage ran
