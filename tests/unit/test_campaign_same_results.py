"""``campaign.same_results``: two runs' JSON compared with their timings left out, the
first difference named, at any depth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualbudget.campaign.same_results import first_difference, main

RUN = {
    "examples": 200,
    "seconds": 51.2,
    "warm_up_seconds": 12.0,
    "coverage_by_method": {"ngram": {"preempt": 3, "bound": 1}},
    "divergences": [],
    "mutants": [{"name": "control", "status": "survived", "seconds": 1.5}],
}


def _with(**changes: object) -> dict[str, object]:
    return json.loads(json.dumps({**RUN, **changes}))  # type: ignore[no-any-return]


def test_timings_alone_differing_is_the_same() -> None:
    other = _with(seconds=99.0, warm_up_seconds=0.1)
    other["mutants"][0]["seconds"] = 7.0  # type: ignore[index]
    assert first_difference(RUN, other) is None


@pytest.mark.parametrize(
    ("other", "where"),
    [
        (_with(examples=201), "$.examples: 200 != 201"),
        (
            _with(coverage_by_method={"ngram": {"preempt": 4, "bound": 1}}),
            "$.coverage_by_method.ngram.preempt: 3 != 4",
        ),
        (_with(divergences=[{"step": 3}]), "$.divergences: 0 items != 1 items"),
        (_with(mutants=[{"name": "control", "status": "killed"}]), "$.mutants[0].status"),
        (_with(coverage_by_method={"ngram": {"preempt": 3}}), "bound: only in A"),
        (_with(examples=200.0), "$.examples: 200 != 200.0"),
    ],
)
def test_the_first_difference_is_named(other: dict[str, object], where: str) -> None:
    found = first_difference(RUN, other)
    assert found is not None
    assert where in found


def test_the_command_exits_by_sameness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(RUN))
    b.write_text(json.dumps(_with(seconds=1.0)))
    c.write_text(json.dumps(_with(examples=7)))
    assert main([str(a), str(b)]) == 0
    assert "the same, timings aside" in capsys.readouterr().out
    assert main([str(a), str(c)]) == 1
    assert capsys.readouterr().out.strip().endswith("differ at $.examples: 200 != 7")
    assert main([str(a), str(tmp_path / "missing.json")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("same_results: error:") and "missing.json" in line
