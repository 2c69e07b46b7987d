"""The reference judging its own steps by the scheduler's books (``reference/books.py``):
silent on the hand-worked streams, and naming the item a mirrored break would break."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest

from dualbudget.reference import async_scheduler
from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import AddRequest, ModelOutput, ScheduleStep
from dualbudget.reference.prefix_cache import BlockPool
from dualbudget.reference.violations import ContractViolation
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.profiles import profile_named
from tests import prefix_cases
from tests.engine_call_cases import CASES
from tests.worked_cases import Case

SHARED_HIT = "full hit on running blocks, padded"
"""The prefix case whose second request hits blocks the first one holds."""

EAGLE_ASYNC = EngineConfig(
    max_num_batched_tokens=64,
    max_num_seqs=4,
    max_model_len=64,
    block_size=16,
    num_gpu_blocks=64,
    speculative_config=SpeculativeConfig("eagle3", 2),
    async_scheduling=True,
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_hand_worked_streams_keep_every_book(case: Case) -> None:
    scheduler = make_scheduler(
        case.config, profile_named("vllm-0.34"), check="collect", judge_books=True
    )
    for event in case.events:
        scheduler.handle(event)
    assert scheduler.violations == []


def _decode(forget: bool, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The book items an EAGLE-3 request decoding under async scheduling breaks; with
    ``forget``, the reference holds no placeholder for the token each step samples (as a
    mirrored vLLM bug would)."""
    if forget:
        monkeypatch.setattr(async_scheduler, "NUM_SAMPLED_PER_STEP", 0)
    scheduler = make_scheduler(
        EAGLE_ASYNC, profile_named("vllm-0.34"), check="collect", judge_books=True
    )
    scheduler.handle(AddRequest("r", 4, 8))
    scheduler.handle(ScheduleStep())
    scheduler.handle(ScheduleStep())
    scheduler.handle(ModelOutput({"r": 1}, step=0))
    scheduler.handle(ScheduleStep())
    return sorted({violation.contract for violation in scheduler.violations})


def test_a_mirrored_break_of_the_placeholders_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _decode(False, monkeypatch) == []
    assert "C7" in _decode(True, monkeypatch)


def test_a_break_raises_where_the_run_asks_it_to() -> None:
    scheduler = make_scheduler(
        replace(EAGLE_ASYNC, async_scheduling=False), profile_named("vllm-0.34"), judge_books=True
    )
    scheduler.handle(AddRequest("r", 4, 8))
    scheduler.state.requests["r"].num_output_placeholders = -1  # no scheduler makes this
    with pytest.raises(ContractViolation, match="C7"):
        scheduler.handle(ScheduleStep())


def _pool_items(case: prefix_cases.Case, release: str) -> list[str]:
    """The book items the reference's own steps break on a hand-worked prefix case."""
    scheduler = make_scheduler(
        case.config, profile_named(f"vllm-{release}"), check="collect", judge_books=True
    )
    for event in case.events:
        scheduler.handle(event)
    return sorted({violation.contract for violation in scheduler.violations})


@pytest.mark.parametrize("case", prefix_cases.CASES, ids=lambda c: c.name)
def test_every_block_the_hand_worked_prefix_cases_share_is_held(case: prefix_cases.Case) -> None:
    # Hits on blocks a running request holds: two tables, a count of two, a cached block.
    assert _pool_items(case, case.releases[-1]) == []


def test_a_hit_that_takes_no_reference_is_a_c13_break(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache hit on another request's blocks that takes no reference on them (as a
    mirrored vLLM bug would): the blocks are shared by two tables at a count of one, so a
    free of either request hands them to a third."""
    shared = [case for case in prefix_cases.CASES if case.name == SHARED_HIT]
    assert shared, SHARED_HIT

    def touch_nothing(pool: BlockPool, blocks: Iterable[int]) -> int:
        held = 0
        for block in blocks:
            if pool.ref_cnt[block] == 0:
                del pool.free_queue[block]
                pool.ref_cnt[block] = 1
            else:
                held += 1
        return held

    monkeypatch.setattr(BlockPool, "touch", touch_nothing)
    assert "C13" in _pool_items(shared[0], shared[0].releases[-1])
