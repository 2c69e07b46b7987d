"""Property tests of the hybrid coordinator over random group layouts and workloads.

Layouts shaped like the families served with speculative decoding (sliding window beside
full attention, chunked local attention, Mamba in each ``mamba_cache_mode`` beside full
attention, MLA and sliding-window MLA), on a pool large enough for any one request: every
run ends (no stall), C1-C3 hold at every step (the scheduler runs in ``raise`` mode), the
pool never goes below empty and every block lent is held by one request in one group.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualbudget.integration.commands import bench_workloads
from dualbudget.reference.events import Event, StepRecord
from dualbudget.reference.formats.scenario import Scenario, parse_scenario
from dualbudget.reference.kv.blocks import cdiv
from dualbudget.reference.kv.hybrid import HybridKVCacheManager
from dualbudget.reference.kv.kinds import single_type_manager
from dualbudget.reference.runs.driver import ScenarioRun, drive
from dualbudget.reference.scheduler import KV_GROUP_OBSERVED, Scheduler
from dualbudget.reference.state import SchedulerState
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig, runs_async
from dualbudget.spec.methods import layout_named
from dualbudget.spec.profiles import profile_named
from tests.kv_promise import counting_allocations, without_promise

MAX_STEPS = 3000
SETTINGS = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
METHODS = (None, "ngram", "eagle", "dflash")


FAMILIES = ("swa", "chunked", "mamba", "mamba-align", "mla", "swa-mla", "swa-2x", "full-2x")
"""``swa-2x``: a window beside full attention at twice its block; ``full-2x``: full
attention beside the drafter's at twice its block."""


def _layout(draw: st.DrawFn, family: str, block_size: int) -> list[dict[str, Any]]:
    """A family's groups, in vLLM's spec kinds."""
    full: dict[str, Any] = {"kind": "full_attention", "block_size": block_size}
    window = draw(st.integers(1, 24))
    twice = {**full, "block_size": 2 * block_size}
    if family in ("swa", "swa-2x"):
        return [
            {"kind": "sliding_window", "block_size": block_size, "sliding_window": window},
            twice if family == "swa-2x" else full,
        ]
    if family == "full-2x":
        return [full, {**twice, "is_eagle_group": True}]
    if family == "chunked":
        chunk = {"kind": "chunked_local_attention", "block_size": block_size}
        return [{**chunk, "attention_chunk_size": window}, full]
    if family == "mamba":
        size = draw(st.sampled_from([block_size, 64]))
        return [{"kind": "mamba", "block_size": size}, full]
    if family == "mamba-align":
        return [{"kind": "mamba", "block_size": block_size, "mamba_cache_mode": "align"}, full]
    mla: dict[str, Any] = {"kind": "mla_attention", "block_size": block_size}
    if family == "mla":
        return [mla]
    swa_mla = {"kind": "sliding_window_mla", "block_size": block_size, "sliding_window": window}
    return [swa_mla, mla]


def _runs_async(profile: str, method: str | None, k: int) -> bool:
    if method is None:
        return True
    spec = SpeculativeConfig.for_layout(layout_named(method), k)
    return runs_async(spec, profile_named(profile).release)


CACHING_FAMILIES = ("swa", "mla", "swa-mla", "swa-2x", "full-2x")
"""The families whose prefix caching the reference models."""


@st.composite
def scenarios(
    draw: st.DrawFn, families: tuple[str, ...] = FAMILIES, caching: bool = False
) -> Scenario:
    profile = draw(st.sampled_from(["vllm-0.32", "vllm-0.33"]))
    method = draw(st.sampled_from(METHODS))
    k = draw(st.integers(1, 3)) if method is not None else 0
    block_size = draw(st.sampled_from([2, 4, 8]))
    max_model_len = draw(st.integers(8, 64))
    groups = _layout(draw, draw(st.sampled_from(families)), block_size)
    # Room for any one request in every group: its tokens, drafts and lookahead, and a
    # Mamba group's speculative blocks.
    per_request = sum(
        cdiv(max_model_len + 2 * k + 2, group["block_size"]) + k + 1 for group in groups
    )
    cfg: dict[str, Any] = {
        "max_num_batched_tokens": draw(st.integers(16, 48)),
        "max_num_seqs": draw(st.integers(1, 4)),
        "max_model_len": max_model_len,
        "block_size": block_size,
        "num_gpu_blocks": per_request + 1 + draw(st.integers(0, 3) | st.integers(0, 60)),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 0, 5])),
        "async_scheduling": draw(st.booleans()) and _runs_async(profile, method, k),
        "kv_groups": groups,
    }
    if caching:
        cfg["enable_prefix_caching"] = True
    if method is not None:
        spec = SpeculativeConfig.for_layout(layout_named(method), k)
        cfg["speculative_config"] = {
            "method": spec.method,
            "num_speculative_tokens": k,
            "parallel_drafting": spec.parallel_drafting,
        }
    requests = [
        {
            "id": f"r{i}",
            "prompt_len": draw(st.integers(2, max_model_len - 1)),
            "max_tokens": draw(st.integers(1, 16)),
            "arrival_step": draw(st.integers(0, 4)),
        }
        for i in range(draw(st.integers(1, 6)))
    ]
    if caching:
        # A shared prefix of each prompt (none to all of it), then ids of its own.
        for index, request in enumerate(requests):
            length = int(str(request["prompt_len"]))
            shared = draw(st.integers(0, length), label="shared prefix")
            own = range(1000 * (index + 1), 1000 * (index + 1) + length)
            request["prompt_token_ids"] = [*range(shared), *own[: length - shared]]
    obj: dict[str, Any] = {"profile": profile, "config": cfg, "requests": requests}
    if k:
        obj["acceptance"] = {"fixed": draw(st.integers(0, k))}
    return parse_scenario(obj)


class Checked:
    """The reference, its pool checked after every event."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    @property
    def state(self) -> SchedulerState:
        return self.scheduler.state

    def handle(self, event: Event) -> StepRecord | None:
        record = self.scheduler.handle(event)
        state = self.scheduler.state
        assert state.free_blocks >= 0
        held = 0
        shared: set[int] = set()
        for request in state.requests.values():
            if request.kv_groups:  # one MLA group runs on the single-group manager
                assert sum(group.num_blocks for group in request.kv_groups) == request.num_blocks
                for group in request.kv_groups:
                    shared.update(block for block in group.block_ids if block)
            else:
                shared.update(request.block_ids)
            held += request.num_blocks
        pool = state.block_pool
        if pool is not None:
            # With prefix caching a hit block is held once however many requests hit it,
            # and every held block has a reference per holder.
            held = len(shared)
            assert state.free_blocks == pool.num_free_blocks
            assert all(pool.ref_cnt[block] > 0 for block in shared)
        assert state.free_blocks + held == self.scheduler.config.num_gpu_blocks - 1
        return record


@SETTINGS
@given(scenarios())
def test_hybrid_runs_end_and_every_block_is_accounted_for(scenario: Scenario) -> None:
    run = ScenarioRun(scenario, max_steps=MAX_STEPS)
    steps = sum(1 for _ in drive(run.driver, Checked(run.scheduler)))
    assert run.stall is None, run.stall
    assert steps < MAX_STEPS
    for request in run.scheduler.state.requests.values():
        assert request.finished
        assert request.num_blocks == 0


@SETTINGS
@given(scenarios(CACHING_FAMILIES, caching=True))
def test_hybrid_caching_runs_end_and_every_block_is_accounted_for(scenario: Scenario) -> None:
    run = ScenarioRun(scenario, max_steps=MAX_STEPS)
    steps = sum(1 for _ in drive(run.driver, Checked(run.scheduler)))
    assert run.stall is None, run.stall
    assert steps < MAX_STEPS
    pool = run.scheduler.state.block_pool
    assert pool is not None
    for request in run.scheduler.state.requests.values():
        assert request.finished
        assert request.num_blocks == 0
    # Every block is back in the pool, and every cached one is known by its key.
    assert pool.num_free_blocks == scenario.config.num_gpu_blocks - 1
    assert all(
        pool.block_hash[block] is not None for blocks in pool.cached.values() for block in blocks
    )


@pytest.mark.parametrize(
    ("families", "events"),
    [
        (("swa", "chunked", "swa-mla"), {"window_blocks_freed"}),
        (("mamba-align",), {"mamba_aligned_split"}),
        (("swa", "swa-mla"), {"hybrid_hit_cut"}),
        (("swa-2x", "full-2x"), {"hit_across_block_sizes"}),
    ],
)
def test_the_random_layouts_reach_the_kv_group_events(
    families: tuple[str, ...], events: set[str]
) -> None:
    reached: set[str] = set()
    caching = bool(events & {"hybrid_hit_cut", "hit_across_block_sizes"})

    @settings(SETTINGS, max_examples=15)
    @given(scenarios(families, caching=caching))
    def collect(scenario: Scenario) -> None:
        run = ScenarioRun(scenario, max_steps=MAX_STEPS)
        for _ in drive(run.driver, run.scheduler):
            pass
        reached.update(name for name in KV_GROUP_OBSERVED if run.scheduler.observed[name])

    collect()
    assert reached >= events


@given(
    kind=st.sampled_from(["full_attention", "sliding_window", "chunked_local_attention", "mamba"]),
    block_size=st.sampled_from([1, 4, 16]),
    width=st.integers(1, 64),
    num_blocks=st.integers(1, 12),
)
def test_num_processed_to_skip_inverts_num_skipped_tokens(
    kind: str, block_size: int, width: int, num_blocks: int
) -> None:
    """The promise's horizon is the first processed count whose skipped tokens fill the
    blocks: one token fewer fills fewer (so no block is freed early or late)."""
    group = single_type_manager(
        KVGroup(
            kind,
            block_size,
            sliding_window=width if kind == "sliding_window" else None,
            attention_chunk_size=width if kind == "chunked_local_attention" else None,
        ),
        EngineConfig(64, 4, 4096, block_size, 64),
    )
    first = group.num_processed_to_skip(num_blocks)
    if kind == "full_attention":
        assert first == sys.maxsize
        assert group.num_skipped_tokens(4096) == 0
        return
    assert group.num_skipped_tokens(first) // block_size >= num_blocks
    assert group.num_skipped_tokens(first - 1) // block_size < num_blocks


def _records(run: ScenarioRun) -> list[tuple[dict[str, Any], int]]:
    """Each step's record, and the free blocks after it: within the promise no block
    would be freed either, so the pool matches step by step."""
    return [
        (step.record.to_json(), run.scheduler.state.free_blocks)
        for step in drive(run.driver, run.scheduler)
    ]


@SETTINGS
@given(scenarios())
def test_the_hybrid_promise_changes_no_decision(scenario: Scenario) -> None:
    """The caching-off coordinator's ``kv_slots_covered`` / ``kv_skip_horizon`` promise
    skips only allocations that would change nothing: every layout family decides the
    same with it and without it."""
    fast = _records(ScenarioRun(scenario, max_steps=MAX_STEPS))
    with without_promise(HybridKVCacheManager):
        asked = _records(ScenarioRun(scenario, max_steps=MAX_STEPS))
    assert fast == asked


def test_the_hybrid_promise_spares_allocations() -> None:
    """Non-vacuity: on the bench's gpt-oss-shaped stream with caching off, the promise
    spares most of the coordinator's allocations, windows freed all the same."""
    [bench] = [w for w in bench_workloads("vllm-0.33") if len(w.config.groups) > 1]
    scenario = replace(bench, config=replace(bench.config, enable_prefix_caching=False))
    asks = {"fast": 0, "asked": 0}
    with counting_allocations(HybridKVCacheManager, asks, "fast"):
        run = ScenarioRun(scenario, max_steps=MAX_STEPS)
        fast = _records(run)
        assert run.scheduler.observed["window_blocks_freed"] > 0
    with (
        without_promise(HybridKVCacheManager),
        counting_allocations(HybridKVCacheManager, asks, "asked"),
    ):
        asked = _records(ScenarioRun(scenario, max_steps=MAX_STEPS))
    assert fast == asked
    assert asks["fast"] < asks["asked"] / 2, asks
