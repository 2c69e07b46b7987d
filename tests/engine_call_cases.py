"""Hand-worked event streams of the engine's own calls on the scheduler: a prefix-cache
reset that preempts the running requests, and a pause and resume. The reference runs them
in tests/worked/test_engine_calls.py, vLLM in lockstep with it in
tests/live/test_engine_calls_live.py.

The comments under each stream give the arithmetic from vLLM's code (``c`` computed
tokens, ``ph`` output placeholders, ``t`` num_tokens).
"""

from __future__ import annotations

from typing import Any

from dualbudget.reference.events import (
    AddRequest,
    ModelOutput,
    ResetPrefixCache,
    ScheduleStep,
    SetPauseState,
)
from dualbudget.reference.state import FINISHED_LENGTH
from dualbudget.spec.config import EngineConfig
from tests.worked_cases import Case

SYNC = EngineConfig(
    max_num_batched_tokens=32,
    max_num_seqs=4,
    max_model_len=32,
    block_size=4,
    num_gpu_blocks=32,
)
ASYNC = EngineConfig(
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=32,
    block_size=4,
    num_gpu_blocks=32,
    async_scheduling=True,
)

S = ScheduleStep()
RESET = ResetPrefixCache(reset_running_requests=True)


def decision(
    scheduled: dict[str, int],
    preempted: list[str] | None = None,
    finished: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "num_scheduled_tokens": scheduled,
        "scheduled_spec_tokens": {},
        "preempted": preempted or [],
        "finished": finished or [],
    }


def out(sampled: dict[str, int], step: int | None = None) -> ModelOutput:
    return ModelOutput(sampled, {}, step)


CASES = (
    Case(
        # Both running requests are preempted, the last first, so that they wait in their
        # running order; the next step reports them preempted and resumes both with every
        # token they had, their one output each kept.
        "reset-preempts-running-in-order",
        SYNC,
        (
            AddRequest("a", 8, 4),
            AddRequest("b", 8, 4, arrival_time=1.0),
            S,  # 0: a 8, b 8
            out({"a": 1, "b": 1}),  # t=9 each
            S,  # 1: a 1, b 1
            out({"a": 1, "b": 1}),  # t=10 each
            RESET,  # waiting [a, b], c=0
            S,  # 2: preempted a and b; a 10, b 10
            out({"a": 1, "b": 1}),  # t=11 each, 3 outputs
            S,  # 3: a 1, b 1
            out({"a": 1, "b": 1}),  # 4 outputs = max_tokens: both finished
            S,  # 4: reports them
            out({}),
        ),
        (
            decision({"a": 8, "b": 8}),
            decision({"a": 1, "b": 1}),
            decision({"a": 10, "b": 10}, preempted=["a", "b"]),
            decision({"a": 1, "b": 1}),
            decision({}, finished=["a", "b"]),
        ),
        {"a": FINISHED_LENGTH, "b": FINISHED_LENGTH},
    ),
    Case(
        # paused_new lets a run on and keeps b waiting; paused_all schedules nothing;
        # resumed, both run.
        "pause-new-then-all-then-resume",
        SYNC,
        (
            AddRequest("a", 4, 3),
            S,  # 0: a 4
            out({"a": 1}),  # 1 output
            SetPauseState("paused_new"),
            AddRequest("b", 4, 3, arrival_time=1.0),
            S,  # 1: a 1; b not admitted
            out({"a": 1}),  # 2 outputs
            SetPauseState("paused_all"),
            S,  # 2: nothing
            out({}),
            SetPauseState("unpaused"),
            S,  # 3: a 1, b 4
            out({"a": 1, "b": 1}),  # a: 3 outputs, finished
            S,  # 4: reports a; b 1
            out({"b": 1}),
            S,  # 5: b 1
            out({"b": 1}),  # b: 3 outputs, finished
            S,  # 6: reports b
            out({}),
        ),
        (
            decision({"a": 4}),
            decision({"a": 1}),
            decision({}),
            decision({"a": 1, "b": 4}),
            decision({"b": 1}, finished=["a"]),
            decision({"b": 1}),
            decision({}, finished=["b"]),
        ),
        {"a": FINISHED_LENGTH, "b": FINISHED_LENGTH},
    ),
    Case(
        # Under async scheduling step 1 is in flight at the reset: its output is dropped
        # (not appended), and a resumes at once instead of waiting for it as a request
        # with stale output to deliver would.
        "reset-drops-the-output-in-flight",
        ASYNC,
        (
            AddRequest("a", 4, 4),
            S,  # 0: a 4; c=4 ph=1
            S,  # 1: a 1 (t 4 + ph 1 - c 4); c=5 ph=2
            out({"a": 1}, 0),  # t=5, ph=1
            RESET,  # a waiting, c=0 ph=0, stale 1 (step 1's token), dropped
            S,  # 2: preempted a; a 5 (all of t) at once; c=5 ph=1
            out({"a": 1}, 1),  # stale and dropped: t stays 5
            S,  # 3: a 1 (5 + ph 1 - 5); c=6 ph=2
            out({"a": 1}, 2),  # t=6, ph=1
            S,  # 4: a 1; c=7 ph=2
            out({"a": 1}, 3),  # t=7, ph=1
            S,  # 5: skipped: c + 2 - ph = 8 reaches prompt + max_tokens = 8
            out({"a": 1}, 4),  # t=8: 4 outputs, finished
            S,  # 6: reports a
            out({}, 5),
            out({}, 6),
        ),
        (
            decision({"a": 4}),
            decision({"a": 1}),
            decision({"a": 5}, preempted=["a"]),
            decision({"a": 1}),
            decision({"a": 1}),
            decision({}),
            decision({}, finished=["a"]),
        ),
        {"a": FINISHED_LENGTH},
    ),
)
