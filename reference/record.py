"""Record the reference itself as a ``synthetic`` trace: the same events a live scheduler
would be fed, and the reference's own decisions. Used to test replay end to end without
vLLM, and to hand-craft traces for review."""

from __future__ import annotations

from pathlib import Path

from .driver import ScenarioRun
from .scenario import Scenario
from .trace import TraceHeader, TraceWriter


def write_synthetic_trace(
    scenario: Scenario, path: str | Path, vllm_version: str, max_steps: int | None = None
) -> int:
    """Write the trace of ``scenario`` under its profile; returns the number of steps."""
    run = ScenarioRun(scenario, max_steps=max_steps, check="record")
    header = TraceHeader(
        vllm_version=vllm_version,
        source="synthetic",
        config=scenario.config,
        scheduler_class="dualbudget.reference.scheduler.Scheduler",
        notes={"profile": scenario.profile},
    )
    writer = TraceWriter(path, header)
    scheduler, driver = run.scheduler, run.driver
    steps = 0
    while not driver.done(scheduler.state):
        for event in driver.before_step():
            record = scheduler.handle(event)
            writer.write(record if record is not None else event)
        assert record is not None
        for event in driver.after_step(record, scheduler.state):
            scheduler.handle(event)
            writer.write(event)
        steps += 1
    writer.close()
    return steps
