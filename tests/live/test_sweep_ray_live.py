"""``simulate --sweep``, ``diff --search`` and ``prove --reach`` on a local Ray: the same
answers as the local executor's. Ray is pinned in the vLLM environments only, so these run
with the live suite there (a local Ray of 2 CPUs, started without network access)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dualbudget.cli import main
from tests.ray_support import RAY_GROUP

pytestmark = [pytest.mark.live, RAY_GROUP]

SWEEP = [
    "simulate", "--sweep", "--grid", "B=128,512", "max_num_seqs=16,64", "K=7",
    "--profile", "vllm-0.32", "--profile", "dual", "--workload", "dspark-bench",
    "--workload", "chat-poisson", "--num-requests", "32", "--quiet",
]  # fmt: skip


def _json(argv: list[str], path: Path) -> dict[str, Any]:
    assert main([*argv, "--json", str(path)]) == 0
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_sweep_on_ray_gives_the_local_table(tmp_path: Path) -> None:
    local = _json([*SWEEP, "--jobs", "2", "--csv", str(tmp_path / "l.csv")], tmp_path / "l.json")
    ray = _json(
        [*SWEEP, "--executor", "ray", "--jobs", "2", "--csv", str(tmp_path / "r.csv")],
        tmp_path / "r.json",
    )
    assert ray == local
    assert (tmp_path / "r.csv").read_text() == (tmp_path / "l.csv").read_text()
    assert len(local["rows"]) == 16


def test_search_and_reach_on_ray_give_the_local_answers(tmp_path: Path) -> None:
    search = [
        "diff", "--profile", "vllm-0.32", "--profile", "dual", "--layout", "dflash",
        "--search", "--seed", "1", "--seeds", "2", "--examples", "8", "--max-seconds", "300",
    ]  # fmt: skip
    answers = []
    for name, extra in (("local", []), ("ray", ["--executor", "ray"])):
        out = tmp_path / f"{name}-found.json"
        data = _json([*search, *extra, "--jobs", "2", "--out", str(out)], tmp_path / "d.json")
        data.pop("seconds")
        data.pop("scenario")
        for proof in data["layouts"].values():
            proof["reason"] = proof["reason"].split(" (")[0]  # a z3 model's config
        data["separated_by"] = data["separated_by"].split(" (")[0]
        answers.append((data, out.read_text()))
    assert answers[0] == answers[1]
    reach = ["prove", "--profile", "global-reserve", "--layout", "dflash", "--reach", "--jobs", "2"]
    runs = []
    for name, extra in (("local", []), ("ray", ["--executor", "ray"])):
        witnesses = tmp_path / f"w-{name}"
        data = _json([*reach, *extra, "--witness-dir", str(witnesses)], tmp_path / "p.json")
        for r in data["reach"]:
            r.pop("seconds")
            if r.get("scenario"):
                r["scenario"] = Path(r["scenario"]).relative_to(witnesses).as_posix()
        runs.append(data["reach"])
    assert runs[0] == runs[1] and len(runs[0]) == 2
