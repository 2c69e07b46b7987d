"""Named calibrations of the step-time model: the exact fit, its provenance, the
published dspark-bench ratio reproduced through the simulator, and every output naming the
calibration in use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualbudget.cli import main
from dualbudget.reference.runs.simulate import (
    CALIBRATIONS,
    DEFAULT_CALIBRATION,
    DSPARK_QWEN3_8B_RUNS,
    PublishedRun,
    SimResult,
    StepTimeModel,
    calibration_named,
    fit_exactly,
    to_json,
)
from dualbudget.reference.runs.workload import preset
from dualbudget.simulate_cli import run_profiles
from dualbudget.spec.errors import BadInput

PUBLISHED = "published-dspark-qwen3-8b"
PUBLISHED_RATIO = 3574.55 / 2928.34  # 1.221, output tok/s of the proposal over vLLM 0.32


def test_exact_fit_solves_two_runs_and_holds_the_ratio() -> None:
    runs = (
        PublishedRun("x", 10.0, 0, 0, 0, steps=100, target_rows=1000, draft_rows=400),
        PublishedRun("y", 8.0, 0, 0, 0, steps=50, target_rows=1200, draft_rows=400),
    )
    model = fit_exactly(runs, 0.5)
    # 100a + 1200b = 10 and 50a + 1400b = 8: b = 6 / 1600, a = 0.055
    assert model.b == pytest.approx(6 / 1600) and model.c == pytest.approx(3 / 1600)
    assert model.a == pytest.approx(0.055)
    assert [r.seconds(model) for r in runs] == [pytest.approx(10.0), pytest.approx(8.0)]
    with pytest.raises(ValueError, match="two runs"):
        fit_exactly(runs[:1], 0.5)
    with pytest.raises(ValueError, match="collinear"):
        fit_exactly((runs[0], runs[0]), 0.5)


def test_published_calibration_states_its_provenance_and_residual() -> None:
    calibration = CALIBRATIONS[PUBLISHED]
    assert calibration.workload == "dspark-bench" and calibration.runs == DSPARK_QWEN3_8B_RUNS
    assert "Qwen3-8B" in calibration.provenance and "716.16" in calibration.provenance
    model = calibration.model
    assert model.a > 0 and model.b > 0 and model.c == pytest.approx(0.25 * model.b)
    assert all(abs(r) < 1e-6 for r in calibration.residuals())
    notes = "\n".join(calibration.notes())
    assert "zero by construction, two runs fit two coefficients exactly" in notes
    # The mean ITL, not fitted, is within 3% of the predicted mean step time.
    for run in calibration.runs:
        step_ms = 1000 * run.seconds(model) / run.steps
        assert step_ms == pytest.approx(run.mean_itl_ms, rel=0.03)
        assert f"{step_ms:.2f} vs {run.mean_itl_ms:.2f}" in notes
    default = CALIBRATIONS[DEFAULT_CALIBRATION]
    assert default.model == StepTimeModel() and not default.runs
    assert "fitted to no measurement" in default.provenance


def test_unknown_calibration_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BadInput, match="unknown calibration 'nope'"):
        calibration_named("nope")
    assert main(["simulate", "--workload", "dspark-bench", "--calibration", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dualbudget simulate: error:") and err.count("\n") == 1
    assert PUBLISHED in err


@pytest.fixture(scope="module")
def dspark_bench() -> list[SimResult]:
    """The published workload, simulated under the two profiles of the published runs."""
    scenario = preset("dspark-bench").scenario(0)
    return run_profiles(scenario, [run.profile for run in DSPARK_QWEN3_8B_RUNS], quiet=True)


def test_stored_totals_are_the_simulators(dspark_bench: list[SimResult]) -> None:
    for run, result in zip(DSPARK_QWEN3_8B_RUNS, dspark_bench, strict=True):
        assert result.profile == run.profile
        assert (result.steps, sum(result.target_per_step), sum(result.draft_per_step)) == (
            run.steps,
            run.target_rows,
            run.draft_rows,
        )
        assert result.output_tokens == 4096 * 512
        # The simulated acceptance length (a request's output tokens per step it decodes)
        # is the published one: the workload's acceptance rates are that run's.
        spot = result.summary()["steps_per_output_token"]
        assert 1 / spot == pytest.approx(run.acceptance_length, rel=0.02)


def test_calibrated_dspark_bench_reproduces_the_published_ratio(
    dspark_bench: list[SimResult],
) -> None:
    doc = to_json("dspark-bench", dspark_bench, CALIBRATIONS[PUBLISHED])
    assert doc["calibration"]["name"] == PUBLISHED
    old, new = doc["profiles"]
    assert new["tokens_per_s"] / old["tokens_per_s"] == pytest.approx(PUBLISHED_RATIO, abs=0.04)
    assert old["seconds"] == pytest.approx(716.16, rel=1e-6)
    assert new["seconds"] == pytest.approx(586.69, rel=1e-6)
    assert old["tokens_per_s"] == pytest.approx(2928.34, rel=1e-3)
    # Uncalibrated, the same decisions predict a ratio far from the measurement.
    plain = to_json("dspark-bench", dspark_bench)
    assert plain["calibration"]["name"] == DEFAULT_CALIBRATION
    ratio = plain["profiles"][1]["tokens_per_s"] / plain["profiles"][0]["tokens_per_s"]
    assert abs(ratio - PUBLISHED_RATIO) > 0.2


def write_small_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {
                "profile": "dual",
                "config": {
                    "max_num_batched_tokens": 16,
                    "max_num_seqs": 4,
                    "max_model_len": 64,
                    "block_size": 4,
                    "num_gpu_blocks": 64,
                    "speculative_config": {"method": "dspark", "num_speculative_tokens": 3},
                },
                "requests": [{"id": str(i), "prompt_len": 1, "max_tokens": 3} for i in range(4)],
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        ([], DEFAULT_CALIBRATION),
        (["--calibration", PUBLISHED], PUBLISHED),
        (["--calibration", PUBLISHED, "--step-time-a", "0.001"], "custom"),
    ],
)
def test_table_and_json_name_the_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], name: str
) -> None:
    out = tmp_path / "out.json"
    path = write_small_scenario(tmp_path)
    assert main(["simulate", "--scenario", str(path), "--json", str(out), *flags]) == 0
    text = capsys.readouterr().out
    assert f"calibration {name}" in text
    doc = json.loads(out.read_text())
    assert doc["calibration"]["name"] == name
    expected = CALIBRATIONS[PUBLISHED if flags else DEFAULT_CALIBRATION].model
    assert doc["calibration"]["b"] == pytest.approx(expected.b)
    if name == "custom":
        assert doc["calibration"]["a"] == 0.001
        assert PUBLISHED in doc["calibration"]["provenance"]
    for profile in doc["profiles"]:
        assert profile["seconds"] > 0
        assert profile["tokens_per_s"] == pytest.approx(
            profile["output_tokens"] / profile["seconds"]
        )


def test_report_lists_the_profiles_and_the_calibration() -> None:
    from dualbudget.report import REPORT_PROFILES, calibration_lines, profiles_section

    assert {"pr-53080", "pr-52996", "fork-605"} <= set(REPORT_PROFILES)
    section = "\n".join(profiles_section())
    for thread in (
        "vllm-project/vllm#53080",
        "vllm-project/vllm#52996",
        "local-inference-lab/vllm#605",
    ):
        assert thread in section
    lines = "\n".join(calibration_lines(PUBLISHED))
    assert f"in use: **{PUBLISHED}**" in lines and "zero by construction" in lines
    assert f"calibration {DEFAULT_CALIBRATION}:" in lines  # the other one, listed
