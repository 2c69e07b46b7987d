"""benchmarks/campaign_model.py: the model's arithmetic, and its ``fuzz`` command end to
end on canned runs (no vLLM): the units read from the serial run's progress lines, the
prediction for 2 workers, the JSON compared across executors, the campaign's table."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import REPO


def _model() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "campaign_model", REPO / "benchmarks" / "campaign_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclasses look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


model = _model()


def test_list_scheduling_and_rounds() -> None:
    assert model.makespan([3.0, 1.0, 1.0, 1.0], 2) == 3.0
    assert model.makespan([1.0, 1.0], 2, per_unit=0.5) == 1.5
    # Rounds run one after the other: the start once, then each round's makespan.
    assert model.predict_rounds([[2.0, 2.0], [1.0]], 2, model.Overhead(5.0)) == 8.0
    units = [("a/mixed", 1.0), ("b/edge-top-up1", 2.0), ("c/lone", 3.0), ("a/x-top-up2", 4.0)]
    assert model._rounds(units) == [[1.0, 3.0], [2.0], [4.0]]


def test_a_campaign_map_holds_seeds_for_two_units_a_worker() -> None:
    # 90 units a seed: one seed a map on 2 workers, six on 256.
    assert model.campaign_maps([1.0] * 90, 3, 2) == [[1.0] * 90] * 3
    assert model.campaign_maps([1.0] * 90, 8, 256) == [[1.0] * 540, [1.0] * 180]


UNIT_LINES = """  ngram/mixed                 10 examples    100 steps    4.0s  (total ...)
  ngram/edge                   5 examples     50 steps    4.0s  (total ...)
  eagle/mixed                 10 examples    100 steps    2.0s  (total ...)
  top-up round 1: ...
  ngram/edge-top-up1          10 examples    100 steps    2.0s  (total ...)
"""


def test_the_fuzz_command_predicts_compares_and_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    walls = {"1": 20.0, "2": 16.0, "ray": 30.0}

    def dualbudget(*args: str) -> tuple[float, str]:
        name = "ray" if "ray" in args else args[args.index("--jobs") + 1]
        run = {"examples": 35, "seconds": walls[name], "coverage": {"preempt": 3}}
        if name == "ray":
            run["coverage"] = {"preempt": 4}
        Path(args[args.index("--json") + 1]).write_text(json.dumps(run))
        return walls[name], UNIT_LINES if name == "1" else ""

    def cpu_share(workers: int, seconds: float = 4.0) -> float:
        return 1.0

    monkeypatch.setattr(model, "dualbudget", dualbudget)
    monkeypatch.setattr(model, "cpu_share", cpu_share)
    result = model.fuzz_command(200, True, str(tmp_path))
    out = capsys.readouterr().out
    # The start: the serial wall less its units (20 - 12); then the planned units on 2
    # workers (4, 4, 2: 6 s) and the top-up round (2 s).
    assert result["start_cpu_seconds"] == 8.0
    assert result["predicted_2"] == 16.0
    assert "predicted 16.0 s, measured 16.0 s (--jobs 2): +0.0%" in out
    assert result["json_differences"]["jobs 2"] is None
    assert result["json_differences"]["ray"] == "$.coverage.preempt: 3 != 4"
    assert "JSON of ray against jobs 1: $.coverage.preempt: 3 != 4" in out
    # 500 seeds of the 3 planned units after 8 s of start: on one worker a seed a map,
    # 500 x 10 s; on two, two seeds a map (4, 4, 2, 4, 4, 2), 250 x 10 s.
    table: dict[int, float] = result["model"]
    assert table[1] == pytest.approx(8.0 + 500 * 10.0)
    assert table[2] == pytest.approx(8.0 + 250 * 10.0)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "fuzz-jobs-1.json", "fuzz-jobs-2.json", "fuzz-ray.json",
    ]  # fmt: skip
    loads: Sequence[float] = result["runs"]["jobs 2"]["load"]
    assert len(loads) == 3
