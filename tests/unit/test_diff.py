"""``dualbudget diff``: the first differing step and the totals (reference/runs/diff.py), the
z3 check of whether two profiles can differ at all (proofs/same_decisions.py), the seeded
search and its scenario, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dualbudget.diff_cli import SEARCH_BOUNDS, _caps, candidates_at
from dualbudget.proofs.same_decisions import Bounds, Separation, same_decisions
from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, Scenario, validate
from dualbudget.reference.runs.diff import compare
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import layout_named

BOUNDS = Bounds((512, 2048), (16, 256), (1, 8))


def _dflash(prompts: list[int]) -> Scenario:
    config = EngineConfig(
        max_num_batched_tokens=64,
        max_num_seqs=8,
        max_model_len=256,
        block_size=16,
        num_gpu_blocks=256,
        speculative_config=SpeculativeConfig("dflash", 4, True),
    )
    requests = tuple(RequestSpec(str(i), n, 4) for i, n in enumerate(prompts))
    return validate(Scenario("vllm-0.32", config, requests, Acceptance(fixed=2)))


def _dualbudget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dualbudget", *args], capture_output=True, text=True, timeout=600
    )


def test_a_long_dflash_prompt_separates_vllm_032_from_dual_in_step_0() -> None:
    # 0.32 charges q + K: a 100-token prompt gets 64 - 4 = 60; dual charges K + 1 rows of
    # the draft budget and gives it all 64.
    result = compare(_dflash([100]), "vllm-0.32", "dual")
    assert result.differs and result.first is not None
    assert result.first.step == 0 and result.first.requests == ["0"]
    got = {p: d["num_scheduled_tokens"]["0"] for p, d in result.first.decisions.items()}
    assert got == {"vllm-0.32": 60, "dual": 64}
    a, b = result.totals
    assert a.drained and b.drained
    assert a.output_tokens == b.output_tokens == 4
    assert b.steps <= a.steps
    data = result.to_json()
    assert set(data) == {"profiles", "differs", "first_step", "totals"}
    assert data["first_step"]["step"] == 0


def test_a_profile_against_itself_never_differs() -> None:
    result = compare(_dflash([100, 3, 40]), "dual", "dual")
    assert not result.differs and result.first is None
    assert result.totals[0].to_json() == {**result.totals[1].to_json(), "profile": "dual"}


def test_z3_proves_the_proposal_53080_is_dual_and_separates_033_by_its_cap() -> None:
    assert same_decisions("dual", "pr-53080", "dflash", BOUNDS).equal
    apart = same_decisions("vllm-0.33", "dual", "dflash", BOUNDS)
    assert not apart.equal
    # 0.33's per-step grants are dual's from every tied state: only the running cap
    # min(max_num_seqs, B // (K + 1)) separates them.
    assert apart.reason.startswith("their caps on running requests")
    assert "granted differently" not in apart.reason
    assert "granted differently" in same_decisions("vllm-0.32", "dual", "dflash", BOUNDS).reason


def test_diff_cli_on_a_scenario_writes_the_json(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_dflash([100, 7]).to_json()))
    out = tmp_path / "d.json"
    done = _dualbudget(
        "diff", "--profile", "vllm-0.32", "--profile", "dual", "--scenario", str(path),
        "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "first differing step: 0" in done.stdout
    data = json.loads(out.read_text())
    assert set(data) == {"profiles", "differs", "first_step", "totals", "scenario"}
    assert data["profiles"] == ["vllm-0.32", "dual"] and data["differs"] is True


def test_diff_search_finds_a_dflash_difference_and_writes_a_scenario(tmp_path: Path) -> None:
    out, scenario = tmp_path / "d.json", tmp_path / "found.json"
    done = _dualbudget(
        "diff", "--profile", "vllm-0.32", "--profile", "dual", "--layout", "dflash",
        "--search", "--seed", "1", "--examples", "30", "--max-seconds", "120",
        "--json", str(out), "--out", str(scenario),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["proved_equal"] is False and data["differs"] is True
    assert data["scenario"] == str(scenario)
    assert data["totals"]["vllm-0.32"]["steps"] != data["totals"]["dual"]["steps"]
    ran = _dualbudget("schedule", str(scenario), "--max-steps", "3")
    assert ran.returncode == 0, ran.stderr
    assert len(ran.stdout.splitlines()) == 3


def test_diff_search_reports_proved_equal(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    done = _dualbudget(
        "diff", "--profile", "dual", "--profile", "pr-53080", "--layout", "dspark-anchor",
        "--search", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["proved_equal"] is True and data["differs"] is False
    assert "scenario" not in data


@pytest.mark.parametrize(
    "args",
    [
        ["--profile", "nope", "--profile", "dual"],
        ["--profile", "dual"],
        ["--profile", "dual", "--profile", "vllm-0.33", "--workload", "dspark-bench",
         "--scenario", "x.json"],
        ["--profile", "dual", "--profile", "vllm-0.33", "--layout", "nope"],
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args: list[str]) -> None:
    done = _dualbudget("diff", *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("dualbudget diff: error:")


def test_the_design_review_carries_the_policy_differences() -> None:
    from dualbudget.report import DIFF_PAIRS, proved_differences, workload_differences
    from dualbudget.spec.methods import LAYOUT_NAMES

    text = "\n".join(proved_differences())
    for a, b in DIFF_PAIRS:
        assert f"| {a} vs {b} |" in text
    dual_row = next(line for line in text.splitlines() if line.startswith("| dual vs pr-53080 |"))
    assert dual_row.count("same (proved)") == len(LAYOUT_NAMES)
    text = "\n".join(workload_differences(seed=0, quick=True))
    assert "| dspark-bench | vllm-0.33 vs dual | none |" in text


def test_diff_search_separates_vllm_033_from_dual_on_dflash(tmp_path: Path) -> None:
    """Where 0.33 and dual part on DFlash: z3 finds 0.33's per-step grants equal to
    dual's there, only the running cap apart, at a config below the most requests a
    scenario holds; the search's first candidates, built on that config, reach a run
    where the cap binds (async scheduling skips a request whose output in flight reaches
    max_tokens, so dual admits past B // (K + 1)), whatever the seed."""
    out, scenario = tmp_path / "d.json", tmp_path / "found.json"
    done = _dualbudget(
        "diff", "--profile", "vllm-0.33", "--profile", "dual", "--layout", "dflash",
        "--search", "--seed", "1", "--examples", "10", "--json", str(out),
        "--out", str(scenario),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["proved_equal"] is False and data["differs"] is True, done.stdout
    assert data["separated_by"].startswith("their caps on running requests")
    (at,) = data["layouts"]["dflash"]["separated_at"]
    assert data["units"][0]["at_separation"] > 0
    found = json.loads(scenario.read_text())
    assert found["config"]["max_num_batched_tokens"] == at["b"]
    assert found["config"]["max_num_seqs"] == at["max_num_seqs"]
    assert found["config"]["async_scheduling"] is True
    steps = {p: t["steps"] for p, t in data["totals"].items()}
    assert steps["dual"] < steps["vllm-0.33"]
    # The scenario replays: the reference under each profile drains it in those steps.
    for profile in ("vllm-0.33", "dual"):
        ran = _dualbudget("schedule", str(scenario), "--profile", profile)
        assert ran.returncode == 0, ran.stderr
        assert len(ran.stdout.splitlines()) == steps[profile]


def test_caps_that_differ_only_above_every_scenario_separate_nothing() -> None:
    """0.33's cap on running DFlash requests is at least B // (1 + K) >= 56 in the search's
    config bounds: on scenarios of at most 16 requests neither cap binds, and z3 proves
    the two profiles decide alike there."""
    bounds = SEARCH_BOUNDS
    few = same_decisions("vllm-0.33", "dual", "dflash", Bounds(bounds.b, bounds.m, (1, 8), 16))
    assert few.equal and few.separations == (), few.reason
    many = same_decisions("vllm-0.33", "dual", "dflash", Bounds(bounds.b, bounds.m, (1, 8), 160))
    assert not many.equal
    (at,) = many.separations
    row = layout_named("dflash")
    caps = [_caps(p, row, at.b, at.max_num_seqs, at.k) for p in ("vllm-0.33", "dual")]
    assert caps[0] != caps[1] and min(caps) < 160


def test_the_first_candidates_sit_where_z3_separates() -> None:
    at = Separation("caps", k=3, b=515, max_num_seqs=129)
    candidates = candidates_at("vllm-0.33", "dual", "dflash", at)
    assert candidates
    for scenario in candidates:
        validate(scenario)
        validate(scenario.with_profile("dual"))
        config = scenario.config
        assert (config.num_speculative_tokens, config.max_num_batched_tokens) == (3, 515)
        assert config.max_num_seqs == 129
    # One request past the lower cap (0.33's B // (1 + K) = 128), and the bounds' most.
    assert {len(s.requests) for s in candidates} == {129, SEARCH_BOUNDS.requests[1]}


@pytest.mark.live
def test_live_vllm_agrees_with_the_reference_on_the_found_scenario(profile: str) -> None:
    """The search's scenario against the installed vLLM's own profile (0.33: the one that
    separates it from dual; 0.32: its own against dual), in lockstep step for step."""
    from dualbudget.diff_cli import prove_layout, search
    from dualbudget.integration.lockstep import run_in_lockstep

    proof = prove_layout((profile, "dual", "dflash"))
    found = search(profile, "dual", "dflash", 1, 10, 300, proof.separations)
    assert found.best is not None, f"no {profile} / dual difference found"
    scenario, result = found.best
    steps, divergence = run_in_lockstep(scenario.with_profile(profile))
    assert divergence is None, divergence.report()
    assert steps == result.totals[0].steps
