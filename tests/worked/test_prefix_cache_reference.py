"""The reference's prefix cache on cases worked by hand from vLLM's KV cache manager
(``tests/prefix_cases.py``), the hash chain, the hit rules per release and drafter, and
the events it refuses."""

from __future__ import annotations

import dataclasses

import pytest

from dualbudget.reference.events import AddRequest, Event, ModelOutput, ScheduleStep, StepRecord
from dualbudget.reference.kv.counting import KVCacheManager
from dualbudget.reference.kv.prefix_caching import PrefixCachingKVCacheManager
from dualbudget.reference.prefix_cache import BlockPool, HitRule, hash_blocks
from dualbudget.reference.scheduler import PREFIX_OBSERVED, Scheduler
from dualbudget.reference.state import SchedulerState
from dualbudget.spec.config import ConfigError, EngineConfig, check_engine_config
from dualbudget.spec.profiles import profile_named
from dualbudget.spec.releases import release_named
from tests.prefix_cases import CASES, STEP, Case, P, add, config, sample


def _pool(state: SchedulerState) -> BlockPool:
    assert state.block_pool is not None
    return state.block_pool


def run(
    case_config: EngineConfig, release: str, events: tuple[Event, ...]
) -> tuple[Scheduler, list[StepRecord]]:
    scheduler = Scheduler(case_config, profile_named(f"vllm-{release}"))
    records = []
    for event in events:
        record = scheduler.handle(event)
        if record is not None:
            records.append(record)
        if scheduler.state.block_pool is not None:
            # One count, two views: the scheduler's free blocks are the free queue.
            assert scheduler.state.free_blocks == _pool(scheduler.state).num_free_blocks
    return scheduler, records


CASE_RUNS = [
    pytest.param(case, release, id=f"{case.name} ({release})")
    for case in CASES
    for release in case.releases
]


@pytest.mark.parametrize(("case", "release"), CASE_RUNS)
def test_case_worked_by_hand(case: Case, release: str) -> None:
    scheduler, records = run(case.config, release, case.events)
    for step, (scheduled, spec, preempted) in case.decisions.items():
        record = records[step]
        assert (record.num_scheduled_tokens, record.scheduled_spec_tokens, record.preempted) == (
            scheduled,
            spec,
            preempted,
        ), f"step {step}"
    assert {name: scheduler.observed[name] for name in PREFIX_OBSERVED} == {
        name: case.observed.get(name, 0) for name in PREFIX_OBSERVED
    }
    pool = _pool(scheduler.state)
    if case.free_queue is not None:
        assert tuple(pool.free_queue) == case.free_queue
    for block, ref_cnt in case.ref_cnt.items():
        assert pool.ref_cnt[block] == ref_cnt, f"block {block}"
    # Every block is free, or held as often as requests hold it.
    held = [0] * len(pool.ref_cnt)
    for request in scheduler.state.requests.values():
        for block in request.block_ids:
            held[block] += 1
    assert held == pool.ref_cnt
    assert all((pool.ref_cnt[b] == 0) == (b in pool.free_queue) for b in range(1, len(held)))


def test_every_prefix_counter_is_reached_by_a_case() -> None:
    reached = {name for case in CASES for name, count in case.observed.items() if count > 0}
    assert reached == set(PREFIX_OBSERVED)


# -- the hash chain -------------------------------------------------------------------
def test_hash_chain_covers_full_blocks_and_the_whole_prefix() -> None:
    ids = list(range(10))
    hashes = hash_blocks(None, ids, 4)
    assert len(hashes) == 2  # 10 tokens: two full blocks, the rest unhashed
    # The same tokens, the same chain; one token changed in the first block changes
    # every later hash (a hash names its whole prefix).
    assert hash_blocks(None, list(ids), 4) == hashes
    other = hash_blocks(None, [99, *ids[1:]], 4)
    assert other[0] != hashes[0] and other[1] != hashes[1]
    # The same block after another prefix is another block.
    assert hash_blocks(None, ids[4:8], 4)[0] != hashes[1]
    # Extending a chain from its last hash equals hashing the whole again.
    longer = [*ids, 10, 11, 12]
    assert hashes + hash_blocks(hashes[-1], longer, 4, start=8) == hash_blocks(None, longer, 4)


def test_lookahead_hash_waits_for_and_covers_the_next_token() -> None:
    ids = list(range(8))
    assert len(hash_blocks(None, ids, 4, lookahead=1)) == 1  # block 2 has no token after it yet
    assert len(hash_blocks(None, [*ids, 8], 4, lookahead=1)) == 2
    one = hash_blocks(None, [*ids, 8], 4, lookahead=1)
    two = hash_blocks(None, [*ids, 9], 4, lookahead=1)
    assert one[0] == two[0] and one[1] != two[1]


@pytest.mark.parametrize(
    ("release", "method", "rule"),
    [
        ("0.32", None, HitRule(False, 0)),
        ("0.32", "ngram", HitRule(False, 0)),
        ("0.32", "eagle3", HitRule(True, 0)),
        ("0.32", "mtp", HitRule(True, 0)),
        ("0.32", "dflash", HitRule(True, 0)),
        ("0.32", "dspark", HitRule(True, 0)),
        ("0.32", "draft_model", HitRule(False, 0)),
        ("0.33", "eagle", HitRule(False, 1)),
        ("0.33", "eagle3", HitRule(False, 1)),
        ("0.33", "mtp", HitRule(False, 1)),
        ("0.33", "dflash", HitRule(False, 0)),
        ("0.33", "dspark", HitRule(False, 0)),
        ("0.33", "ngram", HitRule(False, 0)),
    ],
)
def test_hit_rule_per_release_and_drafter(release: str, method: str | None, rule: HitRule) -> None:
    """vLLM 0.32's ``use_eagle_block_drop`` holds for every drafter of ``use_eagle()``;
    0.33 drops for none, and gives the EAGLE-style ones (not DFlash/DSpark) a hash
    lookahead of ``num_prefill_lookahead_tokens`` = 1 instead."""
    assert HitRule.of(release_named(release), method) == rule


def test_full_hit_blocks_are_a_one_token_request_with_lookahead_hashes() -> None:
    """With 0.33's lookahead a 9-token prompt has (9 - 1) // 4 = 2 hashes, as many as
    without it: the hit of a copy is still 8 tokens."""
    rule = HitRule.of(release_named("0.33"), "eagle3")
    assert rule.num_hashes(9, 4) == 2 and rule.num_hashes(8, 4) == 1
    assert HitRule().num_hashes(8, 4) == 2


# -- the two managers -----------------------------------------------------------------
def test_caching_off_keeps_the_counting_manager_and_ignores_ids() -> None:
    cfg = dataclasses.replace(config(12, "ngram"), enable_prefix_caching=False)
    events = next(c for c in CASES if c.name == "full hit on free cached blocks").events
    scheduler, records = run(cfg, "0.32", events)
    assert type(scheduler.kv) is KVCacheManager
    assert scheduler.state.block_pool is None
    # The copy of P is computed again in full: no hit without caching.
    assert records[1].num_scheduled_tokens == {"r1": 9}
    assert all(scheduler.observed[name] == 0 for name in PREFIX_OBSERVED)
    bare = tuple(
        AddRequest(e.request_id, e.prompt_len, e.max_tokens) if isinstance(e, AddRequest) else e
        for e in events
    )
    assert [r.decision() for r in run(cfg, "0.32", bare)[1]] == [r.decision() for r in records]


def test_caching_on_picks_the_pool_manager() -> None:
    scheduler = Scheduler(config(12), profile_named("vllm-0.32"))
    assert type(scheduler.kv) is PrefixCachingKVCacheManager
    pool = _pool(scheduler.state)
    assert list(pool.free_queue) == list(range(1, 12))  # block 0: the null block


@pytest.mark.parametrize(("case", "release"), CASE_RUNS)
def test_recorded_hashes_replay_as_the_ids(case: Case, release: str) -> None:
    """A request given vLLM's block hashes (opaque) instead of ids hits as the ids do:
    the hashes are those the ids make, added at the request and per output."""
    token_run = Scheduler(case.config, profile_named(f"vllm-{release}"))
    events: list[Event] = []
    for event in case.events:
        if isinstance(event, AddRequest):
            token_run.handle(event)
            hashes = token_run.state.requests[event.request_id].block_hashes
            assert hashes is not None
            events.append(
                dataclasses.replace(event, prompt_token_ids=None, block_hashes=tuple(hashes))
            )
            continue
        if isinstance(event, ModelOutput):
            before = {
                rid: list(r.block_hashes or ()) for rid, r in token_run.state.requests.items()
            }
            token_run.handle(event)
            gained = {
                rid: tuple((token_run.state.requests[rid].block_hashes or [])[len(before[rid]) :])
                for rid in event.num_sampled
            }
            events.append(dataclasses.replace(event, token_ids={}, block_hashes=gained))
            continue
        token_run.handle(event)
        events.append(event)
    token_records = run(case.config, release, case.events)[1]
    hashed, hashed_records = run(case.config, release, tuple(events))
    assert [r.decision() for r in hashed_records] == [r.decision() for r in token_records]
    assert hashed.observed == token_run.observed


# -- bad input ------------------------------------------------------------------------
def _scheduler(release: str = "0.32", method: str | None = "ngram") -> Scheduler:
    return Scheduler(config(12, method), profile_named(f"vllm-{release}"))


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (AddRequest("r", 9, 3), "exactly one of"),
        (AddRequest("r", 9, 3, prompt_token_ids=P, block_hashes=("a", "b")), "exactly one of"),
        (AddRequest("r", 9, 3, prompt_token_ids=P[:8]), "8 prompt_token_ids for prompt_len 9"),
        (AddRequest("r", 9, 3, block_hashes=("a",)), "1 block hashes for 9 tokens"),
    ],
)
def test_bad_requests_are_refused_by_name(event: AddRequest, message: str) -> None:
    from dualbudget.reference.events import InvalidEvent

    with pytest.raises(InvalidEvent, match=message) as raised:
        _scheduler().handle(event)
    assert "'r'" in str(raised.value)


def test_lookahead_hash_count_is_checked_per_release() -> None:
    from dualbudget.reference.events import InvalidEvent

    # 0.33 eagle: 8 tokens have one lookahead hash, not two.
    with pytest.raises(InvalidEvent, match="2 block hashes for 8 tokens"):
        _scheduler("0.33", "eagle3").handle(AddRequest("r", 8, 3, block_hashes=("a", "b")))
    _scheduler("0.32", "eagle3").handle(AddRequest("r", 8, 3, block_hashes=("a", "b")))


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (ModelOutput({"r0": 1}), "'r0' sampled 1 tokens; its model output must carry as many"),
        (sample(r0=(1, 2)), "'r0' sampled 2 tokens; at most 1"),
        (ModelOutput({"r0": 1}, token_ids={"r0": (1, 2)}), "'r0' sampled 1 tokens"),
        (ModelOutput({"r0": 0}, token_ids={"r0": (1,)}), "token ids or hashes for 'r0'"),
    ],
)
def test_bad_outputs_are_refused_by_name(output: ModelOutput, message: str) -> None:
    from dualbudget.reference.events import InvalidEvent

    scheduler = _scheduler()
    scheduler.handle(add("r0", P, 3))
    scheduler.handle(STEP)
    with pytest.raises(InvalidEvent, match=message):
        scheduler.handle(output)


def test_recorded_output_hashes_must_match_the_tokens() -> None:
    from dualbudget.reference.events import InvalidEvent

    scheduler = _scheduler()
    # Seven tokens: one full block; the sampled token completes a second.
    scheduler.handle(AddRequest("r0", 7, 3, block_hashes=("h0",)))
    scheduler.handle(ScheduleStep())
    with pytest.raises(InvalidEvent, match="'r0': 1 block hashes for 8 tokens"):
        scheduler.handle(ModelOutput({"r0": 1}, block_hashes={"r0": ()}))


def test_enable_prefix_caching_must_be_a_flag() -> None:
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        check_engine_config(dataclasses.replace(config(12), enable_prefix_caching="yes"))  # type: ignore[arg-type]
