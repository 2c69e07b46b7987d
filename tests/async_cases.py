"""Hand-worked event streams of async scheduling: each rule of vLLM's ``AsyncScheduler``
pinned by one stream, run against the reference in tests/worked/test_async_reference.py and
against vLLM in tests/live/test_async_live.py.

Each case lists the events and, for every ``ScheduleStep``, the decision worked out by
hand from vLLM's code: the comments under each case give the arithmetic (``c`` computed
tokens, ``ph`` output placeholders, ``t`` num_tokens).
"""

from __future__ import annotations

from typing import Any

from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep
from dualbudget.reference.state import FINISHED_LENGTH, FINISHED_STOPPED
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from tests.worked_cases import Case

EAGLE = EngineConfig(
    max_num_batched_tokens=64,
    max_num_seqs=4,
    max_model_len=64,
    block_size=16,
    num_gpu_blocks=64,
    speculative_config=SpeculativeConfig("eagle3", 2),
    async_scheduling=True,
)
# Eight usable blocks of four tokens: two 12-token prompts fill them by their 16th token.
TIGHT = EngineConfig(
    max_num_batched_tokens=16,
    max_num_seqs=4,
    max_model_len=32,
    block_size=4,
    num_gpu_blocks=9,
    async_scheduling=True,
)


def decision(
    scheduled: dict[str, int],
    spec: dict[str, int] | None = None,
    preempted: list[str] | None = None,
    finished: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "num_scheduled_tokens": scheduled,
        "scheduled_spec_tokens": spec or {},
        "preempted": preempted or [],
        "finished": finished or [],
    }


S = ScheduleStep()


def out(step: int, sampled: dict[str, int], stopped: dict[str, int] | None = None) -> ModelOutput:
    return ModelOutput(sampled, stopped or {}, step)


CASES = (
    Case(
        # The placeholders in the running loop's need, K placeholder drafts scheduled with
        # no DraftProposals, rejected drafts rolling back computed tokens and placeholders,
        # and the skip of a request whose in-flight output already reaches max_tokens.
        "placeholders-and-max-tokens-skip",
        EAGLE,
        (
            AddRequest("r", 4, 5),
            S,  # 0: q=4, the prompt; then c=4 ph=1, drafts 2 (placeholders)
            S,  # 1: need 4+2+1-4=3, spec 3+4-4-1=2; c=7 ph=4
            out(0, {"r": 1}),  # ph 3, t=5
            S,  # 2: need 5+2+3-7=3, spec 2; c=10 ph=6
            out(1, {"r": 1}),  # 2 rejected: c=8 ph=4; then ph=3, t=6
            S,  # 3: skip test 8+2-3=7 < 4+5; q=3; c=11 ph=6
            out(2, {"r": 1}),  # c=9 ph=3 t=7
            S,  # 4: 9+2-3=8 < 9; q=3; c=12 ph=6
            out(3, {"r": 1}),  # c=10 ph=3 t=8
            S,  # 5: 10+2-3=9 >= 9: skipped, nothing scheduled
            out(4, {"r": 1}),  # t=9: output 5 = max_tokens, finished
            S,  # 6: reports r finished
            out(5, {}),
            out(6, {}),
        ),
        (
            decision({"r": 4}),
            decision({"r": 3}, {"r": 2}),
            decision({"r": 3}, {"r": 2}),
            decision({"r": 3}, {"r": 2}),
            decision({"r": 3}, {"r": 2}),
            decision({}),
            decision({}, finished=["r"]),
        ),
        {"r": FINISHED_LENGTH},
    ),
    Case(
        # Preemption turns the victim's in-flight output stale: it still arrives and its
        # token is appended (b resumes with 16 tokens, not 15), but it rolls back nothing.
        "stale-output-delivered",
        TIGHT,
        (
            AddRequest("a", 12, 6),
            AddRequest("b", 12, 6, arrival_time=1.0),
            S,  # 0: a 12 (3 blocks), b a 4-token chunk (1 block); free 4
            S,  # 1: a 1 (4 blocks), b 8 (3 blocks); free 1
            out(0, {"a": 1, "b": 0}),
            S,  # 2: a 1, b 1 (4 blocks); free 0
            out(1, {"a": 1, "b": 1}),
            S,  # 3: a 1, b 1
            out(2, {"a": 1, "b": 1}),
            S,  # 4: a 1, b 1
            out(3, {"a": 1, "b": 1}),
            S,  # 5: a needs a 5th block: b preempted, its step-4 token in flight (stale 1)
            out(4, {"a": 1, "b": 1}),  # b's stale token appended: b t=16
            S,  # 6: a skipped (17+2-1 >= 18); b's 16 tokens need 4 blocks, 3 free
            out(5, {"a": 1}),  # a reaches max_tokens 6, finished
            S,  # 7: b resumes with all 16 tokens
            out(6, {}),
            S,  # 8: b 1
            out(7, {"b": 1}),
            S,  # 9: b skipped (17+2-1 >= 18)
            out(8, {"b": 1}),  # b finished
            S,  # 10
            out(9, {}),
            out(10, {}),
        ),
        (
            decision({"a": 12, "b": 4}),
            decision({"a": 1, "b": 8}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1}, preempted=["b"]),
            decision({}),
            decision({"b": 16}, finished=["a"]),
            decision({"b": 1}),
            decision({}),
            decision({}, finished=["b"]),
        ),
        {"a": FINISHED_LENGTH, "b": FINISHED_LENGTH},
    ),
    Case(
        # Outputs three steps behind (a deeper batch queue than the engine's 2): at step 6
        # b's stale output of step 4 is still to come, so the waiting loop skips b though
        # a's natural stop has freed the pool; b resumes once it has come.
        "waiting-loop-skips-stale",
        TIGHT,
        (
            AddRequest("a", 12, 10),
            AddRequest("b", 12, 6, arrival_time=1.0),
            S,  # 0: a 12, b 4
            S,  # 1: a 1, b 8
            S,  # 2: a 1, b 1; free 0
            out(0, {"a": 1, "b": 0}),
            S,  # 3: a 1, b 1
            out(1, {"a": 1, "b": 1}),
            S,  # 4: a 1, b 1
            out(2, {"a": 1, "b": 1}),
            S,  # 5: a needs a 5th block: b preempted with steps 3 and 4 in flight (stale 2)
            out(3, {"a": 1, "b": 1}, {"a": 1}),  # a stops (frees 5 blocks); b t=15, stale 1
            S,  # 6: b skipped while its step-4 output can still arrive
            out(4, {"a": 1, "b": 1}),  # b t=16, stale 0
            S,  # 7: b resumes with 16 tokens
            out(5, {"a": 1}),
            S,  # 8: b 1
            out(6, {}),
            S,  # 9: b 1 (16+2-... : 17+2-2 < 18)
            out(7, {"b": 1}),
            S,  # 10: b skipped (18+2-2 >= 18)
            out(8, {"b": 1}),  # b finished
            S,  # 11
            out(9, {"b": 1}),
            out(10, {}),
            out(11, {}),
        ),
        (
            decision({"a": 12, "b": 4}),
            decision({"a": 1, "b": 8}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1, "b": 1}),
            decision({"a": 1}, preempted=["b"]),
            decision({}, finished=["a"]),
            decision({"b": 16}),
            decision({"b": 1}),
            decision({"b": 1}),
            decision({}),
            decision({}, finished=["b"]),
        ),
        {"a": FINISHED_STOPPED, "b": FINISHED_LENGTH},
    ),
    Case(
        # A natural stop in an output while the next step is in flight: the request
        # finishes FINISHED_STOPPED at the stop token; the in-flight step's output for
        # it is ignored.
        "natural-stop-in-flight",
        EAGLE,
        (
            AddRequest("r", 4, 20),
            S,  # 0
            S,  # 1: 3 tokens, 2 spec
            out(0, {"r": 1}),
            S,  # 2: 3 tokens, 2 spec
            out(1, {"r": 3}, {"r": 2}),  # both drafts accepted; the 2nd token stops r
            S,  # 3: reports r finished
            out(2, {"r": 1}),
            out(3, {}),
        ),
        (
            decision({"r": 4}),
            decision({"r": 3}, {"r": 2}),
            decision({"r": 3}, {"r": 2}),
            decision({}, finished=["r"]),
        ),
        {"r": FINISHED_STOPPED},
    ),
)
