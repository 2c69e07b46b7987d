"""The reach of each finding (proofs/reach.py, ``prove --reach``): every expected failure
has an entry; each region scenario shows its violation through the reference scheduler;
the regions named are what the spec's code does at their edges; and, live, vLLM makes
the reference's decision on each scenario of its own profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dualbudget.proofs.manifest import load_manifest
from dualbudget.proofs.model import Subject, fcfs_step
from dualbudget.proofs.obligations import catalog
from dualbudget.proofs.reach import REACH_BOX, Reach, minimal_witness, reach_rows
from dualbudget.proofs.runner import run_reach
from dualbudget.reach_replay import replay_reach
from dualbudget.reference.formats.scenario import parse_scenario
from dualbudget.spec.invariants import buffer_peak_ok
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import PROFILES

MANIFEST = load_manifest()
FINDINGS = [
    ob.name for ob in catalog() if MANIFEST.expected(ob.name) == "fails" and ob.family != "compiled"
]


@pytest.fixture(scope="module")
def reaches() -> dict[str, Reach]:
    return {r.obligation: r for r in run_reach(catalog(), MANIFEST)}


def test_every_expected_failure_has_one_reach_entry(reaches: dict[str, Reach]) -> None:
    assert sorted(reaches) == sorted(FINDINGS)
    for r in reaches.values():
        assert [k.k for k in r.per_k] == list(range(REACH_BOX.k[0], REACH_BOX.k[1] + 1))
        assert "unknown" not in r.region(), r.obligation
        data = r.to_json()
        assert data["region"] == r.region() and data["ks"] == r.ks
        assert set(data) >= {"obligation", "region", "event_flow", "reachable", "per_k"}


@pytest.mark.parametrize("name", FINDINGS)
def test_each_region_scenario_shows_its_violation_in_the_reference(
    reaches: dict[str, Reach], name: str
) -> None:
    r = reaches[name]
    if not r.ks:
        assert r.region() == "none" and r.scenario is None
        return
    assert r.scenario is not None, f"{name}: a realistic region but no scenario"
    cfg = r.config
    assert cfg is not None
    assert REACH_BOX.b[0] <= cfg["B"] <= REACH_BOX.b[1]
    assert REACH_BOX.m[0] <= cfg["max_num_seqs"] <= REACH_BOX.m[1]
    assert cfg["K"] in r.ks
    shown = replay_reach(r.profile, r.contract, r.check, r.scenario)
    assert shown is not None, f"{name}: the reference does not show it: {r.broken}"


def test_vllm_032_fill_in_overflow_region_is_its_line(reaches: dict[str, Reach]) -> None:
    r = reaches["vllm-0.32/dspark-fill-in/C3"]
    assert r.region() == "K=1..8: accepted, B <= (K + 1)*max_num_seqs - 1"
    assert r.decodes is False  # steady-state decodes (q = 1 + K) cannot overflow it
    subject = Subject("vllm-0.32", PROFILES["vllm-0.32"].policy)
    layout = layout_named("dspark-fill-in")
    for k, m in ((1, 300), (4, 200), (8, 100)):
        # On the line: max_num_seqs one-token prompts overflow B ...
        b = (k + 1) * m - 1
        p = StepParams(b, b, m, k, layout)
        run = fcfs_step(subject, p, [1] * m)
        assert not buffer_peak_ok(p, b, run.target, run.draft)
        # ... one past it, the same queue fits.
        p = StepParams(b + 1, b + 1, m, k, layout)
        run = fcfs_step(subject, p, [1] * m)
        assert buffer_peak_ok(p, b + 1, run.target, run.draft)


def test_vllm_033_admission_finding_has_no_realistic_reach(reaches: dict[str, Reach]) -> None:
    # 0.33 refuses B <= num_lookahead_tokens <= K + 1 = 9, far below B = 512.
    for name, r in reaches.items():
        if name.startswith("vllm-0.33/") and name.endswith("/C4-converse"):
            assert r.region() == "none" and r.event_flow() == "no"


def test_reach_rows_name_the_minimal_witness() -> None:
    table = (
        "witness for x (C3)\n  config: max_num_batched_tokens=1 max_num_scheduled_tokens=1"
        " max_num_seqs=1 K=1 layout=dspark-fill-in\n  broken: C3: D=2 > B=1"
    )
    assert minimal_witness(table) == "B=1 S=1 max_num_seqs=1 K=1: C3: D=2 > B=1"
    r = Reach("p/l/C3", "p", "l", "C3", "C3")
    rows = reach_rows([r], {"p/l/C3": minimal_witness(table)})
    assert rows[0] == [
        "finding",
        "minimal witness",
        "realistic region",
        "reachable in the event flow",
    ]
    assert rows[1][:3] == ["p/l/C3", minimal_witness(table), "none"]


def test_prove_reach_writes_the_reach_list_and_scenarios(tmp_path: Path) -> None:
    out = tmp_path / "prove.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "dualbudget", "prove", "--profile", "pr-52996",
            "--layout", "dspark-fill-in", "--reach", "--json", str(out),
            "--witness-dir", str(tmp_path / "w"),
        ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert "reach of each finding" in done.stdout
    data = json.loads(out.read_text())
    names = [r["obligation"] for r in data["reach"]]
    assert names == ["pr-52996/dspark-fill-in/C3"]
    entry = data["reach"][0]
    assert entry["reachable"] and Path(entry["scenario"]).is_file()
    scenario = json.loads(Path(entry["scenario"]).read_text())
    parse_scenario(scenario)
    schedule = subprocess.run(
        [sys.executable, "-m", "dualbudget", "schedule", entry["scenario"], "--max-steps", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # The scenario runs, and the reference stops at the finding: C3 broken in step 0.
    assert schedule.returncode == 1, schedule.stderr
    assert "contract C3 broken at step 0" in schedule.stderr


@pytest.mark.live
def test_live_vllm_makes_the_reference_decision_on_its_reach_scenarios(
    reaches: dict[str, Reach],
    profile: str,
) -> None:
    from dualbudget.integration.lockstep import run_in_lockstep

    findings = [r for r in reaches.values() if r.profile == profile]
    assert findings, f"no finding of {profile} to confirm"
    confirmable = [r for r in findings if r.scenario is not None and r.check != "C4-converse"]
    if not confirmable:
        # Every finding of the release is an admission check stricter than needed
        # (C4-converse, 0.34's only kind): a config vLLM refuses, no scenario to run.
        assert {r.check for r in findings} == {"C4-converse"}, [r.obligation for r in findings]
    for r in confirmable:
        assert r.scenario is not None
        steps, divergence = run_in_lockstep(parse_scenario(r.scenario), max_steps=1)
        assert divergence is None, f"{r.obligation}: {divergence.report()}"
        assert steps == 1
        assert replay_reach(r.profile, r.contract, r.check, r.scenario) is not None


def test_the_design_review_carries_the_reach_table(tmp_path: Path) -> None:
    from dualbudget.proofs.runner import run, select
    from dualbudget.report import reach_lines

    obligations = select(["fork-605"], ["dspark-fill-in"])
    outcomes = run(obligations, MANIFEST)
    lines = reach_lines(obligations, outcomes, MANIFEST, tmp_path)
    text = "\n".join(lines)
    assert "### The reach of each finding" in text
    assert "| finding | minimal witness | realistic region | reachable in the event flow |" in text
    row = next(row for row in text.splitlines() if row.startswith("| fork-605/dspark-fill-in/C3 |"))
    assert "B <= (K + 1)*max_num_seqs - 1" in row
    assert "C3: D=" in row  # the reference replay shows the overflow
    assert (tmp_path / "witnesses" / "reach" / "fork-605__dspark-fill-in__C3.json").is_file()
