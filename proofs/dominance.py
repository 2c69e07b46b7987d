"""C6 dominance for a queue of any length: an inductive relation between two policies.

Two policies, the relaxed one ``hi`` and the stricter one ``lo``, run the scheduler's FCFS
loop over the same queue in the same order. After any prefix of the queue each is a
*lane*: its book's ledger, how many requests it scheduled (``n``) and their target tokens
(``T``), and whether its loop still goes (it stops for good at the first request it does
not schedule). One request more is ``serve``: the loop body of ``model.fcfs_step``, run
from a symbolic lane instead of an opened book, with the same stop rules (exhausted, the
active-request cap, a grant of 0).

The relation, for one measure ``M`` (target tokens ``T``, or requests ``n``)::

    R_M  :=  track(hi) ∧ track(lo) ∧ ( tied ∨ (lo_done ∧ M_hi >= M_lo) )
    track(L)  :=  L's ledger is open(p) minus the charges of n requests of T tokens (C2),
                  n >= 0, T >= n, n = 0 -> T = 0
    tied      :=  both lanes go, n_hi = n_lo, T_hi = T_lo
    lo_done   :=  lo takes no further request: it stopped, or it is at its cap, or exhausted

Base: the opened books are tied. Step: one more request with any ``need >= 1``, from a
tied state and from a state where ``lo`` is done, gives ``R_M`` again. Conclusion: ``R_M``
implies ``M_hi >= M_lo`` (``spec.invariants.dominates``). So dominance holds after every
prefix of every queue, whatever its length: no unrolling, no bound.

``track`` is the auxiliary invariant: without it a tied pair of ledgers would be any
pair, and the relaxed policy's room would not follow from the stricter one's. Its ledger
part is the C2 invariant restricted to the FCFS loop (which only schedules); it needs the
charges affine in ``q`` (``model.affine_lemma``), which the obligation proves as a lemma.
From a tied state the step needs, in substance: when ``lo`` would take the request, ``hi``
is under its own cap, not exhausted and grants at least as much; when ``hi`` grants more,
``lo`` was cut short and is exhausted after it. Where that fails the solver's model is a
counterexample to induction and the obligation fails; ``witness.find_witness`` then
searches a concrete queue. The plain relation (``track`` without its frame shape,
``lo_done`` only when ``lo`` stopped) is not inductive for every pair: ``Relation`` names
the strengthenings, and proofs/README.md says which pair needs which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from dualbudget.spec.arith import Cond, Num, all_of, any_of, ite
from dualbudget.spec.invariants import dominates
from dualbudget.spec.policies import Ledger, StepParams

from .model import (
    UNSCHEDULED,
    AbsState,
    Subject,
    SymConfig,
    affine_lemma,
    as_bool,
    charge_fields,
    invariant,
    neg,
)

MEASURES = ("tokens", "requests")
"""The two C6 measures, one obligation each: ``C6-tokens-vs-X``, ``C6-requests-vs-X``."""


@dataclass(frozen=True)
class Lane:
    """One policy's FCFS loop after a prefix of the queue."""

    ledger: Ledger
    n: Num
    """Requests scheduled so far."""
    t: Num
    """Their target tokens, ``T``."""
    going: Cond
    """The loop still looks at requests: it scheduled every one so far."""


def opened_lane(subject: Subject, p: StepParams) -> Lane:
    return Lane(subject.open_book(p).ledger, z3.IntVal(0), z3.IntVal(0), z3.BoolVal(True))


def fresh_lane(tag: str) -> Lane:
    tb, ib, n, t = z3.Ints(f"token_budget_{tag} input_budget_{tag} n_{tag} T_{tag}")
    return Lane(Ledger(tb, ib), n, t, z3.Bool(f"going_{tag}"))


def serve(subject: Subject, p: StepParams, lane: Lane, need: Num) -> tuple[Lane, Num]:
    """The FCFS loop on one more request of ``need`` tokens: while the loop goes, the
    book is not exhausted and fewer than ``max_active_requests`` are scheduled, ``q =
    grant(need)``; ``q == 0`` stops the loop, else ``schedule``. Returns the lane after it
    and the tokens the request got (0 when not scheduled)."""
    book = subject.book_at(p, lane.ledger, {})
    cap = subject.policy.max_active_requests(p)
    go = all_of(lane.going, lane.n < cap, neg(book.exhausted()))
    q = ite(go, book.grant(need), 0)
    took = all_of(go, q > 0)
    if isinstance(took, bool) and not took:
        return Lane(lane.ledger, lane.n, lane.t, False), 0
    trial = book.copy()
    trial.schedule("next", q)
    ledger = Ledger(
        ite(took, trial.ledger.token_budget, lane.ledger.token_budget),
        ite(took, trial.ledger.input_budget, lane.ledger.input_budget),
    )
    got = ite(took, q, 0)
    return Lane(ledger, lane.n + ite(took, 1, 0), lane.t + got, took), got


@dataclass(frozen=True)
class Relation:
    """Which strengthenings of the plain relation ``R_M`` are on. The proof uses them all
    (``Relation()``); ``tests/unit/test_proofs_dominance.py`` switches each off to show which
    pair needs it (the table of ``proofs/strengthenings.py``)."""

    count_nonnegative: bool = True
    """``track`` includes ``n >= 0``."""
    tokens_cover_count: bool = True
    """``track`` includes ``T >= n`` and ``n = 0 -> T = 0``: every request got a token."""
    lower_exhausted: bool = True
    """``lo_done`` holds of a lane at its cap or exhausted, not only of a stopped one."""


def on_track(subject: Subject, cfg: SymConfig, lane: Lane, relation: Relation) -> Any:
    """``track(L)``: the C2 part of ``model.invariant`` (the ledger is the opening minus
    the charges of ``n`` requests of ``T`` tokens) and the frame shape, for a step that
    only scheduled."""
    st = AbsState(lane.ledger, lane.n, lane.t, UNSCHEDULED, z3.IntVal(1), None)
    parts = [invariant(subject, cfg, st).c2]
    if relation.count_nonnegative:
        parts.append(lane.n >= 0)
    if relation.tokens_cover_count:
        parts += [lane.t >= lane.n, z3.Implies(lane.n == 0, lane.t == 0)]
    return z3.And(*parts)


def lower_done(lo: Subject, p: StepParams, lane: Lane, relation: Relation) -> Any:
    """``lo_done``: the lower lane takes no further request, whatever the queue holds."""
    stopped = neg(lane.going)
    if not relation.lower_exhausted:
        return as_bool(stopped)
    book = lo.book_at(p, lane.ledger, {})
    cap = lo.policy.max_active_requests(p)
    return as_bool(any_of(stopped, lane.n >= cap, book.exhausted()))


def tied(a: Lane, b: Lane) -> Any:
    return z3.And(as_bool(a.going), as_bool(b.going), a.n == b.n, a.t == b.t)


def ahead(measure: str, hi: Lane, lo: Lane) -> Any:
    """C6 of one measure after the prefix: the relaxed lane has at least as much."""
    return as_bool(dominates(measure, hi.t, hi.n, lo.t, lo.n))


def related(
    measure: str,
    subjects: tuple[Subject, Subject],
    cfg: SymConfig,
    lanes: tuple[Lane, Lane],
    relation: Relation,
) -> Any:
    """``R_M`` of the lanes ``(hi, lo)``."""
    (hi, lo), (hi_lane, lo_lane) = subjects, lanes
    done = lower_done(lo, cfg.p, lo_lane, relation)
    return z3.And(
        on_track(hi, cfg, hi_lane, relation),
        on_track(lo, cfg, lo_lane, relation),
        z3.Or(tied(hi_lane, lo_lane), z3.And(done, ahead(measure, hi_lane, lo_lane))),
    )


def charge_lemmas(subject: Subject, p: StepParams, q: Num) -> dict[str, Any]:
    """The affine identity of each charge field at ``q`` (``model.affine_lemma``). Proven
    for every ``q >= 1`` by the obligation's lemma queries; a step uses its instances at
    the tokens it granted, where they hold too when nothing was granted (``q = 0``)."""
    return {
        label: as_bool(affine_lemma(f, q))
        for label, f in charge_fields(subject, p).items()
        if label != "true draft rows"
    }
