"""A crash of both sides is counted by the vLLM assertion it mirrors: the reference names
the assertion (``reference.violations.VLLM_CRASHES``), a fuzz counts its examples per name
and writes the first of each as a scenario, and a name no ``[crashes]`` record of
``proofs/manifest.toml`` holds fails the verdict. Marked ``live``: the threshold case of
``tests/unit/test_settings_threshold.py`` ends a lockstep run on the crash, and its scenario
replays it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualbudget.integration.commands import fuzz_verdict
from dualbudget.integration.outcome import LIVE_ALONE_CRASH, FuzzResult, UnitRun
from dualbudget.integration.upstream import load_crashes
from dualbudget.reference.violations import VLLM_CRASHES, UnmirroredVllmCrash

PADDED = "padded-decode-cut-by-long-prefill-threshold"
UNRECORDED = "pool-short-of-counted-blocks"


def _unit(tmp_path: Path, crashes: dict[str, int]) -> UnitRun:
    run = UnitRun("vllm-0.33", "ngram", "edge", 1, tmp_path, frozenset())
    # Steps checked before the crashes: a verdict rests on them (a run of none exits 2).
    run.steps = 5
    run.mirrored_crashes = dict(crashes)
    run.crash_scenarios = {name: str(tmp_path / f"crash-{name}.json") for name in crashes}
    return run


def _result(*units: UnitRun) -> FuzzResult:
    result = FuzzResult(profile="vllm-0.33", vllm_version="0.33.0")
    for unit in units:
        result.merge(unit)
    return result


def test_a_crash_must_name_an_assertion_the_reference_mirrors() -> None:
    with pytest.raises(ValueError, match="unknown vLLM crash 'made-up'"):
        UnmirroredVllmCrash("made-up", "no such assertion")
    assert UnmirroredVllmCrash(PADDED, "m").crash == PADDED


def test_the_named_unrecorded_crash_is_one_the_manifest_lacks() -> None:
    # The verdict test below needs a crash the reference names and no record holds.
    assert UNRECORDED in VLLM_CRASHES and UNRECORDED not in load_crashes()
    assert PADDED in load_crashes()


def test_units_merge_their_crashes_by_name_keeping_the_first_scenario(tmp_path: Path) -> None:
    first = _unit(tmp_path / "a", {PADDED: 2})
    second = _unit(tmp_path / "b", {PADDED: 1, LIVE_ALONE_CRASH: 3})
    result = _result(first, second)
    assert result.mirrored_crashes == {PADDED: 3, LIVE_ALONE_CRASH: 3}
    assert result.crash_scenarios[PADDED] == first.crash_scenarios[PADDED]
    assert result.crash_scenarios[LIVE_ALONE_CRASH] == second.crash_scenarios[LIVE_ALONE_CRASH]


def test_a_recorded_crash_is_named_and_passes(tmp_path: Path) -> None:
    result = _result(_unit(tmp_path, {PADDED: 2}))
    code, table = fuzz_verdict(result, [], gate=False)
    assert code == 0
    assert f"mirrored crash {PADDED} (proofs/manifest.toml [crashes]): 2 examples" in table
    assert "2 mirrored crashes" in table
    assert table.splitlines()[-1].startswith("verdict: PASS")


def test_a_crash_no_record_names_fails_the_verdict(tmp_path: Path) -> None:
    result = _result(_unit(tmp_path, {PADDED: 1, UNRECORDED: 1}))
    code, table = fuzz_verdict(result, [], gate=False)
    assert code == 1
    assert f"NEW MIRRORED CRASH {UNRECORDED} (not in proofs/manifest.toml [crashes])" in table
    assert table.splitlines()[-1] == (
        f"verdict: FAIL: vLLM fails an assertion no crash record names: {UNRECORDED}"
    )


def test_a_crash_of_vllm_alone_names_no_assertion_and_fails(tmp_path: Path) -> None:
    # With no reference beside it, nothing names the assertion: never mirrored.
    result = _result(_unit(tmp_path, {LIVE_ALONE_CRASH: 1}))
    code, table = fuzz_verdict(result, [], gate=False)
    assert code == 1
    assert "vLLM crashed with no reference beside it: 1 examples" in table
    assert table.splitlines()[-1] == (
        "verdict: FAIL: vLLM failed on 1 examples with no reference beside it"
    )


@pytest.mark.live
def test_a_units_crash_scenario_replays_the_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: str
) -> None:
    from dualbudget.cli import main
    from dualbudget.integration.lockstep import Lockstep, MirroredCrash
    from dualbudget.reference.runs.driver import EventDriver, drive

    from .test_settings_threshold import CRASH_STEP, ROOMY_POOL, threshold_case

    scenario = threshold_case(ROOMY_POOL, profile)
    driver = EventDriver.of(scenario, 16)
    lock = Lockstep(scenario.config, scenario.profile, out_dir=tmp_path, driver=driver)
    with pytest.raises(MirroredCrash) as crashed:
        for _ in drive(driver, lock):
            pass
    unit = UnitRun(scenario.profile, "ngram", "edge", 1, tmp_path, frozenset())
    unit.take_crash(lock, crashed.value)
    unit.take_crash(lock, crashed.value)
    assert unit.mirrored_crashes == {PADDED: 2}
    path = Path(unit.crash_scenarios[PADDED])
    assert path.name.startswith(f"crash-{PADDED}-") and path.exists()
    capsys.readouterr()
    assert main(["fuzz", "--replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"mirrored crash {PADDED} at step {CRASH_STEP}:" in out
    assert f"verdict: PASS: both fail vLLM's assertion {PADDED}, a crash record" in out
