"""Reading vLLM's books around one ``schedule()`` into ``spec.books.RequestBooks``, for the
monitor's items C7-C11 (``spec.contract.BOOKS``).

Everything is read from the scheduler object vLLM built, through attributes every release
from 0.32 on has (``num_output_placeholders``, ``num_computed_tokens``, ``spec_token_ids``,
the KV managers' ``req_to_blocks``); ``num_stale_output_tokens`` (0.34) reads as 0 where a
release has none. A request's block tables are read without creating an entry (vLLM's
``req_to_blocks`` is a ``defaultdict``): reading must not change what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dualbudget.spec.books import RequestBooks


def sampled_per_step(scheduler: Any) -> int:
    """Tokens a decode step samples per request: vLLM's ``num_sampled_tokens_per_step``
    (1 where a release predates the field)."""
    return int(getattr(scheduler, "num_sampled_tokens_per_step", 1))


def _tables(scheduler: Any, rid: str) -> list[int]:
    """The blocks in ``rid``'s table in each of vLLM's KV groups, in its order."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [len(manager.req_to_blocks.get(rid, ())) for manager in managers]


def books_after(
    scheduler: Any,
    scheduled: Mapping[str, int],
    drafts: Mapping[str, int],
    preempted: Sequence[str],
    placeholders_before: Mapping[str, int],
    sizes: tuple[int, ...] | None,
) -> dict[str, RequestBooks]:
    """The books of every request unfinished before the step (the keys of
    ``placeholders_before``, each request's output placeholders then), read from
    ``scheduler`` just after it; ``sizes``: each KV group's block size, None where a
    group's slots are not bounded by its blocks (no slot count is then judged)."""
    running = {str(request.request_id) for request in scheduler.running}
    waiting = {str(request.request_id) for request in scheduler.waiting}
    gone = set(preempted)
    books = {}
    for rid, placeholders in placeholders_before.items():
        request = scheduler.requests.get(rid)
        if request is None:
            continue
        tables = _tables(scheduler, rid)
        slots = (
            None
            if sizes is None
            else tuple(blocks * size for blocks, size in zip(tables, sizes, strict=True))
        )
        books[rid] = RequestBooks(
            scheduled=int(scheduled.get(rid, 0)),
            drafts=int(drafts.get(rid, 0)),
            tokens=int(request.num_tokens),
            placeholders_before=placeholders,
            placeholders_after=int(getattr(request, "num_output_placeholders", 0)),
            stale_after=int(getattr(request, "num_stale_output_tokens", 0)),
            computed_after=int(request.num_computed_tokens),
            slots_after=slots,
            preempted=rid in gone,
            waiting_after=rid in waiting and rid not in running,
            drafts_after=len(request.spec_token_ids or ()),
            blocks_after=sum(tables),
        )
    return books
