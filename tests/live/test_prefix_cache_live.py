"""Prefix caching against the live vLLM (needs vLLM; docs/vllm-environments.md): cases
worked by hand from vLLM's KV cache manager, run in lockstep with the reference (every
step's decisions equal, or ``DivergenceFound``), each one's worked steps pinned: the
reference's own cases (``tests/prefix_cases.py``, event streams with the pool they leave,
checked against vLLM's pool too) and the scenarios below; and differences planted in the
reference's prefix cache, which the fuzz must find.

Every case: blocks of 4, K = 2, ``B`` = 32 and four sequences, FCFS, no draft accepted,
K drafts proposed after every sampled token, prefix caching on. A prompt ``P`` of 9 ids
has two full blocks; a copy of it hits both (8 tokens, vLLM's cap at ``num_tokens - 1``),
a full hit: the request needs one token and is scheduled padded to 1 + K.
Without vLLM these tests fail under CI=true, else skip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from dualbudget.integration.live import installed_vllm_version
from dualbudget.integration.lockstep import Lockstep, live_records
from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, Scenario
from dualbudget.reference.prefix_cache import BlockPool, HitRule
from dualbudget.reference.token_ids import segment
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import layout_named
from dualbudget.spec.releases import Release
from tests import prefix_cases
from tests.planted_scenario import planted_divergence, planted_scenario

pytestmark = pytest.mark.live

P = segment("P", 9)

Decision = tuple[dict[str, int], dict[str, int], list[str]]
"""(num_scheduled_tokens, scheduled_spec_tokens, preempted) of one step."""


@dataclass(frozen=True)
class Case:
    name: str
    layout: str
    num_gpu_blocks: int
    requests: tuple[RequestSpec, ...]
    worked: dict[int, Decision]
    """The steps worked by hand, the same in both releases unless ``worked_by_release``."""
    worked_by_release: dict[str, dict[int, Decision]] = field(default_factory=dict)
    max_steps: int = 12


def _request(rid: str, ids: tuple[int, ...], max_tokens: int, arrival: int = 0) -> RequestSpec:
    return RequestSpec(rid, len(ids), max_tokens, arrival, prompt_token_ids=ids)


CASES = [
    # b copies a's prompt while a decodes: both of a's full blocks hit (a caches a block
    # when it allocates it), 8 of b's 9 tokens: b is a one-token request, padded to 1 + K.
    Case(
        "full hit padded to 1 + K",
        "ngram",
        40,
        (_request("a", P, 8), _request("b", P, 8, 1)),
        {0: ({"a": 9}, {}, []), 1: ({"a": 3, "b": 3}, {"a": 2, "b": 2}, [])},
    ),
    # The same under eagle: 0.32 drops the last hit block (use_eagle_block_drop), so b
    # hits 4 and prefills 5; 0.33 hashes one token past each block instead
    # (num_hash_lookahead_tokens = 1: P's 9 tokens still make 2 hashes), a full hit.
    Case(
        "eagle: 0.32 drops the last hit block, 0.33 hashes one token ahead",
        "eagle",
        40,
        (_request("a", P, 8), _request("b", P, 8, 1)),
        {0: ({"a": 9}, {}, [])},
        {
            "vllm-0.32": {1: ({"a": 3, "b": 5}, {"a": 2}, [])},
            # 0.34 hashes ahead as 0.33 does.
            **{
                profile: {1: ({"a": 3, "b": 3}, {"a": 2, "b": 2}, [])}
                for profile in ("vllm-0.33", "vllm-0.34")
            },
        },
    ),
    # 8 usable blocks; a holds 3. b's hit is on a's two blocks, which a holds: it costs
    # no free block, b takes one new block (tokens 8..10), and c's 16 tokens (4 blocks)
    # fit in the 4 left. (Were a held hit charged as free blocks, c would not fit.)
    Case(
        "a hit on blocks a running request holds costs no free block",
        "ngram",
        9,
        (_request("a", P, 20), _request("b", P, 8, 1), _request("c", segment("c", 16), 2, 1)),
        {0: ({"a": 9}, {}, []), 1: ({"a": 3, "b": 3, "c": 16}, {"a": 2, "b": 2}, [])},
        max_steps=6,
    ),
    # a finishes at step 0; its blocks go back to the free queue, still cached. b's hit
    # on them takes both off the free queue, plus one new block: 5 of 8 free are left,
    # and c's 24 tokens (6 blocks) wait.
    Case(
        "a hit on cached free blocks takes them from the free pool",
        "ngram",
        9,
        (_request("a", P, 1), _request("b", P, 8, 1), _request("c", segment("c", 24), 2, 1)),
        {1: ({"b": 3}, {"b": 2}, []), 2: ({"b": 3}, {"b": 2}, [])},
        max_steps=4,
    ),
    # a (blocks 1, 2, 3) finishes; freed tail first, the free queue is 4..8, 3, 2, 1. b's
    # 28 tokens take 7 blocks from the head, 4..8, 3 and 2: block 2, P's second block,
    # is evicted. c = P then hits only P's first block (block 1): 4 tokens, prefills 5.
    Case(
        "eviction takes the free queue's head: freed blocks tail first",
        "ngram",
        9,
        (_request("a", P, 1), _request("b", segment("b", 28), 1, 1), _request("c", P, 3, 2)),
        {1: ({"b": 28}, {}, []), 2: ({"c": 5}, {}, [])},
        max_steps=5,
    ),
    # a and b (13 tokens, 4 blocks each) fill the 8 usable blocks. At step 2 a needs a
    # fifth block: b, the last running, is preempted; freed, its three full blocks stay
    # cached (a takes b's partial last block, the queue's head). When a finishes, b
    # resumes with 15 tokens: it hits its own 12 and prefills 3.
    Case(
        "a preempted request resumes on its own cached blocks",
        "ngram",
        9,
        (_request("a", segment("a", 13), 6), _request("b", segment("b", 13), 12)),
        {
            0: ({"a": 13, "b": 13}, {}, []),
            1: ({"a": 3, "b": 3}, {"a": 2, "b": 2}, []),
            2: ({"a": 3}, {"a": 2}, ["b"]),
            6: ({"b": 3}, {}, []),
        },
        max_steps=9,
    ),
]


def _scenario(case: Case, profile: str) -> Scenario:
    config = EngineConfig(
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=32,
        block_size=4,
        num_gpu_blocks=case.num_gpu_blocks,
        speculative_config=SpeculativeConfig.for_layout(layout_named(case.layout), 2),
        enable_prefix_caching=True,
    )
    return Scenario(profile, config, case.requests, Acceptance(fixed=0))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hand_worked_prefix_case_agrees_live(case: Case, profile: str) -> None:
    from dualbudget.integration.live import LiveScheduler

    scenario = _scenario(case, profile)
    records = live_records(scenario, LiveScheduler(scenario.config), max_steps=case.max_steps)
    worked = {**case.worked, **case.worked_by_release.get(profile, {})}
    assert max(worked) < len(records)
    for step, (scheduled, spec, preempted) in worked.items():
        record = records[step]
        assert (record.num_scheduled_tokens, record.scheduled_spec_tokens) == (scheduled, spec), (
            step
        )
        assert sorted(record.preempted) == preempted, step


def _cases_of_the_installed_release() -> list[prefix_cases.Case]:
    """The cases worked from the installed vLLM's code: a case worked for one release only
    is not collected under the other (not skipped there). Without vLLM every case is
    collected, and each fails or skips as ``require_live_vllm`` says."""
    version = installed_vllm_version()
    if version is None:
        return list(prefix_cases.CASES)
    release = ".".join(version.split(".")[:2])
    return [case for case in prefix_cases.CASES if release in case.releases]


INSTALLED_CASES = _cases_of_the_installed_release()


@pytest.mark.parametrize("case", INSTALLED_CASES, ids=[c.name for c in INSTALLED_CASES])
def test_a_reference_prefix_case_agrees_live_block_for_block(
    case: prefix_cases.Case, profile: str
) -> None:
    """Each event of the case to both schedulers (``Lockstep`` compares every step's
    decisions); the steps worked by hand, and vLLM's own free queue and reference
    counts at the end, as the case has them."""
    assert profile.removeprefix("vllm-") in case.releases, (profile, case.releases)
    # The cases' pools are smaller than one request of their max_model_len, which vLLM's
    # engine (check_enough_kv_cache_memory) and the lockstep's validation refuse; their
    # requests never come near it, so it is cut to what the pool holds.
    config = case.config
    usable = (config.num_gpu_blocks - 1) * config.block_size
    lock = Lockstep(
        dataclasses.replace(config, max_model_len=min(config.max_model_len, usable)), profile
    )
    records = []
    for event in case.events:
        record = lock.handle(event)
        if record is not None:
            assert lock.last_live is not None
            records.append(lock.last_live)
    for step, (scheduled, spec, preempted) in case.decisions.items():
        record = records[step]
        assert (record.num_scheduled_tokens, record.scheduled_spec_tokens) == (scheduled, spec), (
            step
        )
        assert sorted(record.preempted) == preempted, step
    pool = lock.live.scheduler.kv_cache_manager.block_pool
    if case.free_queue is not None:
        free = tuple(block.block_id for block in pool.free_block_queue.get_all_free_blocks())
        assert free == case.free_queue
    for block_id, ref_cnt in case.ref_cnt.items():
        assert pool.blocks[block_id].ref_cnt == ref_cnt, block_id
    observed = lock.reference.observed
    for name in ("prefix_hit", "full_prefix_hit", "cached_block_evicted"):
        assert observed[name] == case.observed.get(name, 0), name


def _every_block_evictable(self: BlockPool, blocks: Iterable[int]) -> int:
    return len(list(blocks))


def _flipped_block_drop(
    release: Release, method: str | None, prefill_lookahead: int = 1
) -> HitRule:
    rule = _HIT_RULE_OF(release, method, prefill_lookahead)
    return dataclasses.replace(rule, drop_last_block=not rule.drop_last_block)


_HIT_RULE_OF = HitRule.of
PLANTED = {
    # A hit on blocks a running request holds charged as if they were free: the pools
    # differ at the first step.
    "held-hit-free": (BlockPool, "num_evictable", _every_block_evictable, ("free_blocks", 0)),
    # 0.32's eagle drop of the last hit block forgotten (under 0.33: one made up): a hit a
    # block off changes the tokens scheduled at step 3.
    "eagle-drop-flipped": (HitRule, "of", staticmethod(_flipped_block_drop), ("decision", 3)),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_prefix_cache_bug_is_found_on_its_scenario(
    bug: str, profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A difference planted in the reference's prefix cache, on a scenario of prompts
    sharing blocks that agrees with vLLM without it: found, in every release."""
    owner, name, planted, (kind, step) = PLANTED[bug]
    scenario = planted_scenario(bug, profile)
    assert scenario.config.enable_prefix_caching
    assert any(r.prompt_token_ids is not None for r in scenario.requests)
    found = planted_divergence(scenario, lambda: monkeypatch.setattr(owner, name, planted))
    assert found is not None, f"{bug}: the planted difference went unnoticed"
    assert (found.kind, found.step) == (kind, step), found.report()
