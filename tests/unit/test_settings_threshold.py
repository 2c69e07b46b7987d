"""vLLM's assertion that a padded spec-decode request keeps 1 + K tokens, which
``long_prefill_token_threshold`` can break, is raised where vLLM raises it: after
``allocate_slots`` has succeeded. With a pool too short for the cut request vLLM only
stops its waiting loop, and so does the reference. A hand-worked case, run by the
reference and (marked ``live``) in lockstep against the installed vLLM.

The case: blocks of 4, n-gram K = 2, no draft accepted, prefix caching on, B = 32,
``max_model_len`` 20, threshold 2 < 1 + K. Request a (prompt P, 9 ids, 10 tokens out)
runs alone, so the threshold does not bite (vLLM applies it only with two requests or
more): step 0 prefills 9, steps 1-7 each schedule 1 + 2 drafts and keep one token. b, a
copy of P, arrives at step 8: a's decode is cut to 2 (one draft), a then holds 16 + 2
tokens, 5 blocks. b hits P's two full blocks (8 of its 9 tokens, vLLM's cap at
``num_tokens - 1``), so it needs one token: a one-token decode padded to 1 + K = 3, which
the threshold cuts to 2, past the block a holds, on a third block of its own.

- 7 blocks (6 usable): the block is there, ``allocate_slots`` succeeds, and vLLM asserts.
- 6 blocks (5 usable, all a's): ``allocate_slots`` fails, the waiting loop stops, b
  waits; a finishes at step 9 and b, alone, runs padded to 1 + K uncut from step 10.
"""

from __future__ import annotations

import pytest

from dualbudget.reference.events import StepRecord
from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, Scenario, validate
from dualbudget.reference.runs.driver import ScenarioRun
from dualbudget.reference.scheduler import UnmirroredVllmCrash
from dualbudget.reference.token_ids import segment
from dualbudget.spec.config import EngineConfig, SpeculativeConfig

PROFILES = ("vllm-0.32", "vllm-0.33")
P = segment("P", 9)
CRASH_STEP = 8
SHORT_POOL = 6
ROOMY_POOL = 7
WORKED_SHORT = {
    0: ({"a": 9}, {}),
    7: ({"a": 3}, {"a": 2}),
    8: ({"a": 2}, {"a": 1}),
    9: ({"a": 2}, {"a": 1}),
    10: ({"b": 3}, {"b": 2}),
}
"""The steps worked by hand on the short pool: (num_scheduled_tokens, spec tokens)."""


def threshold_case(num_gpu_blocks: int, profile: str) -> Scenario:
    config = EngineConfig(
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=20,
        block_size=4,
        num_gpu_blocks=num_gpu_blocks,
        long_prefill_token_threshold=2,
        speculative_config=SpeculativeConfig("ngram", 2),
        enable_prefix_caching=True,
    )
    requests = (
        RequestSpec("a", len(P), 10, 0, prompt_token_ids=P),
        RequestSpec("b", len(P), 8, CRASH_STEP, prompt_token_ids=P),
    )
    return validate(Scenario(profile, config, requests, Acceptance(fixed=0)))


def check_worked(records: list[StepRecord]) -> None:
    assert len(records) > max(WORKED_SHORT)
    for step, (scheduled, spec) in WORKED_SHORT.items():
        record = records[step]
        assert (record.num_scheduled_tokens, record.scheduled_spec_tokens) == (scheduled, spec)
        assert not record.preempted


@pytest.mark.parametrize("profile", PROFILES)
def test_the_reference_raises_only_once_the_cut_request_is_allocated(profile: str) -> None:
    run = ScenarioRun(threshold_case(ROOMY_POOL, profile), max_steps=16)
    records: list[StepRecord] = []
    with pytest.raises(UnmirroredVllmCrash, match=r"1 \+ K = 3.*'b' to 2") as crashed:
        records.extend(run.records())
    assert len(records) == CRASH_STEP
    assert crashed.value.crash == "padded-decode-cut-by-long-prefill-threshold"


@pytest.mark.parametrize("profile", PROFILES)
def test_with_a_short_pool_the_waiting_loop_just_stops(profile: str) -> None:
    records = list(ScenarioRun(threshold_case(SHORT_POOL, profile), max_steps=16).records())
    check_worked(records)


@pytest.mark.live
def test_the_case_agrees_with_the_live_vllm(profile: str) -> None:
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.lockstep import MirroredCrash, live_records

    short = threshold_case(SHORT_POOL, profile)
    check_worked(live_records(short, LiveScheduler(short.config), max_steps=16))
    roomy = threshold_case(ROOMY_POOL, profile)
    with pytest.raises(MirroredCrash, match="AssertionError") as crashed:
        live_records(roomy, LiveScheduler(roomy.config), max_steps=16)
    assert crashed.value.crash == "padded-decode-cut-by-long-prefill-threshold"
    assert crashed.value.step == CRASH_STEP
