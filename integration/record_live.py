"""Record the live vLLM scheduler, driven by a scenario, as a ``scheduler`` trace.

The scenario's event stream (arrivals, sampled counts, draft proposals) is made by the
reference's ``ScenarioDriver``, exactly as in lockstep, and fed to a real vLLM scheduler of
the recording class; what vLLM decided lands in the trace, and ``dualbudget replay`` then
checks it against the reference.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dualbudget.reference.events import StepRecord
from dualbudget.reference.scenario import Scenario

from .live import LiveScheduler, build_vllm_config
from .lockstep import lockstep_steps
from .recorder import NOTES_ENV, SOURCE_ENV, TRACE_ENV


def drive(
    scenario: Scenario, live: LiveScheduler, max_steps: int | None = None
) -> list[StepRecord]:
    """vLLM's records for ``scenario``'s event stream (made by the reference in lockstep)."""
    return [theirs for _, theirs in lockstep_steps(scenario, live, max_steps)]


def record_scenario(
    scenario: Scenario,
    path: Path,
    max_steps: int | None = None,
    notes: dict[str, str] | None = None,
) -> int:
    """Write the trace of vLLM scheduling ``scenario``; returns the number of steps."""
    from .recorder import RecordingScheduler  # type: ignore[attr-defined]

    # How vLLM was made to build this method on CPU goes into the header (DSpark needs
    # model runner V2 here), so the trace never passes a workaround off as native.
    _, construction = build_vllm_config(scenario.config)
    facts = {"construction": construction.how, **(notes or {})}
    environ = {TRACE_ENV: str(path), SOURCE_ENV: "scheduler", NOTES_ENV: json.dumps(facts)}
    saved = {key: os.environ.get(key) for key in environ}
    os.environ.update(environ)
    try:
        live = LiveScheduler(scenario.config, scheduler_cls=RecordingScheduler)
        records = drive(scenario, live, max_steps)
        live.scheduler.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return len(records)
