"""Reading vLLM's books around one ``schedule()`` into ``spec.books.RequestBooks``, for the
monitor's items C7-C11 (``spec.contract.BOOKS``), around one engine call between steps
into ``spec.books.CallBooks``, for C12, and its block pool after one ``schedule()`` into
``spec.books.PoolBooks``, for C13.

Everything is read from the scheduler object vLLM built, through attributes every release
from 0.32 on has (``num_output_placeholders``, ``num_computed_tokens``, ``spec_token_ids``,
the KV managers' ``req_to_blocks``); ``num_stale_output_tokens`` (0.34) reads as 0 where a
release has none. A request's block tables are read without creating an entry (vLLM's
``req_to_blocks`` is a ``defaultdict``): reading must not change what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dualbudget.spec.books import CallBooks, PoolBooks, RequestBooks


def sampled_per_step(scheduler: Any) -> int:
    """Tokens a decode step samples per request: vLLM's ``num_sampled_tokens_per_step``
    (1 where a release predates the field)."""
    return int(getattr(scheduler, "num_sampled_tokens_per_step", 1))


def _tables(scheduler: Any, rid: str) -> list[int]:
    """The blocks in ``rid``'s table in each of vLLM's KV groups, in its order."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return [len(manager.req_to_blocks.get(rid, ())) for manager in managers]


def pool_books(scheduler: Any) -> PoolBooks:
    """Every block the tables of vLLM's KV managers hold now (``req_to_blocks``, every
    table, a finished request's too if one is left), with its ``ref_cnt`` and whether it
    has a hash; the null block, which every group may hold and whose count vLLM does not
    keep, aside."""
    holders: dict[int, int] = {}
    ref_counts: dict[int, int] = {}
    hashed = set()
    for manager in scheduler.kv_cache_manager.coordinator.single_type_managers:
        for blocks in manager.req_to_blocks.values():
            for block in blocks:
                if block.is_null:
                    continue
                block_id = int(block.block_id)
                holders[block_id] = holders.get(block_id, 0) + 1
                ref_counts[block_id] = int(block.ref_cnt)
                if block.block_hash is not None:
                    hashed.add(block_id)
    return PoolBooks(holders, ref_counts, frozenset(hashed))


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


Snapshot = dict[str, tuple[bool, int, int, bool, int, int, int, int, int, bool]]
"""Per unfinished request: running, ``num_tokens``, ``num_in_flight_tokens``, waiting,
computed tokens, blocks, drafts, placeholders, stale output tokens, ``drop_stale_output``."""


def snapshot(scheduler: Any) -> Snapshot:
    """Every unfinished request's books as vLLM's ``scheduler`` holds them now."""
    running = {str(request.request_id) for request in scheduler.running}
    waiting = {str(request.request_id) for request in scheduler.waiting}
    books = {}
    for rid, request in scheduler.requests.items():
        if request.is_finished():
            continue
        books[str(rid)] = (
            str(rid) in running,
            int(request.num_tokens),
            int(getattr(request, "num_in_flight_tokens", 0)),
            str(rid) in waiting and str(rid) not in running,
            int(request.num_computed_tokens),
            sum(_tables(scheduler, str(rid))),
            len(request.spec_token_ids or ()),
            int(getattr(request, "num_output_placeholders", 0)),
            int(getattr(request, "num_stale_output_tokens", 0)),
            bool(getattr(request, "drop_stale_output", False)),
        )
    return books


def call_books(before: Snapshot, after: Snapshot) -> dict[str, CallBooks]:
    """The books of every request unfinished before an engine call, from the snapshots
    taken just before and just after it (a request gone after it is not judged)."""
    books = {}
    for rid, then in before.items():
        now = after.get(rid)
        if now is None:
            continue
        running, tokens, in_flight = then[0], then[1], then[2]
        _, tokens_after, _, waiting, computed, blocks, drafts, placeholders, stale, drops = now
        books[rid] = CallBooks(
            running_before=running,
            tokens_before=tokens,
            tokens_after=tokens_after,
            in_flight_before=in_flight,
            waiting_after=waiting,
            computed_after=computed,
            blocks_after=blocks,
            drafts_after=drafts,
            placeholders_after=placeholders,
            stale_after=stale,
            drops_stale_after=drops,
            unchanged=then[:1] + then[2:] == now[:1] + now[2:],
        )
    return books
