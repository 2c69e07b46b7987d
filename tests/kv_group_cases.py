"""KV-group cases worked by hand from vLLM's ``KVCacheManager``, its coordinators and
``single_type_kv_cache_manager.py``, as data: a layout of groups, an event stream, the
decisions expected of its steps and the pool's free blocks after each.
``tests/worked/test_kv_groups_reference.py`` runs them through the reference; the same events can
be fed to the live vLLM, whose scheduler is built on the same groups (the numbers hold in
0.32 and 0.33 but where a case names one release).

Blocks of 4 tokens (8 where a Mamba group runs in align mode). A pool of
``num_gpu_blocks`` lends one fewer (block 0 is the null block). Prefix caching is off
but in the hybrid hit cases, whose free queue is followed block by block (head first).
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
from dualbudget.reference.kv.blocks import group_key
from dualbudget.reference.prefix_cache import BlockPool
from dualbudget.reference.state import RequestState
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.methods import layout_named
from dualbudget.spec.releases import RELEASE_VERSIONS

BLOCK_SIZE = 4
STEP = ScheduleStep()
SLIDING_WINDOW = KVGroup("sliding_window", BLOCK_SIZE, sliding_window=4)
FULL = KVGroup("full_attention", BLOCK_SIZE)
MAMBA_ALIGN = KVGroup("mamba", 8, mamba_cache_mode="align")
"""In align mode the Mamba block is ``cache_config.block_size``: these cases use 8."""
FULL_8 = KVGroup("full_attention", 8)

Decision = tuple[dict[str, int], dict[str, int], list[str]]
"""(num_scheduled_tokens, scheduled_spec_tokens, preempted) of one step."""


def config(
    num_gpu_blocks: int,
    *groups: KVGroup,
    method: str | None = None,
    k: int = 2,
    block_size: int = BLOCK_SIZE,
    max_num_batched_tokens: int = 32,
    enable_prefix_caching: bool = False,
    prefix_cache_retention_interval: int | None = None,
    mamba_prefill_checkpoint_blocks: int = 0,
) -> EngineConfig:
    spec = None
    if method is not None:
        spec = SpeculativeConfig.for_layout(layout_named(method), k)
    return EngineConfig(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=4,
        max_model_len=64,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        speculative_config=spec,
        kv_groups=groups,
        enable_prefix_caching=enable_prefix_caching,
        prefix_cache_retention_interval=prefix_cache_retention_interval,
        mamba_prefill_checkpoint_blocks=mamba_prefill_checkpoint_blocks,
    )


def retention_follow_up(retention: int | None) -> Case:
    """Window 8 (a hit needs cdiv(8 - 1, 4) = 2 contiguous blocks) beside full attention,
    caching on, no drafter, 39 blocks lent. Step 0: r0's 16 tokens take 4 blocks a group
    (31); full attention caches all 4. The window group caches all 4 at retention None;
    at 0 only the tail a resend of r0's prompt would hit: replay boundary 16 - 1 = 15,
    block 15 // 4 = 3, so the 2 blocks before it, 1 and 2. Step 1: r0's 16 processed
    tokens skip 9: its window blocks 0 and 1 go back, cached where they were (33); its
    17th token takes a fifth block a group (31). r1 repeats r0's prompt and a token more,
    a hit within 16 tokens: full attention hits 4 blocks. None: the window finds blocks 3
    and 2, a run of 2 ending at 16: 1 token left; 5 blocks a group, 1 new each (29). 0:
    block 3 is uncached, blocks 2 and 1 make the run ending at 12, which cuts full
    attention to 12 tokens (``hybrid_hit_cut``): 5 tokens left; the window group skips
    block 0, touches the freed block 1 and takes 2 new, full attention 2 new (26)."""
    dense = retention is None
    return Case(
        f"retention {retention}: a follow-up hits where the window group kept its blocks",
        config(
            40,
            KVGroup("sliding_window", BLOCK_SIZE, sliding_window=8),
            FULL,
            enable_prefix_caching=True,
            prefix_cache_retention_interval=retention,
        ),
        REPEAT_AND_ONE_MORE,
        {0: ({"r0": 16}, {}, []), 1: ({"r0": 1, "r1": 1 if dense else 5}, {}, [])},
        {0: 31, 1: 29 if dense else 26},
        {"window_blocks_freed": 2, "hybrid_hit_cut": 0 if dense else 1},
    )


def retention_eagle(retention: int | None) -> Case:
    """0.32, EAGLE K=2 (every group drops its last hit block: none is marked), window 8
    beside full attention, caching on, 39 blocks lent. A dropping window group needs
    cdiv(8 - 1, 4) + 1 = 3 contiguous blocks and its run ends one block past the hit.
    Step 0: r0's 32 tokens and 2 lookahead slots take 9 blocks a group (21); full
    attention caches blocks 0-7. The window group caches 0-7 at None; at 0 the tails of
    the replay boundaries of a 32-token prompt, 28 - 4 = 24 and 32 - 4 = 28, ending one
    block past them at blocks 7 and 8: blocks 4-7. r0 is aborted after its first output
    (39). r1 shares r0's first 24 tokens. Full attention, one block more to drop, finds
    6 blocks and drops one: 20 tokens. The window group within 24 tokens: None, blocks 5,
    4, 3 make a run of 3, the last dropped: 20 tokens, r1's other 12 are scheduled, each
    group 9 blocks: the window group's first 3 skipped, its hit's 2 and full attention's 5
    taken off the free queue, 4 new each (24). 0: block 3 is uncached, blocks 5 and 4 are
    no run of 3 and none starts at block 0: no hit (full attention's 20 tokens cut to 0,
    ``hybrid_hit_cut``), all 32 tokens, 9 new blocks a group (21)."""
    dense = retention is None
    return Case(
        f"retention {retention}: EAGLE's dropping window group keeps the tails one block on",
        config(
            40,
            KVGroup("sliding_window", BLOCK_SIZE, sliding_window=8),
            FULL,
            method="eagle",
            enable_prefix_caching=True,
            prefix_cache_retention_interval=retention,
        ),
        (
            add("r0", tuple(range(32)), 4),
            STEP,
            sample_ids(r0=(100,)),
            Abort("r0"),
            add("r1", (*range(24), *range(60, 68)), 4),
            STEP,
        ),
        {0: ({"r0": 32}, {}, []), 1: ({"r1": 12 if dense else 32}, {}, [])},
        {0: 21, 1: 24 if dense else 21},
        {"hybrid_hit_cut": 0 if dense else 1},
        releases=("0.32",),
    )


def sample(**num_sampled: int) -> ModelOutput:
    return ModelOutput(dict(num_sampled))


def sample_ids(**token_ids: tuple[int, ...]) -> ModelOutput:
    """An output with prefix caching on: each request's sampled token ids."""
    return ModelOutput({rid: len(ids) for rid, ids in token_ids.items()}, token_ids=token_ids)


def add(request_id: str, prompt: tuple[int, ...], max_tokens: int) -> AddRequest:
    return AddRequest(request_id, len(prompt), max_tokens, prompt_token_ids=prompt)


@dataclass(frozen=True)
class Case:
    name: str
    config: EngineConfig
    events: tuple[Event, ...]
    decisions: dict[int, Decision]
    """Every step, worked by hand."""
    free_blocks: dict[int, int]
    """The pool's free blocks after each step's schedule (``get_num_free_blocks``)."""
    observed: dict[str, int] = field(default_factory=dict)
    """The coordinator's counters at the end (those not named: 0)."""
    releases: tuple[str, ...] = RELEASE_VERSIONS


REPEAT_AND_ONE_MORE = (
    add("r0", tuple(range(16)), 4),
    STEP,
    sample_ids(r0=(100,)),
    add("r1", (*range(16), 50), 4),
    STEP,
)
"""r0's 16-token prompt, one step and its first output, then r1: r0's prompt and one
token more, a hit of at most 16 tokens."""

WINDOW_BESIDE_DRAFTER_GROUP = config(
    40,
    KVGroup("sliding_window", BLOCK_SIZE, sliding_window=8),
    KVGroup("full_attention", BLOCK_SIZE, is_eagle_group=True),
    method="ngram",
    enable_prefix_caching=True,
)
"""Window 8 beside full attention marked as the drafter's group, n-gram drafts (no block
drop of their own), caching on, 39 blocks lent: where 0.32 and 0.33 drop differently."""


def mamba_state_hit(release: str, decisions: dict[int, Decision], free: dict[int, int]) -> Case:
    """Mamba in align mode beside full attention with prefix caching, blocks of 8, no
    drafter, 15 blocks lent. r0 (20 tokens) and r1 (r0's prompt and one token more)
    arrive together. Step 0: r0's chunk ends at its last reusable state, 16 (a split):
    full attention takes blocks 2 and 3, Mamba one block a step: a null place, then
    block 1 (12); both groups key their full blocks, Mamba its state at 16 (block 1),
    cached this step. r1's hit is 16 tokens in each group (Mamba: the null place and
    block 1), but its Mamba state was cached this very step: r1 waits, its allocation
    asking more than the pool. Step 1 on: r0's last 4 prompt tokens take a Mamba state
    block and a full block (10); what r1 does is the release's."""
    return Case(
        f"a Mamba state hit waits for the step that cached it ({release})",
        config(16, MAMBA_ALIGN, FULL_8, block_size=8, enable_prefix_caching=True),
        (
            add("r0", tuple(range(20)), 4),
            add("r1", (*range(20), 50), 4),
            STEP,
            sample(),
            STEP,
            sample_ids(r0=(100,)),
            STEP,
        )[: 5 if 2 not in decisions else 7],
        {0: ({"r0": 16}, {}, []), **decisions},
        {0: 12, **free},
        {"mamba_aligned_split": 1},
        releases=(release,),
    )


def mamba_checkpoint_in_chunk(caching: bool) -> Case:
    """Mamba in align mode with a prefill checkpoint block beside full attention, blocks
    of 8, a 12-token budget, 15 blocks lent. Step 0: r0's first 12 of 20 tokens end off a
    block and short of the prefill: the chunk is aligned back to 8; a Mamba state block
    and a full block (13). Step 1: the last 12 tokens end the prefill, start on a block
    and cross the last reusable state, 16, a block in: the Mamba layers save it inside
    the chunk, so the chunk is not cut there. Mamba reserves the checkpoint's place (1)
    beside the running state's (2): 2 blocks, full attention 2 (9); with ``caching`` the
    checkpoint block is keyed at 16. Step 2: 20 processed tokens retire Mamba's places 1
    and 0 (11); the 21st token fits. Prefix caching on or off, vLLM's scheduler reserves
    and splits alike."""
    return Case(
        "a Mamba prefill checkpoint saves the state inside the chunk"
        + ("" if caching else " without prefix caching"),
        config(
            16,
            MAMBA_ALIGN,
            FULL_8,
            block_size=8,
            max_num_batched_tokens=12,
            enable_prefix_caching=caching,
            mamba_prefill_checkpoint_blocks=1,
        ),
        (add("r0", tuple(range(20)), 4), STEP, sample(), STEP, sample_ids(r0=(100,)), STEP),
        {0: ({"r0": 8}, {}, []), 1: ({"r0": 12}, {}, []), 2: ({"r0": 1}, {}, [])},
        {0: 13, 1: 9, 2: 11},
        {"mamba_aligned_split": 1},
    )


def mamba_checkpoint_retention(retention: int | None, free: int) -> Case:
    """Mamba in align mode with a prefill checkpoint block beside full attention, caching
    off, blocks of 8, a 16-token budget, 15 blocks lent. Step 0: r0's first 16 of 24
    tokens, on a block boundary. The chunk does not end the prefill; at retention None
    (dense: every chunk may checkpoint) Mamba still reserves one at 8, in place 0 beside
    the running state's (2 blocks; full attention 2: 11 free); at 0 only the chunk that
    reaches the prefill's end does, so Mamba takes one block, a null place before it
    (12)."""
    return Case(
        f"a Mamba prefill checkpoint off the prefill's end (retention {retention})",
        config(
            16,
            MAMBA_ALIGN,
            FULL_8,
            block_size=8,
            max_num_batched_tokens=16,
            prefix_cache_retention_interval=retention,
            mamba_prefill_checkpoint_blocks=1,
        ),
        (AddRequest("r0", 24, 4), STEP),
        {0: ({"r0": 16}, {}, [])},
        {0: free},
    )


def mamba_checkpoint_on_a_null_place(release: str) -> Case:
    """Mamba in align mode with a prefill checkpoint block beside full attention, blocks
    of 2, EAGLE K=3, caching on at retention None (any chunk may checkpoint), 23 blocks
    lent. Step 0: r0's 3 tokens. Step 1: its token and 3 drafts (4 rows, 3..7), every
    draft rejected: 4 computed of 5 tokens, and the Mamba group retires the state places
    below its running one, place 2 among them (null). Step 2: the token and 3 drafts again,
    4..8, a padded decode crossing 6 a block in: the manager reserves a checkpoint at 6,
    in place 2, which is null; vLLM's ``cache_partial_block`` keys nothing on a null
    place and returns before it asks for the hash at 6 tokens, which r0 lacks (it has 2),
    so the step runs. Step 3 the same. 0.32 starts the Mamba table on the null block, one
    block fewer than 0.33 at step 0; both hold 12 free from step 2."""
    return Case(
        f"a padded decode's checkpoint on a null Mamba place keys nothing ({release})",
        config(
            24,
            KVGroup("mamba", 2, mamba_cache_mode="align"),
            KVGroup("full_attention", 2),
            method="eagle",
            k=3,
            block_size=2,
            enable_prefix_caching=True,
            mamba_prefill_checkpoint_blocks=1,
        ),
        (
            add("r0", (0, 1, 2), 8),
            STEP,
            *(
                event
                for token in (100, 101, 102)
                for event in (sample_ids(r0=(token,)), DraftProposals({"r0": 3}), STEP)
            ),
        ),
        {
            0: ({"r0": 3}, {}, []),
            **{step: ({"r0": 4}, {"r0": 3}, []) for step in (1, 2, 3)},
        },
        {0: 16 if release == "0.32" else 15, 1: 13, 2: 12, 3: 12},
        releases=(release,),
    )


TWO_BLOCK_SIZES = config(40, FULL, FULL_8, enable_prefix_caching=True)
"""Full attention in blocks of 4 beside full attention in blocks of 8 (a drafter's layers
whose block vLLM doubled to match the pages), caching on, no drafter, 39 blocks lent:
hashes of 4 tokens (the GCD), hits on 8 (the LCM)."""

PROMPT_TAIL = config(
    10,
    FULL,
    KVGroup("full_attention", 8, is_eagle_group=True),
    method="ngram",
    enable_prefix_caching=True,
)
PROMPT_TAIL_EVENTS = (add("r0", tuple(range(21)), 4), STEP, Abort("r0"))
"""Blocks of 4 beside blocks of 8 marked as the drafter's, n-gram drafts, caching on, 9
blocks lent: r0's 21 tokens take them all (6 of 4, 3 of 8). Under 0.32 the group of 8
drops its hit's last block, so a replay can match the whole prompt: its tail boundary is
min(21 // 4, 5) * 4 = 20, inside its third block, and its cacheable tokens (the drop's
min(21, 16 + 8) = 21) reach it: that block is keyed by the tail's hash, so when r0 is
aborted it goes to the free queue's tail. Under 0.33 it does not drop: the boundary is 20
again but its cacheable tokens are 16, so the block stays unkeyed and goes to the head."""
PROMPT_TAIL_KEYED = {"0.32": True, "0.33": False, "0.34": False}

TWO_LOOKUPS_PLACES = 10
"""The prompt of the hand-worked lookups of two groups: 10 block hashes, one token more."""


def two_lookups_cached() -> list[tuple[int, int, int]]:
    """(group, place, block) of the hand-worked lookups of two groups: group 0 holds the
    prompt's first 3 places cached, group 1 (the drafter's) its first 5, in blocks 1 on."""
    places = [(group, place) for group, cached in ((0, 3), (1, 5)) for place in range(cached)]
    return [(group, place, block) for block, (group, place) in enumerate(places, start=1)]


def cache_two_lookups(pool: BlockPool, block_size: int) -> RequestState:
    """The hand-worked lookups' request, its prompt's blocks cached in the reference's
    ``pool`` as ``two_lookups_cached`` places them (hash ``h<place>`` of each place)."""
    request = RequestState("r", TWO_LOOKUPS_PLACES * block_size + 1, 4)
    request.block_hashes = [f"h{place}" for place in range(TWO_LOOKUPS_PLACES)]
    for group, place, block in two_lookups_cached():
        pool.cache(block, group_key(request.block_hashes[place], group))
    return request


CASES: tuple[Case, ...] = (
    Case(
        # Step 0: r0's 20 tokens take cdiv(20, 4) = 5 blocks of 4 and cdiv(20, 8) = 3 of
        # 8 (31); the tokens cacheable are cut back to 16, the LCM's multiple: 4 blocks of
        # 4 and 2 of 8 keyed. Step 1: r0's 21st token takes a sixth block of 4 (30). r1
        # (13 tokens) hits at most 12: the blocks of 4 run 3 blocks (12), cut back to 8;
        # the blocks of 8 then 1 block (8): no group's hit is longer than the other's, so
        # no hit cut. r1's 5 tokens left, 4 blocks of 4 and 2 of 8, its hit's 2 and 1 held
        # by r0: 3 new (27).
        "a hit on groups of two block sizes lands on their LCM",
        TWO_BLOCK_SIZES,
        (
            add("r0", tuple(range(20)), 4),
            STEP,
            sample_ids(r0=(100,)),
            add("r1", tuple(range(13)), 4),
            STEP,
        ),
        {0: ({"r0": 20}, {}, []), 1: ({"r0": 1, "r1": 5}, {}, [])},
        {0: 31, 1: 27},
        {"hit_across_block_sizes": 1},
    ),
    Case(
        # Window 4. Step 0: r0's 8 tokens take 2 blocks in each group (15 -> 11).
        # Step 1: 8 tokens processed, the next token attends to tokens 5..8, so
        # 8 - 4 + 1 = 5 are skipped: block 0 of the window group goes back (12); token 9
        # needs a third block in each group (10). Step 2: 9 processed, 6 skipped, still
        # one block; 10 tokens fit in 3 blocks: nothing moves.
        "a sliding-window group frees the blocks out of its window",
        config(16, SLIDING_WINDOW, FULL),
        (AddRequest("r0", 8, 6), STEP, sample(r0=1), STEP, sample(r0=1), STEP),
        {0: ({"r0": 8}, {}, []), 1: ({"r0": 1}, {}, []), 2: ({"r0": 1}, {}, [])},
        {0: 11, 1: 10, 2: 10},
        {"window_blocks_freed": 1},
    ),
    Case(
        # Window 8 (nothing freed yet), 5 blocks lent. Step 0: r0 and r1 (4 tokens)
        # pass the full-sequence gate (1 + 1 blocks each) and take them (5 -> 1).
        # Step 1: r0's fifth token needs a second block in both groups, 2 > 1: the
        # last running request, r1, is preempted and gives back its block of each
        # group (3); r0 takes its 2 (1); no admission in a step that preempted.
        "a preemption frees the blocks of two groups",
        config(6, KVGroup("sliding_window", BLOCK_SIZE, sliding_window=8), FULL),
        (AddRequest("r0", 4, 4), AddRequest("r1", 4, 4), STEP, sample(r0=1, r1=1), STEP),
        {0: ({"r0": 4, "r1": 4}, {}, []), 1: ({"r0": 1}, {}, ["r1"])},
        {0: 1, 1: 1},
        {"hybrid_preempt": 1},
    ),
    Case(
        # Chunks of 4. Step 0: r0's 10 tokens take 3 blocks per group (15 -> 9); the
        # chunked group's admission cap cdiv(min(4 + 32, 64), 4) = 9 does not bite.
        # Step 1: 10 processed, the next token is in chunk 8..11, so tokens 0..7 (two
        # blocks) are skipped and freed (11); token 11 fits the third block.
        "a chunked-local group frees the chunks before the current one",
        config(16, KVGroup("chunked_local_attention", BLOCK_SIZE, attention_chunk_size=4), FULL),
        (AddRequest("r0", 10, 4), STEP, sample(r0=1), STEP),
        {0: ({"r0": 10}, {}, []), 1: ({"r0": 1}, {}, [])},
        {0: 9, 1: 11},
        {"window_blocks_freed": 2},
    ),
    Case(
        # A Mamba group of 64-token blocks with K = 2 speculative blocks beside full
        # attention, n-gram drafts. Step 0: 8 tokens: 2 full blocks, and
        # cdiv(8 + 2 * 64, 64) = 3 Mamba blocks (15 -> 10). Step 1: 1 + 2 drafts, 11
        # slots: a third full block, still 3 Mamba blocks (9); 7 skipped tokens free
        # no 64-token block.
        "a Mamba group holds its speculative blocks",
        config(16, KVGroup("mamba", 64), FULL, method="ngram"),
        (AddRequest("r0", 8, 8), STEP, sample(r0=1), DraftProposals({"r0": 2}), STEP),
        {0: ({"r0": 8}, {}, []), 1: ({"r0": 3}, {"r0": 2}, [])},
        {0: 10, 1: 9},
    ),
    Case(
        # Mamba in align mode beside full attention, blocks of 8. Step 0: r0's 20-token
        # prompt is granted 20, but the last state a resend could reuse is at
        # (20 - 1) // 8 * 8 = 16, so the chunk ends there (16). Full attention takes 2
        # blocks; Mamba at most 1 a step: its table is a null block, then the state's
        # (15 -> 12). Step 1: the last 4 tokens (ending the prefill: no alignment); a
        # third full block, and Mamba's next state block (10). Step 2: 20 processed,
        # Mamba retires its block 1 (the state of two steps ago) (11); 21 tokens fit.
        "a Mamba align split ends the chunk at the last reusable state",
        config(16, MAMBA_ALIGN, FULL_8, block_size=8),
        (AddRequest("r0", 20, 4), STEP, sample(), STEP, sample(r0=1), STEP),
        {0: ({"r0": 16}, {}, []), 1: ({"r0": 4}, {}, []), 2: ({"r0": 1}, {}, [])},
        {0: 12, 1: 10, 2: 11},
        {"mamba_aligned_split": 1},
    ),
    mamba_checkpoint_in_chunk(caching=False),
    mamba_checkpoint_retention(None, 11),
    mamba_checkpoint_retention(0, 12),
    Case(
        # As above with DFlash (K = 2: two speculative Mamba blocks). 0.32's
        # use_eagle_block_drop holds for DFlash: the drafter's last block is dropped,
        # so the last reusable state is 20 // 8 * 8 - 8 = 8 and the chunk ends there.
        # Full attention takes cdiv(8 + 3 lookahead, 8) = 2 blocks, Mamba 1 + 2 (15 ->
        # 10).
        "the drafter's block drop moves the Mamba split (0.32)",
        config(16, MAMBA_ALIGN, FULL_8, block_size=8, method="dflash"),
        (AddRequest("r0", 20, 4), STEP),
        {0: ({"r0": 8}, {}, [])},
        {0: 10},
        {"mamba_aligned_split": 1},
        releases=("0.32",),
    ),
    Case(
        # 0.33 drops no block for DFlash (its KV does not read the next token): the
        # chunk ends at 16; full attention cdiv(16 + 3, 8) = 3 blocks, Mamba
        # cdiv(16, 8) + 2 = 4 places, at most 1 + 2 blocks: a null block first (15 -> 9).
        "the drafter's block drop moves the Mamba split (0.33)",
        config(16, MAMBA_ALIGN, FULL_8, block_size=8, method="dflash"),
        (AddRequest("r0", 20, 4), STEP),
        {0: ({"r0": 16}, {}, [])},
        {0: 9},
        {"mamba_aligned_split": 1},
        releases=("0.33", "0.34"),
    ),
    Case(
        # One MLA group is full attention: r0 (8 tokens) takes 2 blocks (15 -> 13),
        # its ninth token a third (12), exactly as with kv_groups left out.
        "an MLA group is scheduled as full attention",
        config(16, KVGroup("mla_attention", BLOCK_SIZE)),
        (AddRequest("r0", 8, 4), STEP, sample(r0=1), STEP),
        {0: ({"r0": 8}, {}, []), 1: ({"r0": 1}, {}, [])},
        {0: 13, 1: 12},
    ),
    Case(
        # Window 8 (a hit needs cdiv(8 - 1, 4) = 2 contiguous blocks), prefix caching
        # on, B = 8, 13 blocks lent: free queue [1..13]; the window group allocates
        # first. Step 0: r0's first 8 of 16 tokens: window [1, 2], full [3, 4] (9),
        # hashes h0, h1 cached in both groups. Step 1: 8 processed skip 1 token, no
        # block; the next 8: window [1, 2, 5, 6], full [3, 4, 7, 8] (5), h2, h3 cached.
        # Step 2: 16 processed skip 9 tokens: window blocks 2 then 1 go to the queue's
        # tail, cached ([9..13, 2, 1]); token 17 takes 9 and 10 ([11, 12, 13, 2, 1]: 5).
        # Step 3: r2 (8 new tokens) is granted the 7 left: 2 blocks a group, 11, 12 and
        # 2 (its hash h1 of the window group evicted), 13 ([1]: 1); r2 is aborted: its
        # uncached blocks 12 and 2 go to the head, its cached 11 and 13 to the tail
        # ([2, 12, 1, 11, 13]). Step 4: r1 shares r0's first 8 tokens: full attention
        # hits h0, h1 (8 tokens), the window finds h1 gone and only h0 (block 1), a run
        # shorter than 2 counted from the first block: the hit is cut to 4 tokens. The
        # window touches block 1, full attention block 3 (held by r0); 5 tokens, 3
        # blocks a group: 2 new each (2, 12 and 11, 13: r2's hashes evicted) (0).
        "a sliding window cuts full attention's prefix hit",
        config(
            14,
            KVGroup("sliding_window", BLOCK_SIZE, sliding_window=8),
            FULL,
            max_num_batched_tokens=8,
            enable_prefix_caching=True,
        ),
        (
            add("r0", tuple(range(16)), 8),
            STEP,
            sample(),
            STEP,
            sample_ids(r0=(100,)),
            STEP,
            sample_ids(r0=(101,)),
            add("r2", tuple(range(200, 208)), 4),
            STEP,
            sample_ids(r0=(102,)),
            Abort("r2"),
            add("r1", (*range(8), 50), 4),
            STEP,
        ),
        {
            0: ({"r0": 8}, {}, []),
            1: ({"r0": 8}, {}, []),
            2: ({"r0": 1}, {}, []),
            3: ({"r0": 1, "r2": 7}, {}, []),
            4: ({"r0": 1, "r1": 5}, {}, []),
        },
        {0: 9, 1: 5, 2: 5, 3: 1, 4: 0},
        {"window_blocks_freed": 2, "hybrid_hit_cut": 1},
    ),
    Case(
        # Window 8 beside full attention marked as the drafter's group, n-gram drafts
        # (no block drop of their own), caching on, 39 blocks lent. Step 0: r0's 16
        # tokens, 4 blocks a group, all cached (31). Step 1: 16 processed skip 9 tokens:
        # the window's blocks 0 and 1 go back, cached (33); r0's 17th token takes a
        # fifth block a group (31). r1 repeats r0's prompt and one token more: 0.32's
        # coordinator drops the last hit block of every group marked is_eagle_group,
        # whatever the drafter: full attention hits 4 blocks and drops one (12 tokens);
        # the window finds 2 contiguous blocks ending there (the freed block 1, touched,
        # and block 2): 5 tokens left, 5 blocks a group: 2 new each (31 - 1 - 4 = 26).
        "0.32 drops the last hit block of a group marked as the drafter's",
        WINDOW_BESIDE_DRAFTER_GROUP,
        REPEAT_AND_ONE_MORE,
        {0: ({"r0": 16}, {}, []), 1: ({"r0": 1, "r1": 5}, {}, [])},
        {0: 31, 1: 26},
        {"window_blocks_freed": 2},
        releases=("0.32",),
    ),
    Case(
        # As above under 0.33: no group drops without the drafter's use_eagle. The hit
        # is all 16 tokens (the window's blocks 2 and 3, held by r0): one token left,
        # padded to 1 + K = 3 beside r0's decode; 19 slots, 5 blocks a group, one new
        # each (29).
        "0.33 drops no hit block for n-gram drafts on a group marked as the drafter's",
        WINDOW_BESIDE_DRAFTER_GROUP,
        REPEAT_AND_ONE_MORE,
        {0: ({"r0": 16}, {}, []), 1: ({"r0": 1, "r1": 3}, {"r1": 2}, [])},
        {0: 31, 1: 29},
        {"window_blocks_freed": 2},
        releases=("0.33", "0.34"),
    ),
    Case(
        # Llama 4: chunks of 8 beside full attention, caching on, no drafter, 39 blocks
        # lent. Step 0: r0's 16 tokens take 4 blocks a group (31), all cached (chunked
        # local caches densely). Step 1: 16 processed skip 16 // 8 * 8 = 16 tokens: the
        # chunked group's 4 blocks go back, cached (35); r0's 17th token takes a fifth
        # block a group (33). r1 shares r0's first 12 tokens: full attention hits 3
        # blocks (12 tokens); the chunked group within 12 tokens counts chunk 0 (blocks
        # 0 and 1) as computed and null, then finds its freed block 2 cached: 12 tokens,
        # 5 left. Its table: 2 skipped, the touched block 2 (off the free queue) and 2
        # new; full attention 2 new beside its 3 held by r0 (33 - 1 - 4 = 28).
        "a chunked-local hit counts the chunks before the hit's as computed",
        config(
            40,
            KVGroup("chunked_local_attention", BLOCK_SIZE, attention_chunk_size=8),
            FULL,
            enable_prefix_caching=True,
        ),
        (
            add("r0", tuple(range(16)), 4),
            STEP,
            sample_ids(r0=(100,)),
            add("r1", (*range(12), *range(60, 65)), 4),
            STEP,
        ),
        {0: ({"r0": 16}, {}, []), 1: ({"r0": 1, "r1": 5}, {}, [])},
        {0: 31, 1: 28},
        {"window_blocks_freed": 4},
    ),
    retention_follow_up(None),
    retention_follow_up(0),
    retention_eagle(None),
    retention_eagle(0),
    mamba_checkpoint_in_chunk(caching=True),
    mamba_checkpoint_on_a_null_place("0.32"),
    mamba_checkpoint_on_a_null_place("0.33"),
    mamba_checkpoint_on_a_null_place("0.34"),
    *(
        mamba_state_hit(
            # 0.33 on: r0's step-1 chunk ends past the state, already keyed: r1's hit no
            # longer waits. r1 (21 tokens, 5 left after the hit) touches block 1, held by
            # r0 (no evictable block), and takes a new state block and a full block
            # (10 -> 8).
            release,
            {1: ({"r0": 4, "r1": 5}, {}, [])},
            {1: 8},
        )
        for release in ("0.33", "0.34")
    ),
    mamba_state_hit(
        # 0.32 marks the keyed state cached again in step 1 (r0's cacheable tokens still
        # end at 16, its prompt's last reusable state): r1 waits once more (10). Step 2:
        # r0's 20 processed tokens retire its block 1 to the free queue's tail, cached
        # (11); its 21st token fits. r1's hit touches block 1 off the free queue (10),
        # then a new state block and a full block (8).
        "0.32",
        {1: ({"r0": 4}, {}, []), 2: ({"r0": 1, "r1": 5}, {}, [])},
        {1: 10, 2: 8},
    ),
)


MAMBA_CHECKPOINT_PAST_THE_PROMPT = (
    config(
        32,
        KVGroup("mamba", BLOCK_SIZE, mamba_cache_mode="align"),
        FULL,
        method="ngram",
        k=4,
        enable_prefix_caching=True,
        mamba_prefill_checkpoint_blocks=1,
    ),
    (
        add("r0", tuple(range(13)), 8),
        STEP,
        sample_ids(r0=(100,)),
        add("r1", tuple(range(13)), 8),
        STEP,
    ),
)
"""A state vLLM asserts in (0.32 and 0.33): Mamba in align mode with a prefill checkpoint
block, blocks of 4, n-gram K = 4, caching on at retention None. Step 0: r0's 13 tokens in
one chunk, its state at 12 saved inside it and keyed. Step 1: r1, r0's prompt again, hits
12 tokens; its one token left is padded to 1 + K = 5 rows (r0 decodes), so its chunk
12..17 crosses 16 a block in: the manager reserves a checkpoint at 16, past r1's 13
tokens, and caching it asks for a block hash r1 does not have (``BlockPool``'s assertion
in ``_get_partial_block_hash``)."""
