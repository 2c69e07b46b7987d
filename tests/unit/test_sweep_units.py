"""``diff --search`` and ``prove --reach`` on the executor seam: the same answers for any
width, each unit's answer what a run of that unit alone gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dualbudget.cli import main
from dualbudget.diff_cli import prove_layout, search

SEARCH = [
    "diff", "--profile", "vllm-0.32", "--profile", "dual",
    "--layout", "dflash", "--layout", "p-eagle", "--search",
    "--seed", "1", "--seeds", "2", "--examples", "12", "--max-seconds", "300",
]  # fmt: skip


def _run(argv: list[str], json_path: Path) -> dict[str, Any]:
    assert main([*argv, "--json", str(json_path)]) == 0
    data: dict[str, Any] = json.loads(json_path.read_text())
    return data


def test_diff_search_gives_the_same_answer_for_one_and_two_jobs(tmp_path: Path) -> None:
    answers = []
    for jobs in ("1", "2"):
        out = tmp_path / f"found-{jobs}.json"
        data = _run([*SEARCH, "--jobs", jobs, "--out", str(out)], tmp_path / f"d{jobs}.json")
        data.pop("seconds")
        assert data.pop("scenario") == str(out)
        # The separating config is z3's least one, whatever the solver did before in
        # the process: compared like the rest.
        answers.append((data, out.read_text()))
    assert answers[0] == answers[1]
    data = answers[0][0]
    # p-eagle: z3 proves the two the same, so only dflash is searched, seed by seed.
    assert data["layouts"]["p-eagle"]["proved_equal"] is True
    assert data["layouts"]["dflash"]["proved_equal"] is False
    assert [(u["layout"], u["seed"]) for u in data["units"]] == [("dflash", 1), ("dflash", 2)]
    assert data["examples"] == sum(u["examples"] for u in data["units"])
    assert data["differs"] is True and data["layout"] == "dflash"


def test_each_search_unit_answers_what_a_local_run_gives(tmp_path: Path) -> None:
    data = _run([*SEARCH, "--jobs", "2", "--out", str(tmp_path / "s.json")], tmp_path / "d.json")
    for unit in data["units"]:
        at = prove_layout(("vllm-0.32", "dual", unit["layout"])).separations
        found = search("vllm-0.32", "dual", unit["layout"], unit["seed"], 12, 300, at)
        assert found.at_separation == unit["at_separation"] > 0
        assert found.examples == unit["examples"]
        assert found.best is not None
        _, result = found.best
        gap = result.totals[0].tokens_per_step - result.totals[1].tokens_per_step
        assert unit["score"] == [abs(result.steps_gap()), abs(gap), 1]
    best = max(data["units"], key=lambda u: u["score"])
    steps = {p: t["steps"] for p, t in data["totals"].items()}
    assert abs(steps["vllm-0.32"] - steps["dual"]) == best["score"][0]


def test_diff_search_proved_equal_everywhere_runs_no_search(tmp_path: Path) -> None:
    argv = [
        "diff", "--profile", "dual", "--profile", "pr-53080", "--layout", "dspark-anchor",
        "--search", "--jobs", "2",
    ]  # fmt: skip
    data = _run(argv, tmp_path / "d.json")
    assert data["proved_equal"] is True and data["differs"] is False
    assert "units" not in data and "scenario" not in data


def _reach(data: dict[str, Any]) -> list[dict[str, Any]]:
    reaches: list[dict[str, Any]] = data["reach"]
    for r in reaches:
        r.pop("seconds", None)
    return reaches


def test_prove_reach_gives_the_same_reach_for_one_and_two_jobs(tmp_path: Path) -> None:
    argv = ["prove", "--profile", "global-reserve", "--layout", "dflash", "--reach"]
    runs = []
    for jobs in ("1", "2"):
        witnesses = tmp_path / f"w{jobs}"
        data = _run([*argv, "--jobs", jobs, "--witness-dir", str(witnesses)], tmp_path / "p.json")
        reaches = _reach(data)
        for r in reaches:
            if r.get("scenario"):
                r["scenario"] = Path(r["scenario"]).relative_to(witnesses).as_posix()
        runs.append(reaches)
    assert runs[0] == runs[1]
    assert [r["obligation"] for r in runs[0]] == [
        "global-reserve/dflash/C4-converse",
        "global-reserve/dflash/C5",
    ]


def test_prove_refuses_an_unknown_executor() -> None:
    argv = ["prove", "--profile", "dual", "--layout", "dflash", "--reach", "--executor", "slurm"]
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
