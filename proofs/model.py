"""The symbolic model: spec code run on z3 terms.

Nothing here restates a budget rule. A configuration is a ``StepParams`` whose numbers are
z3 integers; the ledger transitions are ``StepBook.schedule`` / ``StepBook.preempt`` of
``dualbudget.spec.book`` run on symbolic ledgers; room, grant, charge, refund, the stop
condition, the admission rules and the count cap are the policy's own methods. What the
proofs add is bookkeeping *about* the code: ghost sums of what is scheduled, and the
abstraction that lets one state stand for any number of scheduled requests.

The frame abstraction. The requests scheduled in a step, other than one tracked request
``x``, are summarised by their count ``n`` and their target tokens ``T``. A multiset of
``n`` integers, each ``>= 1``, summing to ``T`` exists exactly when ``T >= n >= 0`` and
``n = 0 -> T = 0``; so ``(n, T)`` with those constraints is every such step and nothing
else. Sums of a per-request quantity ``f(q)`` (a charge, the true draft rows) are
``n * f(0) + T * (f(1) - f(0))``; that identity holds exactly when ``f`` is affine in
``q``, which ``affine_lemma`` proves of the policy's code (it is a premise checked by the
obligation that uses it, never assumed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from dualbudget.spec.arith import Cond, Num, all_of, any_of, ite
from dualbudget.spec.book import StepBook
from dualbudget.spec.invariants import buffer_peak_ok, conserved, nonnegative
from dualbudget.spec.methods import MethodLayout
from dualbudget.spec.policies import Charge, Ledger, Policy, StepParams

# -- small helpers the spec's arith does not need ---------------------------------------


def neg(cond: Cond) -> Cond:
    """``not cond`` for a Python bool or a z3 condition."""
    if isinstance(cond, bool):
        return not cond
    return z3.Not(cond)


def implies(a: Cond, b: Cond) -> Cond:
    if isinstance(a, bool) and isinstance(b, bool):
        return (not a) or b
    return z3.Implies(a, b)


def as_bool(cond: Cond) -> Any:
    """A z3 condition (a Python bool becomes ``BoolVal``)."""
    return z3.BoolVal(cond) if isinstance(cond, bool) else cond


def charge_eq(a: Charge, b: Charge) -> Cond:
    return all_of(a.tokens == b.tokens, a.rows == b.rows)


# -- the system under proof -----------------------------------------------------------


@dataclass(frozen=True)
class Subject:
    """A profile's ledger code: its policy and its book (a mutant swaps one of them)."""

    profile: str
    policy: Policy
    book: type[StepBook] = StepBook

    def open_book(self, p: StepParams) -> StepBook:
        return self.book.opened(self.policy, p)

    def book_at(self, p: StepParams, ledger: Ledger, charges: dict[str, Charge]) -> StepBook:
        return self.book(self.policy, p, ledger, dict(charges))


@dataclass(frozen=True)
class SymConfig:
    """A symbolic configuration: ``B``, ``S``, ``max_num_seqs``, ``K`` are z3 integers."""

    b: Any
    s: Any
    m: Any
    k: Any
    p: StepParams

    def engine(self) -> list[Any]:
        """What vLLM's config checks guarantee of every config (``check_engine_config``):
        positive budgets, ``max_num_batched_tokens >= max_num_seqs``, ``K >= 1``."""
        return [self.b >= 1, self.s >= 1, self.m >= 1, self.b >= self.m, self.k >= 1]


def sym_config(layout: MethodLayout, tag: str = "") -> SymConfig:
    b, s, m, k = z3.Ints(f"B{tag} S{tag} max_num_seqs{tag} K{tag}")
    return SymConfig(b, s, m, k, StepParams(b, s, m, k, layout))


def accepted(subject: Subject, p: StepParams) -> Any:
    return as_bool(subject.policy.accepts(p))


# -- the sum abstraction ----------------------------------------------------------------


def affine_sum(f: Callable[[Num], Num], n: Num, t: Num) -> Num:
    """``sum f(q_i)`` over ``n`` requests whose ``q_i`` sum to ``t``, for affine ``f``."""
    f0 = f(0)
    return n * f0 + t * (f(1) - f0)


def affine_lemma(f: Callable[[Num], Num], q: Any) -> Any:
    """``f(q) = f(0) + q * (f(1) - f(0))``: what ``affine_sum`` needs of ``f``."""
    f0 = f(0)
    return f(q) == f0 + q * (f(1) - f0)


def charge_fields(subject: Subject, p: StepParams) -> dict[str, Callable[[Num], Num]]:
    """The per-request quantities whose sums the invariant keeps."""
    policy = subject.policy
    return {
        "charged tokens": lambda q: policy.charge(p, q).tokens,
        "charged rows": lambda q: policy.charge(p, q).rows,
        "true draft rows": p.draft_rows,
    }


# -- the abstract state of one step -----------------------------------------------------

UNSCHEDULED, SCHEDULED, REFUNDED = 0, 1, 2
STATUS_NAMES = ("unscheduled", "scheduled", "refunded")
"""The tracked request's status, by its number, in the words of the queries' labels."""


@dataclass
class AbsState:
    """One step in progress: the book's ledger, the frame of other scheduled requests
    ``(n, T)``, and one tracked request ``x`` with its status and, when the book holds a
    charge for it, that recorded charge."""

    ledger: Ledger
    n: Any
    t: Any
    status: int
    q_x: Any
    book_x: Charge | None
    """What the book records for ``x`` (None: the book holds no charge for it)."""
    others: dict[str, Charge] = field(default_factory=dict)
    """Entries of the frame the book materialises for a transition (a victim)."""

    def charges(self) -> dict[str, Charge]:
        entries = dict(self.others)
        if self.book_x is not None:
            entries["x"] = self.book_x
        return entries

    @property
    def x_counts(self) -> bool:
        return self.status == SCHEDULED

    def count(self) -> Num:
        return self.n + (1 if self.x_counts else 0)

    def target(self) -> Num:
        return self.t + (self.q_x if self.x_counts else 0)

    def sum_of(self, f: Callable[[Num], Num]) -> Num:
        total = affine_sum(f, self.n, self.t)
        return total + f(self.q_x) if self.x_counts else total


def fresh_state(tag: str, status: int, ledger: Ledger | None = None) -> AbsState:
    tb, ib, n, t, qx, bt, br = z3.Ints(
        f"token_budget{tag} input_budget{tag} n{tag} T{tag} q_x{tag} booked_tokens_x{tag}"
        f" booked_rows_x{tag}"
    )
    book_x = Charge(bt, br) if status == SCHEDULED else None
    return AbsState(ledger or Ledger(tb, ib), n, t, status, qx, book_x)


@dataclass(frozen=True)
class Invariant:
    """The inductive invariant, split the way the contract items are."""

    c1: Any
    """C1: every budget the policy keeps is >= 0."""
    c2: Any
    """C2: each budget is its opening value minus what the scheduled requests were charged;
    the book holds a charge exactly for the scheduled requests, and it is the policy's."""
    shape: Any
    """The frame is a multiset of requests of >= 1 token each; the count cap holds."""

    def all(self) -> Any:
        return z3.And(self.c1, self.c2, self.shape)


def invariant(subject: Subject, cfg: SymConfig, st: AbsState) -> Invariant:
    policy, p = subject.policy, cfg.p
    opened = policy.open(p)
    tokens = st.sum_of(lambda q: policy.charge(p, q).tokens)
    rows = st.sum_of(lambda q: policy.charge(p, q).rows)
    kept = conserved(opened, st.ledger, tokens, rows)
    book_ok: Cond
    if st.x_counts:
        book_ok = st.book_x is not None and charge_eq(st.book_x, policy.charge(p, st.q_x))
    else:
        book_ok = st.book_x is None
    shape = all_of(
        st.n >= 0,
        st.t >= st.n,
        implies(st.n == 0, st.t == 0),
        st.q_x >= 1,
        st.count() <= policy.max_active_requests(p),
    )
    return Invariant(
        as_bool(nonnegative(st.ledger)), as_bool(all_of(kept, book_ok)), as_bool(shape)
    )


def true_draft_rows(cfg: SymConfig, st: AbsState) -> Num:
    return st.sum_of(cfg.p.draft_rows)


# -- the FCFS greedy step, over arith ---------------------------------------------------


@dataclass
class Run:
    """One FCFS step over a queue: what each request got, and the sums of the step."""

    granted: list[Num]
    book: StepBook
    count: Num
    target: Num
    draft: Num
    stalled: Cond = False
    """The loop met a request it could look at (not exhausted, under the cap) and the
    policy granted it nothing: the stall vLLM's ``assert num_new_tokens > 0`` forbids."""


def fcfs_step(
    subject: Subject, p: StepParams, needs: Sequence[Num], present: Sequence[Cond] | None = None
) -> Run:
    """The scheduler's loop over a waiting queue, in order: while the book is not
    exhausted, requests remain and fewer than ``max_active_requests`` are scheduled,
    ``q = grant(need)``; ``q == 0`` stops the step, else ``schedule``. On ints it runs
    the loop; on z3 terms it builds the same loop's formula (each branch merged by ite).
    """
    book = subject.open_book(p)
    cap = subject.policy.max_active_requests(p)
    going: Cond = True
    count: Num = 0
    granted: list[Num] = []
    target: Num = 0
    draft: Num = 0
    stalled: Cond = False
    for i, need in enumerate(needs):
        here = True if present is None else present[i]
        go = all_of(going, here, count < cap, neg(book.exhausted()))
        if isinstance(go, bool) and not go:
            granted.append(0)
            going = False
            continue
        q = ite(go, book.grant(need), 0)
        took = all_of(go, q > 0)
        stalled = any_of(stalled, all_of(go, q <= 0))
        rid = f"r{i}"
        if isinstance(took, bool):
            if took:
                book.schedule(rid, q)
        else:
            trial = book.copy()
            trial.schedule(rid, q)
            book.ledger = Ledger(
                ite(took, trial.ledger.token_budget, book.ledger.token_budget),
                ite(took, trial.ledger.input_budget, book.ledger.input_budget),
            )
            charge = trial.charges[rid]
            book.charges[rid] = Charge(ite(took, charge.tokens, 0), ite(took, charge.rows, 0))
        got = ite(took, q, 0)
        granted.append(got)
        count = count + ite(took, 1, 0)
        target = target + got
        draft = draft + ite(took, p.draft_rows(got), 0)
        going = took
    return Run(granted, book, count, target, draft, stalled)


def c3_holds(cfg: SymConfig, opened_target: Num, target: Num, draft: Num) -> Any:
    return as_bool(buffer_peak_ok(cfg.p, opened_target, target, draft))
