"""``simulate --sweep``: a grid of configs x profiles x workloads run as executor units.

The table is merged in unit order and holds no timing, so any width gives the same
document; an unknown grid key is one line and exit 2; the CSV and JSON carry the
columns docs/simulate.md names; a plot per workload is written.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dualbudget.cli import main
from dualbudget.reference.runs.simulate import StepTimeModel, simulate
from dualbudget.reference.runs.sweep import (
    GRID_KEYS,
    ROW_COLUMNS,
    SweepRow,
    cell_scenario,
    parse_grid,
    run_unit,
    sweep_units,
    verdicts,
)
from dualbudget.spec.errors import BadInput

GRID = ["B=128,512", "max_num_seqs=16,64", "K=7"]
PROFILES = ["--profile", "vllm-0.32", "--profile", "dual"]


def _sweep(tmp_path: Path, name: str, *extra: str) -> tuple[dict[str, object], Path]:
    out = tmp_path / name
    argv = [
        "simulate", "--sweep", "--grid", *GRID, *PROFILES,
        "--workload", "dspark-bench", "--workload", "long-prompts",
        "--num-requests", "48", "--quiet",
        "--json", str(out.with_suffix(".json")), "--csv", str(out.with_suffix(".csv")),
        *extra,
    ]  # fmt: skip
    assert main(argv) == 0
    return json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".csv")


def test_the_table_is_the_same_for_one_and_two_jobs(tmp_path: Path) -> None:
    one, csv_one = _sweep(tmp_path, "one", "--jobs", "1")
    two, csv_two = _sweep(tmp_path, "two", "--jobs", "2")
    assert one == two
    assert csv_one.read_text() == csv_two.read_text()
    rows = one["rows"]
    assert isinstance(rows, list)
    # 2 workloads x 4 cells x 2 profiles, in unit order: workload, cell, profile.
    assert len(rows) == 16
    assert [r["profile"] for r in rows[:4]] == ["vllm-0.32", "dual"] * 2
    assert [r["workload"] for r in rows] == ["dspark-bench"] * 8 + ["long-prompts"] * 8


def test_rows_are_the_simulation_of_their_cell(tmp_path: Path) -> None:
    document, _ = _sweep(tmp_path, "t", "--jobs", "1")
    rows = document["rows"]
    assert isinstance(rows, list)
    first = rows[0]
    cell = (("max_num_batched_tokens", 128), ("max_num_seqs", 16), ("num_speculative_tokens", 7))
    scenario = cell_scenario("dspark-bench", 0, 48, cell)
    assert scenario.config.max_num_batched_tokens == 128
    assert scenario.config.num_speculative_tokens == 7
    assert len(scenario.requests) == 48
    result = simulate(scenario.with_profile("vllm-0.32"), "vllm-0.32")
    assert first["steps"] == result.steps
    assert first["output_tokens"] == result.output_tokens
    assert first["output_tokens_per_step"] == result.output_tokens / result.steps
    seconds = result.timing(StepTimeModel())["seconds"]
    assert first["time_per_output_token_s"] == seconds / result.output_tokens


def test_csv_and_json_columns(tmp_path: Path) -> None:
    document, csv_path = _sweep(tmp_path, "c", "--jobs", "1")
    keys = ["max_num_batched_tokens", "max_num_seqs", "num_speculative_tokens"]
    with csv_path.open() as f:
        table = list(csv.reader(f))
    assert table[0] == ["workload", *keys, "profile", *ROW_COLUMNS]
    assert len(table) == 17
    assert document["grid"] == dict(zip(keys, ([128, 512], [16, 64], [7]), strict=True))
    calibration = document["calibration"]
    assert isinstance(calibration, dict) and calibration["name"] == "illustrative"
    rows, cells = document["rows"], document["cells"]
    assert isinstance(rows, list) and isinstance(cells, list)
    assert set(rows[0]) == {"workload", *keys, "profile", *ROW_COLUMNS}
    assert len(cells) == 8
    assert set(cells[0]) == {"workload", *keys, "best_profile", "spread", "differs"}
    # dual's running-request cap at B=128, K=7 is above vllm-0.32's: it drains sooner.
    first = cells[0]
    assert first["best_profile"] == "dual" and first["differs"] is True


def test_a_plot_per_workload(tmp_path: Path) -> None:
    _sweep(tmp_path, "p", "--jobs", "1", "--plot", str(tmp_path / "plots"))
    written = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert written == ["sweep-dspark-bench.png", "sweep-long-prompts.png"]
    for name in written:
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"


def test_an_unknown_grid_key_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--sweep", "--grid", "B=128", "max_batch=4", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown key 'max_batch'" in err and "max_num_seqs" in err


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["B=128,x"], "'x' is not an integer"),
        (["B=0"], "must be >= 1"),
        (["B"], "not KEY=V1,V2"),
        (["B=128", "max_num_batched_tokens=256"], "given twice"),
    ],
)
def test_malformed_grids_are_refused(items: list[str], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        parse_grid(items)


def test_grid_keys_are_vllm_names_and_cells_vary_the_last_fastest() -> None:
    grid = parse_grid(["B=1,2", "max_num_seqs=3,4"])
    assert {key for key, _ in grid.axes} <= set(GRID_KEYS)
    assert [dict(c) for c in grid.cells()] == [
        {"max_num_batched_tokens": b, "max_num_seqs": m} for b in (1, 2) for m in (3, 4)
    ]


def test_a_refused_cell_is_a_row_not_a_failure() -> None:
    # max_num_seqs above B: vLLM's config check refuses it, the sweep records why.
    grid = parse_grid(["B=128", "max_num_seqs=256"])
    [unit] = sweep_units(grid, ["dual"], ["chat-poisson"], seed=0, model=StepTimeModel())
    row = run_unit(unit)
    assert row.refused is not None and "max_num_seqs" in row.refused
    assert row.steps == 0
    [verdict] = verdicts([row], 0.05)
    assert verdict.best is None and not verdict.differs


def test_verdict_ties_go_to_the_profile_listed_first() -> None:
    cell = (("max_num_seqs", 16),)
    rows = [
        SweepRow("w", cell, "a", None, steps=10, output_tokens=20, seconds=1.0),
        SweepRow("w", cell, "b", None, steps=10, output_tokens=20, seconds=1.0),
        SweepRow("w", cell, "c", None, steps=10, output_tokens=20, seconds=1.5),
    ]
    [verdict] = verdicts(rows, 0.4)
    assert verdict.best == "a"
    assert verdict.spread == pytest.approx(0.5)
    assert verdict.differs
    assert not verdicts(rows, 0.5)[0].differs


def test_sweep_refuses_the_single_run_overrides() -> None:
    code = main(["simulate", "--sweep", "--max-num-seqs", "8", "--quiet"])
    assert code == 2


def test_several_workloads_need_sweep() -> None:
    assert main(["simulate", "--workload", "chat-poisson", "--workload", "dspark-bench"]) == 2
