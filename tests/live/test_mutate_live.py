"""Mutants of the installed vLLM's own scheduler (needs vLLM; see docs/mutate.md).

The sites are found in the installed source, at least 20 of them, every operator with
one; the unmutated control agrees with the reference; a known budget bug planted in
``schedule`` is killed, and its scenario file replays to the same divergence with the
mutant and to none with vLLM's own scheduler.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.live

KNOWN = "shift-boundary/schedule/long_prefill_token_threshold/3"
"""The RUNNING loop's ``0 < threshold`` test as ``0 <=``: with no long-prefill threshold
(0, the default) every running request's need becomes 0, so none is scheduled."""


def test_mutants_of_the_installed_scheduler(profile: str) -> None:
    from dualbudget.integration.mutation.loading import installed_vllm_source, sites
    from dualbudget.integration.mutation.operators import OPERATORS

    source = installed_vllm_source()
    found = sites(source)
    assert len(found) >= 20
    assert {s.operator for s in found} == set(OPERATORS)
    assert source.path.endswith("vllm/v1/core/sched/scheduler.py")
    schedule = source.function("schedule")
    assert all(schedule.lineno <= s.line <= (schedule.end_lineno or 0) for s in found)
    lines = Path(source.path).read_text().splitlines()
    refunds = [s for s in found if s.operator == "remove-refund"]
    assert refunds and all("+=" in lines[s.line - 1] for s in refunds)
    assert KNOWN in {s.name for s in found}


def _fuzz(name: str, profile: str, out_dir: Path, examples: int) -> tuple[object, object]:
    from dualbudget.fuzz_cli import known_findings
    from dualbudget.integration.fuzz import first_divergence
    from dualbudget.integration.mutation.classes import path_of

    return first_divergence(
        profile=profile,
        scheduler_cls=path_of(name),
        seed=1,
        examples=examples,
        out_dir=out_dir,
        known_findings=known_findings(),
    )


def test_the_control_agrees(profile: str, tmp_path: Path) -> None:
    divergence, result = _fuzz("control", profile, tmp_path, 16)
    assert divergence is None
    assert result.steps > 0  # type: ignore[attr-defined]


def test_a_known_mutant_is_killed_and_its_scenario_replays(profile: str, tmp_path: Path) -> None:
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.lockstep import run_in_lockstep
    from dualbudget.integration.mutation.classes import CONTROL, _class
    from dualbudget.reference.formats.scenario import load_scenario

    divergence, _ = _fuzz(KNOWN, profile, tmp_path, 200)
    assert divergence is not None
    path = Path(divergence.scenario_path)  # type: ignore[attr-defined]
    assert path.exists() and path.is_relative_to(tmp_path)
    scenario = load_scenario(path)
    mutant = LiveScheduler(scenario.config, scheduler_cls=_class(KNOWN))
    _, again = run_in_lockstep(scenario, live=mutant)
    assert again is not None
    assert (again.kind, again.step) == (divergence.kind, divergence.step)  # type: ignore[attr-defined]
    for own in (None, _class(CONTROL)):
        _, none = run_in_lockstep(scenario, live=LiveScheduler(scenario.config, scheduler_cls=own))
        assert none is None
