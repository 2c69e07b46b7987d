"""A hand-worked event stream with the decisions worked out by hand from vLLM's code, and
the reference's run of it: the shape shared by the async scheduling cases
(``async_cases.py``) and the engine calls' (``engine_call_cases.py``), each run against
the reference and, in lockstep, against vLLM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import Event
from dualbudget.reference.scheduler import Scheduler
from dualbudget.spec.config import EngineConfig
from dualbudget.spec.profiles import profile_named


@dataclass(frozen=True)
class Case:
    name: str
    config: EngineConfig
    events: tuple[Event, ...]
    expected: tuple[dict[str, Any], ...]
    """One decision per ScheduleStep, in order."""
    finished: dict[str, str]
    """The final status of each request."""


def run_case(case: Case, profile: str) -> tuple[list[dict[str, Any]], Scheduler]:
    """The reference's decisions on ``case`` under ``profile``, and the scheduler after it."""
    scheduler = make_scheduler(case.config, profile_named(profile))
    decisions = []
    for event in case.events:
        record = scheduler.handle(event)
        if record is not None:
            decisions.append(record.decision())
    return decisions, scheduler
