"""The reference's own steps judged by the scheduler's books (C7-C11 and C13 of
``spec.contract.BOOKS``, the predicates of ``spec.books``).

The monitor judges vLLM's books; a lockstep that agrees with vLLM step for step agrees on
a step that breaks one too, where the reference mirrors vLLM's behaviour faithfully. So
the reference judges its own: a break is a ``StepViolation`` of the item, which a run
either names as a known finding of the release (``proofs/manifest.toml``) or fails on, as
for C1-C3; a later release that fixes the behaviour shows the finding gone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dualbudget.spec.books import (
    PoolBooks,
    RequestBooks,
    drafts_within_rows,
    placeholders_kept,
    preemption_released,
    slots_ahead,
    within_length,
)

from .kv.counting import KVCacheManager
from .state import PREEMPTED, WAITING, SchedulerState

Judge = Callable[[RequestBooks], bool]


def judges(
    *,
    async_scheduling: bool,
    num_speculative_tokens: int,
    num_lookahead_tokens: int,
    max_model_len: int,
) -> tuple[tuple[str, Judge], ...]:
    """Each book item judged per step, with the config's values bound (the reference
    samples one token per decode step, as every modelled drafter does)."""
    return (
        ("C7", lambda b: placeholders_kept(b, async_scheduling=async_scheduling, sampled=1)),
        ("C8", lambda b: drafts_within_rows(b, num_speculative_tokens=num_speculative_tokens)),
        (
            "C9",
            lambda b: slots_ahead(
                b, num_lookahead_tokens=num_lookahead_tokens, max_model_len=max_model_len
            ),
        ),
        ("C10", lambda b: within_length(b, max_model_len=max_model_len, sampled=1)),
        ("C11", preemption_released),
    )


def step_books(
    state: SchedulerState,
    kv: KVCacheManager,
    placeholders_before: Mapping[str, int],
    scheduled: Mapping[str, int],
    spec: Mapping[str, int],
    preempted: list[str],
) -> dict[str, RequestBooks]:
    """Every request unfinished before the step (the keys of ``placeholders_before``), its
    books just after it."""
    books = {}
    gone = set(preempted)
    for rid, placeholders in placeholders_before.items():
        request = state.requests[rid]
        if request.finished:
            continue
        books[rid] = RequestBooks(
            scheduled=scheduled.get(rid, 0),
            drafts=spec.get(rid, 0),
            tokens=request.num_tokens,
            placeholders_before=placeholders,
            placeholders_after=request.num_output_placeholders,
            stale_after=request.num_stale_output_tokens,
            computed_after=request.num_computed_tokens,
            slots_after=kv.slots(request),
            preempted=rid in gone,
            waiting_after=request.status in (WAITING, PREEMPTED),
            drafts_after=request.num_drafts,
            blocks_after=sum(kv.tables(request)),
        )
    return books


def pool_books(state: SchedulerState) -> PoolBooks | None:
    """Every block the request tables hold now, with its reference count and whether it
    has a hash; None where the reference keeps no block ids (prefix caching off: it counts
    blocks, and vLLM's ids are not modelled). The null block, which any table may hold and
    whose count vLLM does not keep, aside."""
    pool = state.block_pool
    if pool is None:
        return None
    holders: dict[int, int] = {}
    for request in state.requests.values():
        tables = [group.block_ids for group in request.kv_groups] or [request.block_ids]
        for table in tables:
            for block in table:
                if block:
                    holders[block] = holders.get(block, 0) + 1
    return PoolBooks(
        holders,
        {block: pool.ref_cnt[block] for block in holders},
        frozenset(block for block in holders if pool.block_hash[block] is not None),
    )
