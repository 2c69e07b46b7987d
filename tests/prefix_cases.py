"""Prefix-caching cases worked by hand from vLLM's KV cache manager, as data: each an
event stream, the decisions expected of the steps worked, and what the pool holds at
the end. ``tests/worked/test_prefix_cache_reference.py`` runs them through the reference; the
same events can be fed to the live vLLM (their hand-worked numbers hold in both).

Blocks of 4 tokens; block 0 is vLLM's null block, so a fresh pool's free queue is
``1, 2, ...`` in id order. ``P`` is a prompt of 9 ids: two full blocks (``P0``, ``P1``)
and one token in a third; a copy of it hits both blocks (8 tokens, the cap at
``num_tokens - 1``), which leaves it one token: a full hit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualbudget.reference.events import (
    Abort,
    AddRequest,
    DraftProposals,
    Event,
    ModelOutput,
    ScheduleStep,
)
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.releases import RELEASE_VERSIONS

BLOCK_SIZE = 4
P = tuple(range(100, 109))
A = tuple(range(200, 208))
B = tuple(range(300, 308))
Q = tuple(range(400, 412))
P_FORK = (*P[:8], 990, 991, 992, 993)
"""``P``'s two blocks, then other tokens: in 0.33's eagle lookahead hashes ``P1`` also
covers the token after it, where the two differ."""

Decision = tuple[dict[str, int], dict[str, int], list[str]]
"""(num_scheduled_tokens, scheduled_spec_tokens, preempted) of one step."""


def config(num_gpu_blocks: int, method: str | None = None, k: int = 2) -> EngineConfig:
    spec = SpeculativeConfig(method, k) if method is not None else None
    return EngineConfig(
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=64,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=num_gpu_blocks,
        speculative_config=spec,
        enable_prefix_caching=True,
    )


def add(rid: str, ids: tuple[int, ...], max_tokens: int) -> AddRequest:
    return AddRequest(rid, len(ids), max_tokens, prompt_token_ids=ids)


def sample(**tokens: tuple[int, ...]) -> ModelOutput:
    """A model output sampling the given ids per request (none accepted past the
    first unless given)."""
    return ModelOutput({rid: len(ids) for rid, ids in tokens.items()}, token_ids=dict(tokens))


STEP = ScheduleStep()


@dataclass(frozen=True)
class Case:
    name: str
    config: EngineConfig
    events: tuple[Event, ...]
    decisions: dict[int, Decision]
    """The steps worked by hand."""
    observed: dict[str, int]
    """Every prefix-caching counter at the end (those not named: 0)."""
    free_queue: tuple[int, ...] | None = None
    """The free queue at the end, head first, where the case is about its order."""
    ref_cnt: dict[int, int] = field(default_factory=dict)
    """Reference counts at the end, per block, where the case is about them."""
    releases: tuple[str, ...] = RELEASE_VERSIONS
    """The releases whose vLLM code the case was worked from."""


CASES: tuple[Case, ...] = (
    Case(
        # r0 (A, 8 tokens: two full blocks) finishes; r1 = A may hit at most
        # num_tokens - 1 = 7 tokens, so one block (4): it computes the other 4.
        "the hit is capped at num_tokens - 1",
        config(12),
        (add("r0", A, 1), STEP, sample(r0=(500,)), add("r1", A, 3), STEP),
        {0: ({"r0": 8}, {}, []), 1: ({"r1": 4}, {}, [])},
        {"prefix_hit": 1},
        free_queue=(*range(4, 12), 2),
        ref_cnt={1: 1, 2: 0, 3: 1},
    ),
    Case(
        # r0 computes P (blocks 1, 2 cached, 3 partial); r1 = P while r0 decodes: the
        # hit is P0 P1 (8 = num_tokens - 1: a full hit), held by r0 (no free block
        # taken); r1 needs 1 token, padded to 1 + K beside r0's decode; it takes one
        # new block (4) for 8 + 3 slots, none for the hit.
        "full hit on running blocks, padded",
        config(12, "ngram"),
        (
            add("r0", P, 5),
            STEP,
            sample(r0=(500,)),
            DraftProposals({"r0": 2}),
            add("r1", P, 5),
            STEP,
        ),
        {0: ({"r0": 9}, {}, []), 1: ({"r0": 3, "r1": 3}, {"r0": 2, "r1": 2}, [])},
        {"prefix_hit": 1, "full_prefix_hit": 1, "hit_on_running_block": 2},
        free_queue=tuple(range(5, 12)),
        ref_cnt={1: 2, 2: 2, 3: 1, 4: 1},
    ),
    Case(
        # r0 (P, one token) finishes: its blocks go back last first, the unhashed 3 to
        # the head, the cached 2 and 1 to the tail: 3, 4..11, 2, 1. r1 = P hits 1, 2
        # off the free queue (two free blocks taken), then pops 3 for its third: the
        # free count drops 11 -> 8. Alone, it is still padded: its computed tokens > 0.
        "full hit on free cached blocks",
        config(12, "ngram"),
        (add("r0", P, 1), STEP, sample(r0=(500,)), add("r1", P, 3), STEP),
        {0: ({"r0": 9}, {}, []), 1: ({"r1": 3}, {"r1": 2}, [])},
        {"prefix_hit": 1, "full_prefix_hit": 1},
        free_queue=tuple(range(4, 12)),
        ref_cnt={1: 1, 2: 1, 3: 1},
    ),
    Case(
        # Five blocks. r0 (P) finishes: free queue 3, 4, 5, 2, 1. r2 (Q, 12 tokens)
        # takes 3, 4, 5; its first decode needs a fourth block: 2, P1's, the least
        # recently used tail, is evicted. r4 = P then hits P0 alone (block 1), and
        # waits: its full sequence needs 2 new blocks and block 1, with 1 free.
        "eviction takes the chain's tail first",
        config(6),
        (
            add("r0", P, 1),
            STEP,
            sample(r0=(500,)),
            add("r2", Q, 5),
            STEP,
            sample(r2=(501,)),
            add("r4", P, 5),
            STEP,
        ),
        {0: ({"r0": 9}, {}, []), 1: ({"r2": 12}, {}, []), 2: ({"r2": 1}, {}, [])},
        {"cached_block_evicted": 1},
        free_queue=(1,),
        ref_cnt={1: 0, 2: 1, 3: 1, 4: 1, 5: 1},
    ),
    Case(
        # As the first case, then both sample one token and are aborted. r0's blocks
        # go back 3, 2, 1: only 3 drops to 0 references (unhashed: to the head); 1
        # and 2 stay with r1. Then r1's 4, 2, 1: 4 to the head, 2 and 1 to the tail.
        "free order and reference counts",
        config(12, "ngram"),
        (
            add("r0", P, 5),
            STEP,
            sample(r0=(500,)),
            DraftProposals({"r0": 2}),
            add("r1", P, 5),
            STEP,
            sample(r0=(501,), r1=(502,)),
            Abort("r0"),
            Abort("r1"),
        ),
        {1: ({"r0": 3, "r1": 3}, {"r0": 2, "r1": 2}, [])},
        {"prefix_hit": 1, "full_prefix_hit": 1, "hit_on_running_block": 2},
        free_queue=(4, 3, *range(5, 12), 2, 1),
        ref_cnt={1: 0, 2: 0, 3: 0, 4: 0},
    ),
    Case(
        # Six blocks. r0 (A) and r1 (B) take 1, 2 and 3, 4, then 5 and 6 at 9 tokens.
        # At 13 tokens r0 needs a fourth block: r1 is preempted (its cached 6, 4, 3 go
        # to the tail) and r0 pops 6, evicting B2. r0 finishes at 7 outputs (its
        # unhashed 6 to the head, A2 A1 A0 to the tail). r1 resumes: B0 B1 hit its
        # own blocks 3, 4 (B2 is gone), 8 of its 13 tokens; it takes 6 and 5 (A2
        # evicted) for the other 5.
        "a preempted request re-hits its own blocks",
        config(7, k=0),
        (
            add("r0", A, 7),
            add("r1", B, 10),
            STEP,
            sample(r0=(500,), r1=(600,)),
            STEP,
            sample(r0=(501,), r1=(601,)),
            STEP,
            sample(r0=(502,), r1=(602,)),
            STEP,
            sample(r0=(503,), r1=(603,)),
            STEP,
            sample(r0=(504,), r1=(604,)),
            STEP,
            sample(r0=(505,)),
            STEP,
            sample(r0=(506,)),
            STEP,
        ),
        {
            0: ({"r0": 8, "r1": 8}, {}, []),
            4: ({"r0": 1, "r1": 1}, {}, []),
            5: ({"r0": 1}, {}, ["r1"]),
            6: ({"r0": 1}, {}, []),
            7: ({"r1": 5}, {}, []),
        },
        {"prefix_hit": 1, "resume_rehit": 1, "cached_block_evicted": 2},
        ref_cnt={1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 1},
    ),
    Case(
        # vLLM 0.32 with an eagle drafter drops the last hit block: r1 = P hits P0
        # only (4 tokens) and is scheduled its other 5, unpadded.
        "0.32 eagle drops the last hit block",
        config(12, "eagle3"),
        (add("r0", P, 1), STEP, sample(r0=(500,)), add("r1", P, 3), STEP),
        {0: ({"r0": 9}, {}, []), 1: ({"r1": 5}, {}, [])},
        {"prefix_hit": 1},
        releases=("0.32",),
    ),
    Case(
        # vLLM 0.33's eagle drafters hash one token past each block instead: the same
        # r1 = P hits P0 P1, a full hit, padded as without a drafter.
        "0.33 eagle keeps the full hit",
        config(12, "eagle3"),
        (add("r0", P, 1), STEP, sample(r0=(500,)), add("r1", P, 3), STEP),
        {0: ({"r0": 9}, {}, []), 1: ({"r1": 3}, {"r1": 2}, [])},
        {"prefix_hit": 1, "full_prefix_hit": 1},
        releases=("0.33", "0.34"),
    ),
    Case(
        # ... but its lookahead hash of P1 covers P's ninth token, where P_FORK differs:
        # P_FORK hits P0 alone (4 tokens) and is scheduled its other 8.
        "0.33 eagle lookahead hash covers the next token",
        config(12, "eagle3"),
        (add("r0", P, 1), STEP, sample(r0=(500,)), add("r1", P_FORK, 3), STEP),
        {0: ({"r0": 9}, {}, []), 1: ({"r1": 8}, {}, [])},
        {"prefix_hit": 1},
        releases=("0.33", "0.34"),
    ),
    Case(
        # Without the lookahead (ngram), P_FORK hits P0 P1: 8 of its 12 tokens.
        "a fork hits the shared blocks",
        config(12, "ngram"),
        (add("r0", P, 1), STEP, sample(r0=(500,)), add("r1", P_FORK, 3), STEP),
        {0: ({"r0": 9}, {}, []), 1: ({"r1": 4}, {}, [])},
        {"prefix_hit": 1},
    ),
)
