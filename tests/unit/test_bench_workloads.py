"""The bench's streams run with vLLM's defaults (prefix caching on, a shared system prompt,
a hybrid layout among them), and what makes the reference's caching path fast changes no
decision: the caching managers' ``kv_slots_covered`` / ``kv_skip_horizon`` promise (single
group and hybrid), which lets the scheduler skip ``allocate_slots`` and ``cache_blocks``
calls that would do nothing, and the block hash chain."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dualbudget.integration import commands
from dualbudget.reference.async_scheduler import make_scheduler
from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, Scenario, validate
from dualbudget.reference.kv.hybrid_caching import HybridPrefixCachingKVCacheManager
from dualbudget.reference.kv.prefix_caching import PrefixCachingKVCacheManager
from dualbudget.reference.prefix_cache import hash_blocks
from dualbudget.reference.runs.driver import EventDriver, drive
from dualbudget.reference.token_ids import segment, unique_prompt
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.profiles import profile_named
from tests.kv_promise import counting_allocations, without_promise

PROFILES = ("vllm-0.32", "vllm-0.33")


@pytest.mark.parametrize("profile", PROFILES)
def test_every_stream_caches_a_shared_system_prompt(profile: str) -> None:
    workloads = commands.bench_workloads(profile)
    names = [commands.workload_method(w) for w in workloads]
    assert names == [
        "none",
        "ngram",
        "eagle3",
        "dflash",
        "eagle3+async",
        "eagle3+async+hybrid",
    ]
    system = segment("bench:system", commands.BENCH_SYSTEM_PROMPT_LEN)
    for workload in workloads:
        assert workload.config.enable_prefix_caching
        for request in workload.requests:
            assert request.prompt_token_ids is not None
            assert request.prompt_token_ids[: len(system)] == system
    [hybrid] = [w for w in workloads if len(w.config.groups) > 1]
    assert [g.kind for g in hybrid.config.groups] == ["sliding_window", "full_attention"]


@pytest.mark.parametrize("profile", PROFILES)
def test_every_stream_hits_the_system_prompt(profile: str) -> None:
    for workload in commands.bench_workloads(profile):
        stream, hits = commands._record_events(workload)
        # Every request but the first to reach the system prompt's blocks hits them (the
        # first arrivals of a step may all miss: none of them has cached it yet).
        assert len(workload.requests) - 16 <= hits <= len(workload.requests), workload
        assert stream


def _hybrid_layout(rng: random.Random, block_size: int, eagle: bool) -> tuple[KVGroup, ...]:
    """Shaped like gpt-oss (a sliding window beside full attention) or Llama 4 (chunked
    local attention beside it), windows and chunks of one to three blocks; beside a
    window, full attention at twice its block one time in three (Gemma-like pages)."""
    width = block_size * rng.randint(1, 3)
    if rng.random() < 0.6:
        local = KVGroup("sliding_window", block_size, sliding_window=width)
        full_block = block_size * rng.choice((1, 1, 2))
    else:
        local = KVGroup("chunked_local_attention", block_size, attention_chunk_size=width)
        full_block = block_size
    return (local, KVGroup("full_attention", full_block, is_eagle_group=eagle))


def _random_scenario(rng: random.Random, index: int) -> Scenario:
    """A small caching-on scenario whose pool is short now and then (evictions,
    preemptions, resumed re-hits), prompts sharing prefixes and earlier turns."""
    block_size = rng.choice((2, 4, 8, 16))
    spec = rng.choice(
        (
            None,
            SpeculativeConfig("ngram", 3),
            SpeculativeConfig("eagle3", 4, True),
            SpeculativeConfig("dflash", 4, True),
            SpeculativeConfig("eagle", 2, True),
        )
    )
    async_scheduling = (spec is None or spec.method != "ngram") and rng.random() < 0.4
    systems = [segment(f"system{j}", rng.randint(0, 40)) for j in range(3)]
    requests: list[RequestSpec] = []
    for i in range(rng.randint(1, 12)):
        prefix = rng.choice(systems)
        if requests and rng.random() < 0.2:
            prefix = requests[rng.randrange(len(requests))].prompt_token_ids or ()
        ids = (tuple(prefix) + unique_prompt(f"{index}:{i}", rng.randint(1, 40)))[:100]
        requests.append(
            RequestSpec(
                str(i), len(ids), rng.randint(1, 40), rng.randint(0, 6), prompt_token_ids=ids
            )
        )
    # vLLM's pool holds one request of max_model_len at least; up to three here.
    one_request = -(-128 // block_size) + 1
    config = EngineConfig(
        max_num_batched_tokens=rng.choice((16, 32, 64, 256)),
        max_num_seqs=rng.choice((2, 4, 16)),
        max_model_len=128,
        block_size=block_size,
        num_gpu_blocks=one_request + rng.randint(0, 2 * one_request),
        speculative_config=spec,
        async_scheduling=async_scheduling,
        enable_prefix_caching=True,
        scheduling_policy=rng.choice(("fcfs", "fcfs", "priority")),
        # Two in five hybrid: the coordinator hashes through the single-group manager and
        # keeps its own promise, window and chunk skips included.
        kv_groups=_hybrid_layout(rng, block_size, spec is not None) if rng.random() < 0.4 else (),
    )
    stops = {s: {str(i): 1 for i in range(len(requests)) if rng.random() < 0.05} for s in range(30)}
    acceptance = Acceptance(fixed=None, per_position=(0.8, 0.6, 0.5, 0.3), seed=index)
    return validate(
        Scenario(rng.choice(PROFILES), config, tuple(requests), acceptance, stops=stops)
    )


def _run(scenario: Scenario) -> dict[str, Any]:
    reference = make_scheduler(scenario.config, profile_named(scenario.profile), check="collect")
    records, free_blocks = [], []
    for step in drive(EventDriver.of(scenario, 400), reference):
        records.append(step.record.to_json())
        # Within the promise no block would be freed either: the pool matches step by step.
        free_blocks.append(reference.state.free_blocks)
    return {"records": records, "free_blocks": free_blocks, "observed": dict(reference.observed)}


def test_the_caching_promise_changes_no_decision() -> None:
    rng = random.Random(1)
    scenarios = [_random_scenario(rng, i) for i in range(60)]
    scenarios += [w for p in PROFILES for w in commands.bench_workloads(p)]
    asks = {"fast": 0, "asked": 0}
    hybrid = HybridPrefixCachingKVCacheManager
    with counting_allocations(hybrid, asks, "fast"):
        fast = [_run(s) for s in scenarios]
    with (
        without_promise(PrefixCachingKVCacheManager, hybrid),
        counting_allocations(hybrid, asks, "asked"),
    ):
        asked = [_run(s) for s in scenarios]
    assert fast == asked
    # The hybrid promise is kept: it spares most of the coordinator's allocations.
    assert asks["fast"] < asks["asked"] / 2, asks
    # The scenarios reach what the promise must not skip past: evictions, preemptions,
    # hits on running requests' blocks, resumed re-hits.
    observed = [run["observed"] for run in fast]
    for event in ("cached_block_evicted", "hit_on_running_block", "resume_rehit"):
        assert sum(o[event] > 0 for o in observed) >= 4, event
    assert sum(any(r["preempted"] for r in run["records"]) for run in fast) >= 5
    # ... and the hybrid layouts free window and chunk blocks, preempt and cut hits.
    for event in ("window_blocks_freed", "hybrid_preempt", "hybrid_hit_cut"):
        assert sum(o.get(event, 0) > 0 for o in observed) >= 3, event


def test_the_hash_chain_is_one_chain() -> None:
    ids = list(range(20, 61))
    hashes = hash_blocks(None, ids, 8, lookahead=1)
    assert len(hashes) == 5  # 40 of the 41 ids, the 41st after the fifth block
    # Hashing the tail from the last hash continues the same chain.
    assert (
        hash_blocks(None, ids[:17], 8, lookahead=1)
        + hash_blocks(hashes[1], ids, 8, start=16, lookahead=1)
        == hashes
    )
    # A block's hash covers its lookahead token, and every block before it.
    assert hash_blocks(None, [*ids[:40], 99], 8, lookahead=1)[4] != hashes[4]
    assert hash_blocks(None, [99, *ids[1:]], 8, lookahead=1)[4] != hashes[4]


def test_ids_past_64_bits_are_hashed() -> None:
    huge = [2**64 + i for i in range(8)]
    hashes = hash_blocks(None, huge, 4)
    assert len(hashes) == 2 and len(set(hashes)) == 2
    assert hash_blocks(hashes[0], huge, 4, start=4) == hashes[1:]
    assert hash_blocks(None, [huge[0] + 1, *huge[1:]], 4)[1] != hashes[1]
