"""The live vLLM scheduler in lockstep with the reference (needs vLLM; see
docs/vllm-environments.md). Without vLLM these tests fail under CI=true, else skip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dualbudget.integration.lockstep import DivergenceFound, Lockstep, run_in_lockstep
from dualbudget.integration.testing import differing_release_profile
from dualbudget.reference.formats.scenario import load_scenario
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from tests.paths import REPO

pytestmark = pytest.mark.live


def _other(profile: str) -> str:
    return differing_release_profile(profile)


DFLASH = EngineConfig(
    max_num_batched_tokens=32,
    max_num_seqs=8,
    max_model_len=128,
    block_size=16,
    num_gpu_blocks=128,
    speculative_config=SpeculativeConfig("dflash", 7, True),
)


def _dflash_run(lock: Lockstep, steps: int = 30) -> None:
    for prompt in (20, 20, 6, 1, 9):
        lock.add(prompt, 12)
    for _ in range(steps):
        lock.run_step(lambda rid, drafts: drafts // 2, lambda rid: lock.k)


def test_examples_agree_step_for_step(profile: str) -> None:
    from dualbudget.integration.live import LiveScheduler, Unsupported
    from dualbudget.spec.profiles import profile_named

    checked = 0
    for path in sorted((REPO / "examples").glob("*.json")):
        example = load_scenario(path)
        layout = example.config.layout
        if layout is not None and not profile_named(profile).release.builds(layout):
            # The release refuses the example's drafter (P-EAGLE from 0.34): so does vLLM.
            with pytest.raises(Unsupported, match="parallel_drafting"):
                LiveScheduler(example.config)
            continue
        steps, divergence = run_in_lockstep(example.with_profile(profile))
        assert divergence is None, f"{path.name}: {divergence.report()}"
        assert steps > 0
        checked += 1
    assert checked >= 3


def test_dflash_workload_agrees_under_the_detected_profile(profile: str, tmp_path: Path) -> None:
    lock = Lockstep(DFLASH, profile, seed=0, out_dir=tmp_path)
    _dflash_run(lock)
    assert lock.step == 30


def test_planted_difference_is_caught_and_reproduced(profile: str, tmp_path: Path) -> None:
    """The reference with the other release's profile on a DFlash workload: the slots
    DFlash reserves differ (K in 0.32, 0 in 0.33), so lockstep must stop on it."""
    lock = Lockstep(DFLASH, _other(profile), seed=7, out_dir=tmp_path)
    with pytest.raises(DivergenceFound) as caught:
        _dflash_run(lock)
    found = caught.value.divergence
    assert found.kind == "decision"
    assert found.reference != found.live
    assert found.seed == 7 and found.scenario_path is not None
    assert "--replay" in (found.replay_command or "")
    # The written scenario reproduces the same divergence through the driver.
    _, again = run_in_lockstep(load_scenario(found.scenario_path))
    assert again is not None and again.step == found.step
    assert (again.reference, again.live) == (found.reference, found.live)
    # And the printed command does, as a process.
    proc = subprocess.run(
        [sys.executable, "-m", "dualbudget", "fuzz", "--replay", found.scenario_path],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIVERGENCE" in proc.stdout


def test_fuzz_cli_short_run_passes_and_writes_json(profile: str, tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "dualbudget", "fuzz", "--examples", "8", "--seed", "3",
            "--no-coverage-gate", "--json", str(out), "--out-dir", str(tmp_path),
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report) >= {"vllm_version", "profile", "examples", "steps", "divergences"}
    assert report["profile"] == profile and report["divergences"] == []
    assert report["steps"] > 0
    assert "verdict: PASS" in proc.stdout


def test_fuzz_with_the_wrong_profile_reports_a_dflash_divergence(
    profile: str, tmp_path: Path
) -> None:
    out = tmp_path / "fuzz.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "dualbudget", "fuzz", "--profile", _other(profile),
            "--layout", "dflash", "--examples", "50", "--seed", "1", "--json", str(out),
            "--out-dir", str(tmp_path),
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["divergences"], report
    first = report["divergences"][0]
    assert {"step", "reference", "live", "scenario"} <= set(first)
    assert Path(first["scenario"]).exists()


def test_fuzz_replay_of_a_missing_file_is_bad_input(profile: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dualbudget", "fuzz", "--replay", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
