"""The predicates of the scheduler's books (``contract.BOOKS``), over one request's books
around one step (C7-C11), one engine call between steps (C12) or the block pool after one
step (C13) as any vLLM keeps them.

The budget items C1-C6 are stated over ``arith`` so that the proofs can run them on z3
terms; these are about how an implementation keeps its books, not about a policy's
arithmetic, so they are plain predicates over ints that the monitor evaluates on every
live step (``integration.books`` reads vLLM into ``RequestBooks``). Each returns True when
its item holds for the request; each docstring opens with its item's id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestBooks:
    """One unfinished request's books just before and just after one ``schedule()``."""

    scheduled: int
    """Tokens scheduled for it in the step (``num_scheduled_tokens``; 0: not scheduled)."""
    drafts: int
    """Draft tokens scheduled with it (``scheduled_spec_decode_tokens``)."""
    tokens: int
    """Its known tokens (``num_tokens``: prompt and accepted output), which a step does
    not change."""
    placeholders_before: int
    placeholders_after: int
    """``num_output_placeholders``: tokens of its output still in flight (async)."""
    stale_after: int
    """``num_stale_output_tokens`` after the step (0 where the release has none)."""
    computed_after: int
    """``num_computed_tokens`` after the step (the scheduler advances it by ``scheduled``)."""
    slots_after: tuple[int, ...] | None
    """Per KV group, the token slots its block table holds after the step (blocks times
    the group's block size); None where a group's blocks do not bound its slots (Mamba's
    state blocks)."""
    preempted: bool
    """Preempted in the step."""
    waiting_after: bool
    """In the waiting queue after the step."""
    drafts_after: int
    """``len(spec_token_ids)`` after the step."""
    blocks_after: int
    """Blocks in its tables after the step, summed over the KV groups."""


def placeholders_kept(books: RequestBooks, *, async_scheduling: bool, sampled: int) -> bool:
    """C7 placeholders: never negative; gained, under async scheduling, by exactly the
    token sampled plus the drafts scheduled when the step reaches the end of the request's
    known tokens; otherwise kept (none once preempted); none at all without async
    scheduling. ``sampled``: tokens a decode step samples per request (vLLM's
    ``num_sampled_tokens_per_step``, 1 for a model that samples one token)."""
    if min(books.placeholders_before, books.placeholders_after, books.stale_after) < 0:
        return False
    if not async_scheduling:
        return books.placeholders_after == 0
    if books.preempted:
        return books.placeholders_after == 0
    reaches_end = books.computed_after >= books.tokens + books.placeholders_before
    gained = sampled + books.drafts if books.scheduled and reaches_end else 0
    return books.placeholders_after == books.placeholders_before + gained


def drafts_within_rows(books: RequestBooks, *, num_speculative_tokens: int) -> bool:
    """C8 drafts within rows: at most ``num_speculative_tokens`` drafts, and fewer than
    the tokens scheduled (a request scheduled nothing verifies none)."""
    if books.drafts == 0:
        return True
    return books.drafts <= num_speculative_tokens and books.drafts < books.scheduled


def slots_ahead(books: RequestBooks, *, num_lookahead_tokens: int, max_model_len: int) -> bool:
    """C9 slots ahead: a scheduled request's tables hold, in every group, slots for its
    computed tokens after the step, plus the drafting lookahead where the step reaches the
    end of its known tokens (it samples, and the drafter drafts past them), capped at
    ``max_model_len``; not judged where the slots are not bounded by its blocks."""
    if not books.scheduled or books.slots_after is None:
        return True
    samples = books.computed_after >= books.tokens + books.placeholders_before
    lookahead = num_lookahead_tokens if samples else 0
    needed = min(books.computed_after + lookahead, max_model_len)
    return all(slots >= needed for slots in books.slots_after)


def within_length(books: RequestBooks, *, max_model_len: int, sampled: int) -> bool:
    """C10 length cap: no scheduled position at or past ``max_model_len``; with drafts
    scheduled, room within it for the ``sampled`` tokens too."""
    if not books.scheduled:
        return True
    if books.computed_after > max_model_len:
        return False
    return books.drafts == 0 or books.computed_after + sampled <= max_model_len


def preemption_released(books: RequestBooks) -> bool:
    """C11 preemption: a request preempted in the step was not scheduled in it, holds no
    blocks, no computed tokens, no drafts and no placeholders, and waits."""
    if not books.preempted:
        return True
    return (
        books.scheduled == 0
        and books.blocks_after == 0
        and books.computed_after == 0
        and books.drafts_after == 0
        and books.placeholders_after == 0
        and books.waiting_after
    )


@dataclass(frozen=True)
class CallBooks:
    """One unfinished request's books just before and just after one engine call between
    steps (``reset_prefix_cache``, ``set_pause_state``)."""

    running_before: bool
    tokens_before: int
    tokens_after: int
    """``num_tokens``: its prompt and accepted output."""
    in_flight_before: int
    """``num_in_flight_tokens`` before the call: tokens of steps whose output is to come."""
    waiting_after: bool
    computed_after: int
    blocks_after: int
    drafts_after: int
    placeholders_after: int
    stale_after: int
    drops_stale_after: bool
    """``drop_stale_output`` after the call: its stale output will be dropped."""
    unchanged: bool
    """Whether every field above but the tokens reads after the call as before it."""


def engine_call_kept(books: CallBooks, *, resets_running: bool) -> bool:
    """C12 engine calls: no accepted token lost; with ``resets_running`` (a prefix-cache
    reset of the running requests) a request running before waits after it with nothing
    computed, held or drafted, its output in flight stale and to be dropped; any other
    request is left as it was."""
    if books.tokens_after != books.tokens_before:
        return False
    if not (resets_running and books.running_before):
        return books.unchanged
    return (
        books.waiting_after
        and books.computed_after == 0
        and books.blocks_after == 0
        and books.drafts_after == 0
        and books.placeholders_after == 0
        and books.stale_after == books.in_flight_before
        and (books.drops_stale_after or books.in_flight_before == 0)
    )


@dataclass(frozen=True)
class PoolBooks:
    """The block pool's books just after one ``schedule()``: every block a table holds."""

    holders: Mapping[int, int]
    """Per block id some table holds (the null block aside), the tables that hold it, over
    every request's table in every KV group."""
    ref_counts: Mapping[int, int]
    """Each held block's reference count (vLLM's ``ref_cnt``)."""
    hashed: frozenset[int]
    """The held blocks that have a hash: cached, so requests of one prefix may share them."""


def block_held(pool: PoolBooks, block: int) -> bool:
    """C13 blocks held: ``block``, which some table holds, counts every table holding it
    in its reference count (a count of 0 is a free block, which the next allocation may
    hand to another request), and is a cached block (it has a hash) where two tables
    hold it."""
    holders = pool.holders[block]
    return pool.ref_counts[block] >= holders and (holders == 1 or block in pool.hashed)
