"""Write the reference itself as a ``synthetic`` trace: the same events a live scheduler
would be fed, and the reference's own decisions. Used to test replay end to end without
vLLM, and to hand-craft traces for review."""

from __future__ import annotations

from pathlib import Path

from ..events import ScheduleStep
from ..formats.scenario import Scenario
from ..formats.trace import TraceHeader, TraceWriter
from .driver import ScenarioRun


def write_synthetic_trace(
    scenario: Scenario, path: str | Path, vllm_version: str, max_steps: int | None = None
) -> int:
    """Write the trace of ``scenario`` under its profile; returns the number of steps."""
    run = ScenarioRun(scenario, max_steps=max_steps, check="collect")
    header = TraceHeader(
        vllm_version=vllm_version,
        source="synthetic",
        config=scenario.config,
        scheduler_class="dualbudget.reference.scheduler.Scheduler",
        notes={"profile": scenario.profile},
    )
    writer = TraceWriter(path, header)
    steps = 0
    for step in run.steps():
        # A trace holds the decision where the scheduler was asked for one.
        for event in step.events:
            writer.write(step.record if isinstance(event, ScheduleStep) else event)
        steps += 1
    writer.close()
    return steps
