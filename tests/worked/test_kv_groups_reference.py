"""The reference's KV groups on cases worked by hand (``tests/kv_group_cases.py``), the
layouts it refuses by name, and the one-group layouts that must run as before."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.events import AddRequest, Event, ModelOutput, StepRecord
from dualbudget.reference.formats.scenario import load_scenario, parse_scenario, scenario_to_json
from dualbudget.reference.kv.blocks import is_tail_key
from dualbudget.reference.kv.coordinator import lookup_types, manager_for
from dualbudget.reference.kv.counting import KVCacheManager
from dualbudget.reference.kv.hybrid import HybridKVCacheManager
from dualbudget.reference.kv.hybrid_caching import HybridPrefixCachingKVCacheManager
from dualbudget.reference.scheduler import KV_GROUP_OBSERVED, Scheduler
from dualbudget.reference.violations import UnmirroredVllmCrash
from dualbudget.spec.config import (
    REFUSED_KV_GROUP_KINDS,
    ConfigError,
    EngineConfig,
    KVGroup,
    check_engine_config,
)
from dualbudget.spec.profiles import profile_named
from dualbudget.spec.releases import release_named
from dualbudget.spec.scenario_format import config_to_json
from tests.kv_group_cases import (
    BLOCK_SIZE,
    CASES,
    FULL,
    MAMBA_CHECKPOINT_PAST_THE_PROMPT,
    PROMPT_TAIL,
    PROMPT_TAIL_EVENTS,
    PROMPT_TAIL_KEYED,
    SLIDING_WINDOW,
    STEP,
    Case,
    cache_two_lookups,
    config,
)


def run(
    case_config: EngineConfig, release: str, events: tuple[Event, ...]
) -> tuple[Scheduler, list[tuple[StepRecord, int]]]:
    """Each step's record and the pool's free blocks after it."""
    scheduler = make_scheduler(case_config, profile_named(f"vllm-{release}"))
    steps = []
    for event in events:
        record = scheduler.handle(event)
        if record is not None:
            steps.append((record, scheduler.state.free_blocks))
        _check_blocks_add_up(scheduler)
    return scheduler, steps


def _check_blocks_add_up(scheduler: Scheduler) -> None:
    """Every block lent is held by exactly one request (in one group, where the
    coordinator keeps a table per group)."""
    state = scheduler.state
    held = 0
    shared: set[int] = set()
    for request in state.requests.values():
        if request.kv_groups:
            assert sum(group.num_blocks for group in request.kv_groups) == request.num_blocks
        held += request.num_blocks
        for group in request.kv_groups:
            shared.update(block for block in group.block_ids if block)
    if state.block_pool is not None:
        # With prefix caching a hit block is held by every request that hit it.
        held = len(shared)
        assert state.free_blocks == state.block_pool.num_free_blocks
    assert state.free_blocks + held == scheduler.config.num_gpu_blocks - 1


CASE_RUNS = [
    pytest.param(case, release, id=f"{case.name} ({release})")
    for case in CASES
    for release in case.releases
]


@pytest.mark.parametrize(("case", "release"), CASE_RUNS)
def test_case_worked_by_hand(case: Case, release: str) -> None:
    scheduler, steps = run(case.config, release, case.events)
    assert len(steps) == len(case.decisions)
    for index, (record, free_blocks) in enumerate(steps):
        scheduled, spec, preempted = case.decisions[index]
        assert (record.num_scheduled_tokens, record.scheduled_spec_tokens, record.preempted) == (
            scheduled,
            spec,
            preempted,
        ), f"step {index}"
        assert free_blocks == case.free_blocks[index], f"free blocks after step {index}"
    assert {name: scheduler.observed[name] for name in KV_GROUP_OBSERVED} == {
        name: case.observed.get(name, 0) for name in KV_GROUP_OBSERVED
    }


@pytest.mark.parametrize("release", sorted(PROMPT_TAIL_KEYED))
def test_a_coarser_group_keys_the_prompt_tail_where_it_drops_a_block(release: str) -> None:
    scheduler, _ = run(PROMPT_TAIL, release, PROMPT_TAIL_EVENTS[:2])
    pool = scheduler.state.block_pool
    assert pool is not None
    tail_block = scheduler.state.requests["r0"].kv_groups[1].block_ids[2]
    key = pool.block_hash[tail_block]
    assert (key is not None and is_tail_key(key)) == PROMPT_TAIL_KEYED[release]
    scheduler.handle(PROMPT_TAIL_EVENTS[2])
    queue = list(pool.free_queue)
    # Keyed, it is reused after every unkeyed block; unkeyed, it is reused first.
    assert (queue.index(tail_block) > 0) == PROMPT_TAIL_KEYED[release]


def test_every_kv_group_counter_is_reached_by_a_case() -> None:
    reached = {name for case in CASES for name, count in case.observed.items() if count > 0}
    assert reached == set(KV_GROUP_OBSERVED)


def test_a_window_release_is_only_on_the_processed_tokens() -> None:
    # Async: step 1 is scheduled while step 0's 8 tokens are in flight, so nothing is
    # processed and the window group frees nothing; its token 9 needs a third block of
    # each group (15 - 4 - 2 = 9).
    async_config = dataclasses.replace(config(16, SLIDING_WINDOW, FULL), async_scheduling=True)
    scheduler, steps = run(async_config, "0.33", (AddRequest("r0", 8, 6), STEP, STEP))
    assert [record.num_scheduled_tokens for record, _ in steps] == [{"r0": 8}, {"r0": 1}]
    assert [free for _, free in steps] == [11, 9]
    assert scheduler.observed["window_blocks_freed"] == 0
    # Step 0's output comes: at step 2, 9 computed less step 1's token in flight are
    # processed, so 5 skipped, one block back; token 10 fits the third blocks.
    scheduler.handle(ModelOutput({"r0": 1}, step=0))
    record = scheduler.handle(STEP)
    assert record is not None and record.num_scheduled_tokens == {"r0": 1}
    assert scheduler.state.free_blocks == 10
    assert scheduler.observed["window_blocks_freed"] == 1


def test_the_sliding_window_admission_cap() -> None:
    # A 40-token prompt wants 10 blocks per group for its whole sequence; the window
    # group's admission cap is cdiv(min(4 - 1 + 32, 64), 4) + 1 = 10 (the window need
    # not start at a block's start), so the gate asks 20: 20 lent blocks admit it, 19
    # do not (as live vLLM 0.32 and 0.33 do). Its first chunk (32 tokens) then takes 8
    # blocks per group.
    hybrid = config(21, SLIDING_WINDOW, FULL)
    _, steps = run(hybrid, "0.33", (AddRequest("r0", 40, 4), STEP))
    assert (steps[0][0].num_scheduled_tokens, steps[0][1]) == ({"r0": 32}, 20 - 16)
    short = dataclasses.replace(hybrid, num_gpu_blocks=20)
    _, steps = run(short, "0.33", (AddRequest("r0", 40, 4), STEP))
    assert (steps[0][0].num_scheduled_tokens, steps[0][1]) == ({}, 19)


def test_one_full_attention_group_keeps_the_single_group_manager() -> None:
    release = release_named("0.33")
    for groups in ((), (FULL,), (KVGroup("mla_attention", 4),)):
        manager = manager_for(config(16, *groups), release, 0, {})
        assert type(manager) is KVCacheManager
    assert isinstance(manager_for(config(16, SLIDING_WINDOW), release, 0, {}), HybridKVCacheManager)


@pytest.mark.parametrize("kind", sorted(REFUSED_KV_GROUP_KINDS))
def test_kinds_vllm_has_are_refused_by_name(kind: str) -> None:
    with pytest.raises(ConfigError, match=REFUSED_KV_GROUP_KINDS[kind]) as err:
        check_engine_config(config(16, FULL, KVGroup(kind, 4)))
    assert err.value.field == "kv_groups[1].kind"
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("group", "field"),
    [
        (KVGroup("sliding_window", 4), "kv_groups[0].sliding_window"),
        (KVGroup("full_attention", 4, sliding_window=8), "kv_groups[0].sliding_window"),
        (KVGroup("chunked_local_attention", 4), "kv_groups[0].attention_chunk_size"),
        (KVGroup("mamba", 4, mamba_cache_mode="some"), "kv_groups[0].mamba_cache_mode"),
        (KVGroup("full_attention", 4, mamba_cache_mode="align"), "kv_groups[0].mamba_cache_mode"),
        (KVGroup("mamba", 4, mamba_cache_mode="all"), "kv_groups[0].mamba_cache_mode"),
        (KVGroup("full_attention", 0), "kv_groups[0].block_size"),
        (KVGroup("full_attention", 4, spec_variant=-1), "kv_groups[0].spec_variant"),
        (KVGroup("linear_attention", 4), "kv_groups[0].kind"),
    ],
)
def test_bad_groups_are_refused(group: KVGroup, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_engine_config(config(16, group))
    assert err.value.field == field


def test_mamba_groups_share_one_cache_mode() -> None:
    none, align = KVGroup("mamba", 4), KVGroup("mamba", 4, mamba_cache_mode="align")
    with pytest.raises(ConfigError) as err:
        check_engine_config(config(16, none, align, FULL))
    assert err.value.field == "kv_groups"


@pytest.mark.parametrize(
    ("changed", "field"),
    [
        (
            {"kv_groups": (KVGroup("mamba", 8, mamba_cache_mode="align"), FULL)},
            "kv_groups[0].block_size",
        ),
        (
            {
                "enable_prefix_caching": True,
                "kv_groups": (KVGroup("mamba", 4), FULL),
            },
            "kv_groups[0].mamba_cache_mode",
        ),
        (
            {
                "enable_prefix_caching": True,
                "kv_groups": (
                    KVGroup("chunked_local_attention", BLOCK_SIZE, attention_chunk_size=8),
                    KVGroup("full_attention", 8),
                ),
            },
            "kv_groups[0].block_size",
        ),
        (
            {
                "block_size": 8,
                "mamba_prefill_checkpoint_blocks": 1,
                "kv_groups": (
                    KVGroup("mamba", 8, mamba_cache_mode="align"),
                    KVGroup("full_attention", 16),
                ),
            },
            "mamba_prefill_checkpoint_blocks",
        ),
    ],
)
def test_what_the_coordinator_does_not_model_is_refused(
    changed: dict[str, object], field: str
) -> None:
    hybrid = dataclasses.replace(config(16, SLIDING_WINDOW, FULL), **changed)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        Scheduler(hybrid, profile_named("vllm-0.33"))
    assert err.value.field == field


def test_groups_of_one_spec_are_one_lookup_type() -> None:
    """vLLM's ``attention_groups``: groups equal but for ``is_eagle_group`` are looked up
    together, full attention first; a group of one kind with another window is not."""
    mamba = KVGroup("mamba", 4, mamba_cache_mode="align")
    assert lookup_types((mamba, mamba, FULL)) == ((2,), (0, 1))
    wide = dataclasses.replace(SLIDING_WINDOW, sliding_window=2 * SLIDING_WINDOW.sliding_window)  # type: ignore[operator]
    drafter = dataclasses.replace(FULL, is_eagle_group=True)
    assert lookup_types((SLIDING_WINDOW, wide, FULL, drafter)) == ((2, 3), (0,), (1,))
    other_spec = dataclasses.replace(drafter, spec_variant=1)
    assert lookup_types((FULL, other_spec, FULL)) == ((0, 2), (1,))


def _hit_beside(
    drafter: KVGroup,
) -> tuple[HybridPrefixCachingKVCacheManager, tuple[int, ...], int]:
    """Full attention beside ``drafter`` under 0.32 with EAGLE, the first group holding a
    prompt's first 3 blocks cached, the drafter's its first 5: the coordinator, and the
    hit (blocks, tokens) it finds for the prompt."""
    hybrid = config(32, FULL, drafter, method="eagle", enable_prefix_caching=True)
    scheduler = Scheduler(hybrid, profile_named("vllm-0.32"))
    manager = scheduler.kv
    assert isinstance(manager, HybridPrefixCachingKVCacheManager)
    request = cache_two_lookups(manager.pool(scheduler.state), BLOCK_SIZE)
    hit, length = manager.get_computed_blocks(scheduler.state, request)
    return manager, hit, length


def test_groups_of_one_spec_hit_only_where_each_has_the_block() -> None:
    """Two full-attention groups of one spec, one the drafter's, under 0.32 (whose EAGLE
    drops the last hit block): the first group has 3 blocks of the prompt cached, the
    drafter's 5. Looked up together the common run of 3 drops its last: 2 blocks, for
    both (each group's own lookup, vLLM's for groups of two specs, would keep 3: the
    first group does not drop, and the drafter's drop lands back on its 3)."""
    manager, hit, length = _hit_beside(dataclasses.replace(FULL, is_eagle_group=True))
    assert (manager.lookup_types, manager.drop_groups) == (((0, 1),), (True, True))
    assert length == 2 * BLOCK_SIZE
    assert hit == (1, 2, 4, 5)


def test_groups_of_two_specs_are_looked_up_apart() -> None:
    """The blocks cached as above, the drafter's group a spec of its own (``spec_variant``,
    vLLM's spec of another head size): each group is looked up on its own and only the
    drafter's drops (the one marked): the first keeps its 3 blocks, the drafter's its 4 of
    5, so the hit is 3 blocks for both, where looked up together it was 2."""
    drafter = KVGroup("full_attention", BLOCK_SIZE, is_eagle_group=True, spec_variant=1)
    manager, hit, length = _hit_beside(drafter)
    assert (manager.lookup_types, manager.drop_groups) == (((0,), (1,)), (False, True))
    assert length == 3 * BLOCK_SIZE
    assert hit == (1, 2, 3, 4, 5, 6)


def test_a_chunked_local_group_whose_hit_drops_a_block_is_refused() -> None:
    """0.32's EAGLE drops every group's last hit block where none is marked as the
    drafter's, which vLLM's chunked-local hit asserts against; 0.33's lookahead hashes
    drop none, so the same layout runs."""
    llama4 = config(
        16,
        KVGroup("chunked_local_attention", 4, attention_chunk_size=8),
        FULL,
        method="eagle",
        enable_prefix_caching=True,
    )
    with pytest.raises(ConfigError) as err:
        Scheduler(llama4, profile_named("vllm-0.32"))
    assert err.value.field == "kv_groups[0].is_eagle_group"
    Scheduler(llama4, profile_named("vllm-0.33"))


def test_the_scenario_format_reads_and_writes_kv_groups() -> None:
    scenario = load_scenario("examples/kv-pressure.json")
    assert "kv_groups" not in config_to_json(scenario.config)  # () is not written
    obj = scenario_to_json(scenario)
    obj["config"]["kv_groups"] = [
        {"kind": "sliding_window", "block_size": 4, "sliding_window": 8},
        {"kind": "full_attention", "block_size": 4, "is_eagle_group": True},
        {"kind": "full_attention", "block_size": 4, "spec_variant": 1},
    ]
    read = parse_scenario(json.loads(json.dumps(obj)))
    assert read.config.kv_groups == (
        KVGroup("sliding_window", 4, sliding_window=8),
        KVGroup("full_attention", 4, is_eagle_group=True),
        KVGroup("full_attention", 4, spec_variant=1),
    )
    assert scenario_to_json(read)["config"]["kv_groups"] == obj["config"]["kv_groups"]
    obj["config"]["kv_groups"] = [{"kind": "cross_attention", "block_size": 4}]
    with pytest.raises(ValueError, match=r"kv_groups\[0\]\.kind: CrossAttentionSpec"):
        parse_scenario(obj)


@pytest.mark.parametrize("release", ["0.32", "0.33"])
def test_a_checkpoint_past_a_padded_prompt_is_a_vllm_crash(release: str) -> None:
    """The reference refuses to guess where vLLM fails its assertion
    (``tests/live/test_hybrid_live.py`` shows vLLM failing there too)."""
    config, events = MAMBA_CHECKPOINT_PAST_THE_PROMPT
    with pytest.raises(
        UnmirroredVllmCrash, match="checkpoint at 16 tokens is past its 3"
    ) as crashed:
        run(config, release, events)
    assert crashed.value.crash == "mamba-checkpoint-past-block-hashes"
