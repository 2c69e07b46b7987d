"""The fuzz's state machines run end to end without vLLM: the live side replaced by a
second reference scheduler of the same profile (so every decision agrees), one unit at a
time through ``fuzz.run_unit``. What a unit counts, and which of its examples are void,
is the machines' own doing, not vLLM's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dualbudget.integration import fuzz, lockstep
from dualbudget.integration.live import Construction, Unsupported
from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import Event, StepRecord
from dualbudget.spec.config import EngineConfig
from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import profile_named

PROFILE = "vllm-0.33"


class ReferenceAsLive:
    """The reference scheduler behind the live adapter's interface."""

    def __init__(self, config: EngineConfig) -> None:
        try:
            self.scheduler = make_scheduler(config, profile_named(PROFILE), check="collect")
        except BadInput as err:
            raise Unsupported(config, str(err)) from None
        layout = config.layout.name if config.layout is not None else "none"
        self.construction = Construction(layout, "native")

    def handle(self, event: Event) -> StepRecord | None:
        return self.scheduler.handle(event)

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.state.free_blocks


def _run(aim: str, examples: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(lockstep, "LiveScheduler", ReferenceAsLive)
    plan = fuzz.UnitPlan(
        index=0,
        profile=PROFILE,
        layout="eagle",
        aim=aim,
        examples=examples,
        seed=1,
        out_dir=str(tmp_path),
        known_findings=frozenset(),
        scheduler_cls=None,
    )
    return fuzz.run_unit(plan)


def test_a_unit_runs_its_examples_and_counts_its_steps_and_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run("preempt", 3, tmp_path, monkeypatch)
    assert not run.divergences and not run.findings
    assert run.examples >= 3 and run.steps > 0
    assert run.coverage is not None and run.coverage["preemption"] > 0
    # Every example started is counted, or refused by both sides.
    assert run.started == run.examples + run.refused_configs


def test_the_refund_aim_voids_hypothesis_simplest_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run("refund", 2, tmp_path, monkeypatch)
    assert run.examples >= 2 and run.steps > 0
    assert run.started == run.examples + run.refused_configs + 1  # the first, void
