"""Write the live vLLM scheduler, driven by a scenario, as a ``scheduler`` trace.

The scenario's event stream (arrivals, sampled counts, natural stops, draft proposals) is
made by the reference's ``EventDriver``, in lockstep (``lockstep.live_records``), and fed
to a real vLLM scheduler of the recording class (``recorder.RecordingScheduler``, or
``RecordingAsyncScheduler`` when the scenario's config asks for async scheduling, where
step n+1 is scheduled before step n's output is applied); what vLLM decided lands in the
trace, and ``dualbudget replay`` then checks it against the reference. With the scenario's
``enable_prefix_caching`` on, the events carry token ids and vLLM's requests hash their
blocks with vLLM's own hasher (``live.request_block_hasher``), so the trace holds vLLM's
block hashes, not the reference's: its replay takes every hit from them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dualbudget.reference.scenario import Scenario

from .live import LiveScheduler, build_vllm_config
from .lockstep import live_records
from .recorder import NOTES_ENV, SOURCE_ENV, TRACE_ENV


def write_scheduler_trace(
    scenario: Scenario,
    path: Path,
    max_steps: int | None = None,
    notes: dict[str, str] | None = None,
) -> int:
    """Write the trace of vLLM scheduling ``scenario``; returns the number of steps."""
    from .recorder import RecordingAsyncScheduler, RecordingScheduler

    # How vLLM was made to build this method on CPU goes into the header (DSpark needs
    # model runner V2 here), so the trace never passes a workaround off as native.
    _, construction = build_vllm_config(scenario.config)
    facts = {"construction": construction.how, **(notes or {})}
    environ = {TRACE_ENV: str(path), SOURCE_ENV: "scheduler", NOTES_ENV: json.dumps(facts)}
    saved = {key: os.environ.get(key) for key in environ}
    os.environ.update(environ)
    try:
        recording = (
            RecordingAsyncScheduler if scenario.config.async_scheduling else RecordingScheduler
        )
        live = LiveScheduler(scenario.config, scheduler_cls=recording)
        records = live_records(scenario, live, max_steps)
        live.scheduler.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return len(records)
