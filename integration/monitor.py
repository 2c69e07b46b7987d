"""The contract as a runtime monitor: every live step of any vLLM scheduler checked for C3,
C4, the decidable part of C5 and the scheduler's books C7-C13, from vLLM's own scheduler
output and state alone.

The monitor is a second opinion beside the lockstep, independent of the reference: it
imports no reference scheduling code and knows no budget policy. It reads what vLLM
decided (``num_scheduled_tokens`` and the preempted requests of the step), what each
request wanted just before ``schedule()`` and how many blocks vLLM's own pool holds
free, and evaluates the contract's predicates of ``spec.invariants`` (their one home) on
the layout's true draft rows ``C(q)`` (``spec.methods``), never on a policy's charge:

- **C3 buffer peak** (every step): ``buffer_peak_ok`` with the hard target cap
  ``min(S, B)``: ``T <= min(S, B)`` and ``D = sum C(q_i) <= B``.
- **C4 progress** (every empty step: nothing scheduled, nothing preempted): a violation
  only where a request could have run with vLLM's own pool: a running request that
  wants at least one token (none of its output in flight) and whose next token plus
  vLLM's lookahead slots fit the blocks it holds and the pool's free blocks, or a
  waiting request first in vLLM's queue order (fewer running than ``max_num_seqs``;
  vLLM's waiting loop stops at the first it cannot schedule) all of whose tokens plus the
  lookahead fit the pool's free blocks (an upper bound of what one token of it needs,
  prefix hits included). On a KV cache of several groups the blocks are summed over
  vLLM's groups, each at its own block size and against the blocks the request holds
  there (``blocks_needed``): an upper bound for full attention (MLA too), sliding
  window and chunked local attention, whose managers free blocks but never ask more
  than the tokens' blocks, plus one block per group for a prefix hit that ends inside
  a block (vLLM copies that block on write). A group of any other manager (Mamba's
  state and checkpoint blocks, the kinds the reference refuses) makes the need
  uncertain, and C4 is not judged there. In every case only where one token keeps the
  hard limits (``one_token_fits``), and, with ``enable_chunked_prefill`` off, where the waiting
  request's whole rest does (``within_hard_limits``: vLLM never splits it). A step
  vLLM had to leave empty for want of blocks is never judged, nor, under async
  scheduling, one taken while the previous step's output is still in flight (vLLM
  rightly holds back a preempted request whose stale output is still to come).
- **C5 tightness, its decidable part**: a request vLLM *scheduled* with fewer tokens than
  it wanted (``0 < q < need``, ``need`` being what it held before the step, spec tokens
  and output placeholders included, capped by ``max_model_len - 1 - K``) is a violation
  when one more token keeps the hard limits (``one_more_token_fits``: C3 against
  ``min(S, B)`` and ``B``, ``max_num_seqs``). Cuts the monitor cannot attribute are not
  judged: a request not scheduled at all (queue order and KV admission decide that, not
  the budget), a cut at or above a positive ``long_prefill_token_threshold``, every cut
  of a step that preempted (a victim's refund frees room after the cut was made, room
  the cut could not have used), and every cut of a scheduler that splits chunks at
  Mamba block boundaries (vLLM's ``need_mamba_block_aligned_split``, Mamba ``align``:
  the KV layout's cut, not the budget's). On any other KV layout, one group or several,
  the KV cache never shortens a grant (a request whose blocks do not fit is not
  scheduled, or preempts, and a step that preempted is not judged), so its cuts are
  judged as on one group. Those left out are C5's rest, which only a scheduler that
  knows the policy's budgets can decide: the lockstep's reference.
- **C7-C11, the books** (``spec.contract.BOOKS``, every request unfinished before the
  step): its placeholders, drafts, KV slots, length and what a preemption released,
  read off vLLM's request and KV managers (``integration.books``) and judged by the
  predicates of ``spec.books``; ``books_judged`` counts the request-steps each item
  stood on, so a count of no violation names its work.
- **C12, the engine calls** (every request unfinished before a ``reset_prefix_cache`` or
  ``set_pause_state`` between steps): what the call left of each request's books, read
  just before and just after it (``judge_call``), counted in ``books_judged`` per
  request and call.
- **C13, the blocks held** (every block a table of vLLM's KV managers holds after the
  step): its reference count covers its holders, and a block two tables hold has a
  hash (``integration.books.pool_books``), counted in ``books_judged`` per block and
  step. A block freed while a step that reads it is in flight (async scheduling, a
  preemption) is rewritten only by a later step, which runs after it; what is judged is
  that no table holds a block the pool counts as free or hands to another table.

Violations are collected, never raised: the lockstep's verdict is the reference's, the
monitor's is reported beside it (``integration.outcome``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dualbudget.spec.books import (
    CallBooks,
    PoolBooks,
    RequestBooks,
    block_held,
    drafts_within_rows,
    engine_call_kept,
    placeholders_kept,
    preemption_released,
    slots_ahead,
    within_length,
)
from dualbudget.spec.config import EngineConfig
from dualbudget.spec.invariants import (
    buffer_peak_ok,
    one_more_token_fits,
    one_token_fits,
    within_hard_limits,
)
from dualbudget.spec.policies import StepParams

from .books import books_after, pool_books, sampled_per_step

BOOKS_MONITORED = ("C7", "C8", "C9", "C10", "C11", "C12", "C13")
"""The scheduler's books (``spec.contract.BOOKS``): C7-C11 and C13 checked on every live
step, C12 on every engine call between steps."""
MONITORED = ("C3", "C4", "C5", *BOOKS_MONITORED)
"""The contract items the monitor checks on every live step."""


@dataclass(frozen=True)
class MonitorViolation:
    contract: str
    step: int
    message: str


@dataclass(frozen=True)
class Wanted:
    """One unfinished request just before ``schedule()``, as vLLM holds it."""

    num_tokens_with_spec: int
    num_output_placeholders: int
    num_computed_tokens: int
    running: bool
    """In vLLM's running queue (else waiting)."""
    blocks_held: tuple[int, ...]
    """Blocks in its table, per KV group in vLLM's order (vLLM's ``get_block_ids``,
    null blocks of a window included); () for a waiting request."""
    first_waiting: bool = False
    """First in vLLM's waiting queue, in its policy's order: the request vLLM's waiting
    loop considers first."""


@dataclass(frozen=True)
class StepSeen:
    """One live step as the monitor judges it: vLLM's decision, and what it held."""

    step: int
    scheduled: Mapping[str, int]
    preempted: Sequence[str]
    wanted: Mapping[str, Wanted]
    """Every unfinished request before the step."""
    free_blocks: int | None
    """Free blocks of vLLM's pool after the step; None: not readable (C4 not judged)."""
    num_running: int
    """Requests in vLLM's running queue before the step."""
    block_sizes: tuple[int, ...] | None
    """The block size of each of vLLM's KV cache groups, in its order; None where one
    group's manager is of a kind whose blocks the monitor cannot bound (C4 not
    judged)."""
    aligned_split: bool = False
    """vLLM splits chunks at Mamba block boundaries: cuts are not judged (C5)."""
    books: Mapping[str, RequestBooks] | None = None
    """Every request's books around the step (C7-C11); None: not read (a stand-in
    scheduler), and the books are not judged."""
    pool: PoolBooks | None = None
    """The blocks the tables hold after the step (C13); None: not read, not judged."""
    sampled: int = 1
    """Tokens a decode step samples per request (vLLM's ``num_sampled_tokens_per_step``)."""
    pause_state: str = "unpaused"
    """vLLM's ``Scheduler.pause_state`` when it scheduled the step, lowercased: under
    ``paused_all`` it rightly schedules nothing, under ``paused_new`` no waiting request."""


class Monitor:
    """C3, C4 and C5's decidable part on one config's live steps.

    ``draft_rows`` replaces the layout's ``C(q)`` (a test tells it a wrong one to see it
    fail); ``num_lookahead_tokens`` is vLLM's, and so are the block sizes each step
    brings (``StepSeen.block_sizes``).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        num_lookahead_tokens: int = 0,
        draft_rows: Callable[[int], int] | None = None,
    ) -> None:
        self.config = config
        self.params = StepParams.of(config)
        self.draft_rows: Callable[[int], int] = draft_rows or (
            lambda q: int(self.params.draft_rows(q))
        )
        self.hard_target_cap = min(config.scheduled_tokens_cap, config.max_num_batched_tokens)
        self.num_lookahead_tokens = num_lookahead_tokens
        self.violations: list[MonitorViolation] = []
        self.steps = 0
        self.books_judged: dict[str, int] = dict.fromkeys(BOOKS_MONITORED, 0)
        """Per book item, the request-steps (C12: request-calls) it was judged on (C9:
        those whose slots are bounded by their blocks): what a count of no violation
        stands on."""
        self.in_flight = False
        """Async scheduling: the last step judged scheduled something, so its output is
        still in flight while the next step schedules."""

    def judge(self, seen: StepSeen) -> list[MonitorViolation]:
        """The violations of ``seen``; also kept in ``violations``."""
        found = self._c3(seen) + self._c4(seen) + self._c5(seen) + self._books(seen)
        found += self._pool(seen)
        self.in_flight = self.config.async_scheduling and bool(seen.scheduled)
        self.steps += 1
        self.violations += found
        return found

    def judge_call(
        self, step: int, call: str, books: Mapping[str, CallBooks], *, resets_running: bool
    ) -> list[MonitorViolation]:
        """C12 on one engine call made before step ``step`` (``call`` names it): the
        violations, also kept in ``violations``."""
        found = []
        for rid, request in books.items():
            self.books_judged["C12"] += 1
            if not engine_call_kept(request, resets_running=resets_running):
                found.append(MonitorViolation("C12", step, f"{call}: request {rid}: {request}"))
        self.violations += found
        return found

    def _c3(self, seen: StepSeen) -> list[MonitorViolation]:
        target = sum(seen.scheduled.values())
        draft = sum(self.draft_rows(q) for q in seen.scheduled.values())
        if buffer_peak_ok(self.params, self.hard_target_cap, target, draft):
            return []
        return [
            MonitorViolation(
                "C3",
                seen.step,
                f"buffer peak: T={target} D={draft} over {len(seen.scheduled)} requests,"
                f" min(max_num_scheduled_tokens, max_num_batched_tokens)={self.hard_target_cap}"
                f" max_num_batched_tokens={self.config.max_num_batched_tokens}",
            )
        ]

    def _need(self, wanted: Wanted, computed: int) -> int:
        """What a request wants of a step that finds it ``computed`` tokens in: vLLM's
        ``num_tokens_with_spec + num_output_placeholders - num_computed_tokens``, capped
        so that its positions stay below ``max_model_len`` whatever the release's margin
        (``1`` or ``1 + K``)."""
        raw = wanted.num_tokens_with_spec + wanted.num_output_placeholders - computed
        margin = 1 + self.config.num_speculative_tokens
        return min(raw, self.config.max_model_len - computed - margin)

    def blocks_needed(self, seen: StepSeen, tokens: int, held: tuple[int, ...]) -> int:
        """At most the blocks vLLM's pool gives a request to hold ``tokens`` tokens, with
        ``held`` blocks per group already in its table (``StepSeen.block_sizes`` known):
        per group, its tokens' blocks less those held, and, with prefix caching on
        several groups, one more for a hit that ends inside a block."""
        assert seen.block_sizes is not None
        sizes = seen.block_sizes
        copy_on_write = int(self.config.enable_prefix_caching and len(sizes) > 1 and not held)
        return sum(
            max(_cdiv(tokens, size) - (held[g] if g < len(held) else 0), 0) + copy_on_write
            for g, size in enumerate(sizes)
        )

    def _c4(self, seen: StepSeen) -> list[MonitorViolation]:
        if seen.scheduled or seen.preempted or seen.free_blocks is None:
            return []
        if seen.block_sizes is None or self.in_flight or not one_token_fits(self.params):
            return []
        if seen.pause_state == "paused_all":
            return []
        lookahead = self.num_lookahead_tokens
        for rid, wanted in seen.wanted.items():
            if wanted.running:
                # Output in flight (async scheduling): vLLM may rightly wait for it.
                if wanted.num_output_placeholders:
                    continue
                computed = wanted.num_computed_tokens
                if self._need(wanted, computed) < 1:
                    continue
                blocks = self.blocks_needed(seen, computed + 1 + lookahead, wanted.blocks_held)
            else:
                if seen.pause_state == "paused_new":
                    continue
                if not wanted.first_waiting or seen.num_running >= self.config.max_num_seqs:
                    continue
                rest = wanted.num_tokens_with_spec - wanted.num_computed_tokens
                if not self.config.enable_chunked_prefill and not within_hard_limits(
                    self.params, rest, self.draft_rows(rest), 1
                ):
                    continue
                # A preempted request waits to recompute its output too: all its tokens.
                blocks = self.blocks_needed(seen, wanted.num_tokens_with_spec + 1 + lookahead, ())
            if blocks <= seen.free_blocks:
                where = "running" if wanted.running else "waiting"
                return [
                    MonitorViolation(
                        "C4",
                        seen.step,
                        f"empty step while {where} request {rid} could run: it needs at most"
                        f" {blocks} blocks and vLLM's pool has {seen.free_blocks} free",
                    )
                ]
        return []

    def _c5(self, seen: StepSeen) -> list[MonitorViolation]:
        if seen.aligned_split or seen.preempted:
            return []
        threshold = self.config.long_prefill_token_threshold
        target = sum(seen.scheduled.values())
        draft = sum(self.draft_rows(q) for q in seen.scheduled.values())
        count = len(seen.scheduled)
        found = []
        for rid, q in seen.scheduled.items():
            wanted = seen.wanted.get(rid)
            if wanted is None or (0 < threshold <= q):
                continue
            # vLLM's ``_update_after_schedule`` has added q: the step found it q before.
            need = self._need(wanted, wanted.num_computed_tokens)
            if not 0 < q < need:
                continue
            rest_target, rest_draft = target - q, draft - self.draft_rows(q)
            if one_more_token_fits(self.params, rest_target, rest_draft, count - 1, q):
                found.append(
                    MonitorViolation(
                        "C5",
                        seen.step,
                        f"request {rid} granted {q} of the {need} tokens it wanted though"
                        f" one more fits: T={target} D={draft} over {count} requests,"
                        f" max_num_batched_tokens={self.config.max_num_batched_tokens}",
                    )
                )
        return found

    def _books(self, seen: StepSeen) -> list[MonitorViolation]:
        """C7-C11 on every request's books, one violation per item and request."""
        if seen.books is None:
            return []
        config = self.config
        checks: tuple[tuple[str, Callable[[RequestBooks], bool]], ...] = (
            (
                "C7",
                lambda b: placeholders_kept(
                    b, async_scheduling=config.async_scheduling, sampled=seen.sampled
                ),
            ),
            (
                "C8",
                lambda b: drafts_within_rows(
                    b, num_speculative_tokens=config.num_speculative_tokens
                ),
            ),
            (
                "C9",
                lambda b: slots_ahead(
                    b,
                    num_lookahead_tokens=self.num_lookahead_tokens,
                    max_model_len=config.max_model_len,
                ),
            ),
            (
                "C10",
                lambda b: within_length(
                    b, max_model_len=config.max_model_len, sampled=seen.sampled
                ),
            ),
            ("C11", preemption_released),
        )
        found = []
        for rid, books in seen.books.items():
            for contract, holds in checks:
                if contract != "C9" or books.slots_after is not None:
                    self.books_judged[contract] += 1
                if not holds(books):
                    found.append(MonitorViolation(contract, seen.step, _books_line(rid, books)))
        return found

    def _pool(self, seen: StepSeen) -> list[MonitorViolation]:
        """C13 on every block a table holds, one violation per step naming the blocks."""
        pool = seen.pool
        if pool is None:
            return []
        self.books_judged["C13"] += len(pool.holders)
        broken = [block for block in sorted(pool.holders) if not block_held(pool, block)]
        if not broken:
            return []
        shown = ", ".join(
            f"block {block} held by {pool.holders[block]} tables, ref_cnt"
            f" {pool.ref_counts[block]}"
            + (", no hash" if pool.holders[block] > 1 and block not in pool.hashed else "")
            for block in broken[:4]
        )
        more = f" (and {len(broken) - 4} more)" if len(broken) > 4 else ""
        return [MonitorViolation("C13", seen.step, shown + more)]


def _books_line(rid: str, books: RequestBooks) -> str:
    """One request's books, as a violation's message names them."""
    return (
        f"request {rid}: scheduled {books.scheduled} with {books.drafts} drafts,"
        f" placeholders {books.placeholders_before} -> {books.placeholders_after},"
        f" stale {books.stale_after}, computed {books.computed_after} of {books.tokens}"
        f" tokens, slots {books.slots_after}, blocks {books.blocks_after},"
        f" drafts held {books.drafts_after}"
        + (f", preempted (waiting: {books.waiting_after})" if books.preempted else "")
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- reading vLLM ---------------------------------------------------------------------------
VLLM_FIELDS = ("running", "waiting", "requests", "kv_cache_manager")
"""What the monitor reads of vLLM's ``Scheduler`` (any subclass has them)."""


def readable(scheduler: object) -> bool:
    """Whether ``scheduler`` is one the monitor can read: vLLM's, not a test's stand-in."""
    return all(hasattr(scheduler, name) for name in VLLM_FIELDS)


BOUNDED_MANAGERS = frozenset(
    {"FullAttentionManager", "SlidingWindowManager", "ChunkedLocalAttentionManager"}
)
"""vLLM's single-type KV managers (exact classes: their subclasses allocate otherwise)
whose blocks for ``n`` tokens are at most ``cdiv(n, block_size)`` less the table's
(``Monitor.blocks_needed``). MLA layers have ``FullAttentionManager`` and sliding-window
MLA ``SlidingWindowManager``."""


def block_sizes(scheduler: Any) -> tuple[int, ...] | None:
    """The block size of each of vLLM's KV groups, from its own managers; None where one
    is not of ``BOUNDED_MANAGERS``."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    if any(type(manager).__name__ not in BOUNDED_MANAGERS for manager in managers):
        return None
    return tuple(int(manager.block_size) for manager in managers)


def wanted_before(scheduler: Any) -> dict[str, Wanted]:
    """Every unfinished request of vLLM's ``scheduler`` just before ``schedule()``."""
    running = {str(request.request_id) for request in scheduler.running}
    first = next(iter(scheduler.waiting), None)
    first_waiting = None if first is None else str(first.request_id)
    manager = scheduler.kv_cache_manager
    wanted = {}
    for rid, request in scheduler.requests.items():
        if request.is_finished():
            continue
        held: tuple[int, ...] = ()
        if rid in running:
            held = tuple(len(blocks) for blocks in manager.get_block_ids(rid))
        wanted[str(rid)] = Wanted(
            num_tokens_with_spec=int(request.num_tokens_with_spec),
            num_output_placeholders=int(getattr(request, "num_output_placeholders", 0)),
            num_computed_tokens=int(request.num_computed_tokens),
            running=str(rid) in running,
            blocks_held=held,
            first_waiting=str(rid) == first_waiting,
        )
    return wanted


def step_seen(
    scheduler: Any,
    step: int,
    scheduled: Mapping[str, int],
    preempted: Sequence[str],
    before: Mapping[str, Wanted],
    drafts: Mapping[str, int] | None = None,
) -> StepSeen:
    """The step vLLM's ``scheduler`` just made, with ``before`` (``wanted_before``) made
    exact: a scheduled request's computed tokens are read back as vLLM's
    ``schedule()`` found them (after its prefix-cache hits), its count less ``q``. With
    ``drafts`` (the step's scheduled draft tokens per request), the books are read too
    (``books.books_after``)."""
    sizes = block_sizes(scheduler)
    books = pool = None
    if drafts is not None:
        placeholders = {rid: w.num_output_placeholders for rid, w in before.items()}
        books = books_after(scheduler, scheduled, drafts, preempted, placeholders, sizes)
        pool = pool_books(scheduler)
    wanted = dict(before)
    for rid, q in scheduled.items():
        request = scheduler.requests.get(rid)
        if request is not None and rid in wanted:
            old = wanted[rid]
            wanted[rid] = replace(old, num_computed_tokens=int(request.num_computed_tokens) - q)
    return StepSeen(
        step=step,
        scheduled=dict(scheduled),
        preempted=tuple(preempted),
        wanted=wanted,
        free_blocks=int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks()),
        num_running=sum(1 for w in before.values() if w.running),
        block_sizes=sizes,
        aligned_split=bool(getattr(scheduler, "need_mamba_block_aligned_split", False)),
        books=books,
        pool=pool,
        sampled=sampled_per_step(scheduler),
        pause_state=pause_state_of(scheduler),
    )


def pause_state_of(scheduler: Any) -> str:
    """vLLM's ``Scheduler.pause_state``, lowercased (``unpaused`` where a vLLM has none)."""
    state = getattr(scheduler, "pause_state", None)
    return "unpaused" if state is None else str(state.name).lower()
