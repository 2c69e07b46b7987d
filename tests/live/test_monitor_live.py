"""The contract monitor on the live vLLM scheduler (needs vLLM; see
docs/vllm-environments.md): it flags DSpark fill-in's C3 overflow where the installed
release's record (the manifest's findings of its profile) says vLLM overflows, and
asserts the overflow does not occur where it says not; on a KV cache of two groups (full
attention and a sliding window) it judges C4 and C5 and flags a planted skipped step
and a wrong C(q), and nothing on vLLM's own scheduler; a small seeded fuzz of the
installed scheduler shows no violation outside the manifest's findings but stalls the
reference confirms; and
``--monitor-only`` runs the fuzz with no reference and reports, its scenario files
replaying what it found; and a prompt vLLM accepts but, with chunked prefill off, never
fits whole is a stall the reference shares and the manifest knows by its cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualbudget.fuzz_cli import known_findings
from dualbudget.integration.aims import AIMS
from dualbudget.integration.commands import FuzzOptions, replay_scenario, run_fuzz_stage
from dualbudget.integration.fuzz import FuzzPlan, run_fuzz
from dualbudget.integration.live import LiveScheduler
from dualbudget.integration.lockstep import run_in_lockstep
from dualbudget.integration.monitor import (
    BOOKS_MONITORED,
    MONITORED,
    Monitor,
    MonitorViolation,
    block_sizes,
)
from dualbudget.integration.monitor_run import LiveAlone, run_alone
from dualbudget.integration.testing import require_live_vllm
from dualbudget.proofs.manifest import causes, expected_findings
from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, Scenario, load_scenario
from dualbudget.reference.runs.driver import EventDriver, ScenarioRun, drive
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.methods import layout_named
from tests.reference_support import fill_in_scenario

pytestmark = pytest.mark.live

FILL_IN_C3 = "dspark-fill-in", "C3"


def overflows(profile: str) -> bool:
    """The installed release's record: does its profile's manifest list the overflow?"""
    return (profile, *FILL_IN_C3) in expected_findings()


def test_the_monitor_flags_the_fill_in_overflow_where_the_release_has_it(profile: str) -> None:
    # Five 2-token prompts, B = 20, K = 4 (tests/unit/test_reference_findings.py): under 0.32
    # the second step schedules five requests, D = 5 * (K + 1) = 25 > B.
    scenario = fill_in_scenario(profile, 2)
    beside: list[MonitorViolation] = []
    steps, divergence = run_in_lockstep(scenario, monitored=beside)
    assert divergence is None and steps > 1
    alone_steps, alone, crash = run_alone(scenario)
    assert crash is None and alone_steps == steps
    # Beside the reference or alone, the monitor's opinion is the same: it reads vLLM only.
    assert alone == beside
    c3 = [v for v in alone if v.contract == "C3"]
    if overflows(profile):
        assert c3, f"{profile}: the monitor missed the known C3 overflow"
        assert (c3[0].step, "D=25" in c3[0].message) == (1, True)
    else:
        assert c3 == [], f"{profile}: an overflow its record says it does not have: {c3}"


def test_a_seeded_fuzz_shows_no_violation_outside_the_findings(
    profile: str, tmp_path: Path
) -> None:
    require_live_vllm()
    result = run_fuzz(
        FuzzPlan(
            profile=profile,
            vllm_version=require_live_vllm(),
            examples=90,
            seed=1,
            out_dir=tmp_path,
            known_findings=known_findings(),
            # Three methods, enough examples that every aim runs past Hypothesis' simplest.
            layouts=("ngram-parallel", "eagle", "dspark-fill-in"),
        )
    )
    # Divergences are the lockstep's to judge (tests/live/test_live_lockstep.py): here, the
    # monitor's opinion of every step run.
    assert result.steps > 500
    assert set(result.monitor_counts) <= set(MONITORED)
    # Outside the manifest's findings, only an empty step the reference stalls on too
    # (its own C4 check, on the scenario the monitor wrote): a stall of vLLM's that the
    # proofs' model of a step does not reach (e.g. vLLM 0.32 holding back a full prefix
    # hit it would have to pad to 1 + K > max_num_scheduled_tokens).
    for finding in result.unknown_monitor_findings:
        assert finding.contract == "C4", finding.to_json()
        run = ScenarioRun(load_scenario(finding.scenario_path), check="collect")
        for _ in run.steps():
            pass
        assert run.stall is not None and run.stall.step == finding.step, finding.to_json()
    labels = {(cause.name, cause.key) for cause in causes()}
    for finding in result.monitor_findings:
        # Labelled with the finding of its cause: a manifest row on its own key.
        assert finding.known == (finding.manifest_key is not None)
        assert finding.manifest_key is None or (finding.manifest_key, finding.key) in labels
        assert Path(finding.scenario_path).name.startswith(f"monitor-{finding.contract}-")


def test_monitor_only_fuzzes_with_no_reference_and_reports(
    profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "fuzz.json"
    options = FuzzOptions(
        known_findings=known_findings(),
        # One example of each aim, the engine_calls aim's included: C12 stands on its
        # calls. What is under test is the monitor's report, not the coverage of 11
        # examples (the gate's own tests are the seeded fuzz runs).
        examples=len(AIMS),
        coverage_gate=False,
        seed=1,
        jobs=1,
        profile=profile,
        monitor_only=True,
        layouts=("dspark-fill-in",),
        json_path=report,
        out_dir=tmp_path,
    )
    assert run_fuzz_stage(options) == 0
    out = json.loads(report.read_text())
    monitor = out["monitor"]
    assert monitor["alone"] is True and monitor["new"] == 0
    assert out["divergences"] == [] and out["steps"] > 0
    assert set(monitor["counts"]) == set(MONITORED)
    # Every book item stands on judged request-steps: a count of no violation is work.
    assert all(monitor["books_judged"][item] > 0 for item in BOOKS_MONITORED), monitor
    printed = capsys.readouterr().out
    assert "contract monitor alone" in printed
    assert "PASS: the contract monitor found no violation" in printed
    found = [v for v in monitor["violations"] if (v["layout"], v["contract"]) == FILL_IN_C3]
    assert bool(found) == (overflows(profile) and monitor["counts"]["C3"] > 0)
    for violation in found:
        # The violation's scenario replays it: alone (a failure) and in lockstep (no
        # divergence, the monitor's opinion printed beside).
        assert violation["finding"] == f"{profile}/dspark-fill-in/C3"
        assert replay_scenario(violation["scenario_path"], monitor_only=True) == 1
        assert replay_scenario(violation["scenario_path"]) == 0
        assert "monitor: C3" in capsys.readouterr().out


# -- several KV groups ---------------------------------------------------------------------
HYBRID = (KVGroup("full_attention", 16), KVGroup("sliding_window", 16, sliding_window=32))
SKIPPED_STEP = 3


def hybrid_scenario(profile: str) -> Scenario:
    """Three 40-token prompts on full attention beside a 32-token window, EAGLE with
    K = 2, B = 32: chunked prefills, then decodes, in a pool with room for all."""
    config = EngineConfig(
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=128,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=SpeculativeConfig.for_layout(layout_named("eagle"), 2),
        kv_groups=HYBRID,
    )
    requests = tuple(RequestSpec(str(i), 40, 6) for i in range(3))
    return Scenario(profile, config, requests, Acceptance(fixed=1))


def skips_a_step() -> type:
    """vLLM's scheduler with a planted bug: its ``SKIPPED_STEP``-th ``schedule()`` runs
    with no token budget, so it schedules nothing while every request could run."""
    from vllm.v1.core.sched.scheduler import Scheduler

    class SkipsAStep(Scheduler):  # type: ignore[misc]
        calls = 0
        max_num_scheduled_tokens: int

        def schedule(self, *args: object, **kwargs: object) -> object:
            self.calls += 1
            if self.calls != SKIPPED_STEP + 1:
                return super().schedule(*args, **kwargs)
            budget = self.max_num_scheduled_tokens
            self.max_num_scheduled_tokens = 0
            try:
                return super().schedule(*args, **kwargs)
            finally:
                self.max_num_scheduled_tokens = budget

    return SkipsAStep


def run_live_alone(
    scenario: Scenario, live: LiveScheduler, monitor: Monitor | None = None
) -> LiveAlone:
    lock = LiveAlone(
        scenario.config, scenario.profile, live=live, driver=EventDriver.of(scenario, 40)
    )
    if monitor is not None:
        lock.monitor = monitor
    for _ in drive(lock.driver, lock):
        pass
    return lock


def test_the_monitor_judges_c4_and_c5_on_two_kv_groups_and_finds_nothing(profile: str) -> None:
    scenario = hybrid_scenario(profile)
    beside: list[MonitorViolation] = []
    steps, divergence = run_in_lockstep(scenario, monitored=beside)
    assert divergence is None and steps > SKIPPED_STEP + 2
    assert beside == []
    # Both groups' blocks are bounded: C4 is judged on this layout (not skipped).
    lock = run_live_alone(scenario, LiveScheduler(scenario.config))
    assert lock.monitor.violations == [] and lock.compared == steps
    assert block_sizes(lock.live.scheduler) == (16, 16)


def test_the_monitor_flags_a_planted_skipped_step_on_two_kv_groups(profile: str) -> None:
    scenario = hybrid_scenario(profile)
    live = LiveScheduler(scenario.config, scheduler_cls=skips_a_step())
    found = run_live_alone(scenario, live).monitor.violations
    assert [(v.contract, v.step) for v in found] == [("C4", SKIPPED_STEP)], found
    assert "could run" in found[0].message


def test_a_monitor_told_a_wrong_c_of_q_fails_on_two_kv_groups(profile: str) -> None:
    scenario = hybrid_scenario(profile)
    wrong = Monitor(scenario.config, draft_rows=lambda q: q + 32)
    found = run_live_alone(scenario, LiveScheduler(scenario.config), wrong).monitor.violations
    assert found and {v.contract for v in found} == {"C3"}


@pytest.mark.parametrize(("prompt_len", "fits"), [(47, False), (46, True)])
def test_a_prompt_that_never_fits_whole_waits_for_ever_and_is_a_known_stall(
    profile: str, prompt_len: int, fits: bool
) -> None:
    """With chunked prefill off, vLLM schedules a prompt whole, against the input budget
    less its parallel-drafting slots (K-1 for ngram with ``parallel_drafting``, in both
    releases): at B = max_model_len = 48 and K = 3 a 47-token prompt, which vLLM accepts,
    never fits, and the first step is empty with nothing left to change it; a 46-token
    one runs. The reference stalls alike,
    and the stall is the manifest's ``unchunked-prompt-stall``, not a new finding."""
    from dualbudget.integration.lockstep import ConfigRefused, Lockstep
    from dualbudget.integration.outcome import known_as
    from dualbudget.reference.formats.scenario import validate
    from dualbudget.spec.profiles import profile_named

    config = EngineConfig(
        max_num_batched_tokens=48,
        max_num_seqs=1,
        max_model_len=48,
        block_size=4,
        num_gpu_blocks=32,
        enable_chunked_prefill=False,
        speculative_config=SpeculativeConfig.for_layout(layout_named("ngram-parallel"), 3),
    )
    if "ngram-parallel" not in profile_named(profile).release.layouts:
        # A release that builds no parallel ngram (0.34 on) refuses it, on both sides.
        with pytest.raises(ConfigRefused, match="parallel_drafting"):
            Lockstep(config, profile)
        return
    request = RequestSpec("0", prompt_len, 1)
    scenario = validate(Scenario(profile, config, (request,), Acceptance(fixed=0)))
    beside: list[MonitorViolation] = []
    steps, divergence = run_in_lockstep(scenario, max_steps=6, monitored=beside)
    assert divergence is None  # the reference decides as vLLM does, stall included
    if fits:
        assert beside == [] and steps >= 1
        return
    # An empty first step with no event left to come is a fixed point (the driver's
    # Stall): every later step would be the same, so the run stops there.
    assert steps == 1 and [(v.contract, v.step) for v in beside] == [("C4", 0)], beside
    key = (profile, "ngram-parallel", "C4")
    assert known_as(key, config, known_findings()) == "outside_model.unchunked-prompt-stall"
