"""The obligations: one per (profile, layout, contract item), each a list of z3 queries.

A query is a list of premises and, per check, a goal. A check holds when every query it
appears in has satisfiable premises (non-vacuity) and ``premises and not goal`` is
unsatisfiable. A reachability check has no goal: it holds when its premises are
satisfiable. Queries are built by running the spec's code on symbolic configurations
(see ``model``); nothing here restates a budget rule.

Checks (the ``check`` field; ``contract`` is its C-number):

- ``C1``, ``C2``: the invariant is inductive: it holds after ``open`` on an accepted
  config, and every transition (schedule another request, schedule the tracked request,
  preempt another, preempt the tracked one when scheduled, preempt it when it is not)
  keeps its C1 part (``C1``) and its C2 part with the frame shape and count cap (``C2``).
  ``C2`` also proves the charges affine in ``q`` (what the sum abstraction needs).
- ``C2-reach-refund``: an accepted config can schedule a request and preempt it for a
  non-zero refund.
- ``C3``: the invariant implies ``T <= S_opened``, ``T <= min(S, B)``, ``D <= B`` with the
  method's true draft rows.
- ``C3-reach-budget-bound``: a step can end with a request cut short by the budget (not
  by the count cap).
- ``C3-static-cap`` (vllm-0.33, DFlash/DSpark): at most ``B // num_lookahead_tokens``
  requests keep ``D <= B``.
- ``C4``: an accepted config's empty step grants >= 1 token to any runnable request and
  allows >= 1 running request. ``C4-no-stall``: in every reachable state, a step that is
  not exhausted and under its count cap grants >= 1 token (vLLM asserts it), and no
  more than the request needs. ``C4-converse``: every config in which one 1-token
  request fits C3 is accepted.
- ``C5``: a request granted fewer tokens than it needs (cut, or refused because the step
  is exhausted or the policy's own count cap is reached) would break C3 against
  ``min(S, B)`` and ``B`` with one more token.
- ``C6-tokens-vs-X``, ``C6-requests-vs-X``: on the same queue of up to 8 requests with
  symbolic sizes, the profile schedules at least as many target tokens (requests) in a
  step as the next profile ``X`` down the chain dual > vllm-0.33 > vllm-0.32 >
  global-reserve; configs accepted by both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import z3

from dualbudget.spec.arith import floordiv
from dualbudget.spec.methods import LAYOUT_NAMES, layout_named
from dualbudget.spec.policies import Charge
from dualbudget.spec.profiles import PROFILE_NAMES

from .model import (
    REFUNDED,
    SCHEDULED,
    UNSCHEDULED,
    AbsState,
    Subject,
    accepted,
    affine_lemma,
    affine_sum,
    as_bool,
    c3_holds,
    charge_eq,
    charge_fields,
    fcfs_step,
    fits_hard_limits,
    fresh_state,
    invariant,
    neg,
    sym_config,
    true_draft_rows,
)

# The dominance chain, from the most relaxed policy down; C6 compares each with the next.
CHAIN = ("dual", "vllm-0.33", "vllm-0.32", "global-reserve")
C6_QUEUE = 8
"""C6 is bounded: a queue of up to this many requests (the one bound of the suite)."""
C5_WITNESS_QUEUE = 3
OWN_PASS_LAYOUTS = ("dflash", "dspark-anchor", "dspark-fill-in")


@dataclass(frozen=True)
class Obligation:
    profile: str
    layout: str
    check: str
    family: str
    """Obligations of one family share their queries (one job)."""

    @property
    def contract(self) -> str:
        return self.check[:2]

    @property
    def name(self) -> str:
        return f"{self.profile}/{self.layout}/{self.check}"


@dataclass
class Query:
    label: str
    premises: list[Any]
    goals: dict[str, Any | None]
    """check -> goal; None marks a reachability check (premises must be satisfiable)."""
    shown: dict[str, Any] = field(default_factory=dict)
    """Terms to print from a counterexample model."""


def lower_of(profile: str) -> str | None:
    i = CHAIN.index(profile)
    return CHAIN[i + 1] if i + 1 < len(CHAIN) else None


def catalog() -> list[Obligation]:
    """Every obligation of the suite, in a stable order."""
    out: list[Obligation] = []
    for profile in PROFILE_NAMES:
        for layout in LAYOUT_NAMES:
            out += [
                Obligation(profile, layout, "C1", "inductive"),
                Obligation(profile, layout, "C2", "inductive"),
                Obligation(profile, layout, "C2-reach-refund", "reach"),
                Obligation(profile, layout, "C3", "C3"),
                Obligation(profile, layout, "C3-reach-budget-bound", "reach"),
            ]
            if profile == "vllm-0.33" and layout in OWN_PASS_LAYOUTS:
                out.append(Obligation(profile, layout, "C3-static-cap", "C3"))
            out += [
                Obligation(profile, layout, "C4", "C4"),
                Obligation(profile, layout, "C4-no-stall", "C4"),
                Obligation(profile, layout, "C4-converse", "C4"),
                Obligation(profile, layout, "C5", "C5"),
            ]
            lower = lower_of(profile)
            if lower is not None:
                out += [
                    Obligation(profile, layout, f"C6-tokens-vs-{lower}", "C6"),
                    Obligation(profile, layout, f"C6-requests-vs-{lower}", "C6"),
                ]
    return out


def subjects_of(ob: Obligation) -> tuple[str, ...]:
    """The profiles whose code an obligation runs."""
    lower = lower_of(ob.profile)
    return (ob.profile, lower) if ob.family == "C6" and lower else (ob.profile,)


# -- query builders ---------------------------------------------------------------------


def _base(subject: Subject, cfg: Any) -> list[Any]:
    return [*cfg.engine(), accepted(subject, cfg.p)]


def _lemma_instances(subject: Subject, p: Any, *qs: Any) -> list[Any]:
    """The affine identity of each charge field at the ``q``s a query uses; the identity
    itself is proven for all ``q >= 1`` by the obligation's lemma queries."""
    return [affine_lemma(f, q) for q in qs for f in charge_fields(subject, p).values()]


def inductive_queries(subject: Subject, layout_name: str) -> list[Query]:
    layout = layout_named(layout_name)
    cfg = sym_config(layout)
    policy, p = subject.policy, cfg.p
    base = _base(subject, cfg)
    out: list[Query] = []

    q = z3.Int("q")
    for label, f in charge_fields(subject, p).items():
        if label == "true draft rows":
            continue
        out.append(
            Query(
                f"lemma: {label} affine in q",
                [*base, q >= 1],
                {"C2": as_bool(affine_lemma(f, q))},
                {"q": q},
            )
        )

    # Initiation: the book of an empty step.
    qx = z3.Int("q_x")
    book = subject.open_book(p)
    init = AbsState(book.ledger, z3.IntVal(0), z3.IntVal(0), UNSCHEDULED, qx, None)
    inv0 = invariant(subject, cfg, init)
    empty: Any = z3.BoolVal(not book.charges)
    out.append(
        Query(
            "init: open",
            [*base, qx >= 1],
            {"C1": inv0.c1, "C2": z3.And(inv0.c2, inv0.shape, empty)},
        )
    )

    def step(label: str, pre: AbsState, extra: list[Any], post: AbsState, more: Any) -> None:
        inv = invariant(subject, cfg, pre)
        after = invariant(subject, cfg, post)
        shown = {
            "n": pre.n,
            "T": pre.t,
            "token_budget": pre.ledger.token_budget,
            "input_budget": pre.ledger.input_budget,
            "q_x": pre.q_x,
        }
        out.append(
            Query(
                label,
                [*base, inv.all(), *extra],
                {"C1": after.c1, "C2": z3.And(after.c2, after.shape, more)},
                shown,
            )
        )

    cap = policy.max_active_requests(p)
    for status in (UNSCHEDULED, SCHEDULED):
        # Schedule another request: the loop's guards, then grant and charge.
        pre = fresh_state("", status)
        bk = subject.book_at(p, pre.ledger, pre.charges())
        need = z3.Int("need")
        guards = [need >= 1, pre.count() < cap, as_bool(neg(bk.exhausted()))]
        granted = bk.grant(need)
        guards.append(granted >= 1)
        recorded = bk.schedule("o", granted)
        post = AbsState(bk.ledger, pre.n + 1, pre.t + granted, status, pre.q_x, bk.charges.get("x"))
        same = charge_eq(recorded, policy.charge(p, granted))
        ok = z3.And(as_bool(same), as_bool(charge_eq(bk.charges["o"], recorded)))
        step(
            f"schedule another request (x {_st(status)})",
            pre,
            [*guards, *_lemma_instances(subject, p, granted, pre.q_x)],
            post,
            ok,
        )

        # Preempt another scheduled request: the book refunds what it recorded for it.
        pre = fresh_state("", status)
        q_o = z3.Int("q_o")
        pre.others = {"o": policy.charge(p, q_o)}
        bk = subject.book_at(p, pre.ledger, pre.charges())
        refund = bk.preempt("o")
        post = AbsState(bk.ledger, pre.n - 1, pre.t - q_o, status, pre.q_x, bk.charges.get("x"))
        gone = z3.BoolVal("o" not in bk.charges)
        exact = as_bool(charge_eq(refund, policy.charge(p, q_o)))
        frame = [
            pre.n >= 1,
            q_o >= 1,
            q_o <= pre.t - (pre.n - 1),
            z3.Implies(pre.n == 1, q_o == pre.t),
        ]
        step(
            f"preempt another scheduled request (x {_st(status)})",
            pre,
            [*frame, *_lemma_instances(subject, p, q_o, pre.q_x)],
            post,
            z3.And(gone, exact),
        )

    # Schedule the tracked request x.
    pre = fresh_state("", UNSCHEDULED)
    bk = subject.book_at(p, pre.ledger, pre.charges())
    need = z3.Int("need")
    granted = bk.grant(need)
    guards = [need >= 1, pre.count() < cap, as_bool(neg(bk.exhausted())), granted >= 1]
    bk.schedule("x", granted)
    post = AbsState(bk.ledger, pre.n, pre.t, SCHEDULED, granted, bk.charges.get("x"))
    step(
        "schedule x", pre, [*guards, *_lemma_instances(subject, p, granted)], post, z3.BoolVal(True)
    )

    # Preempt x while scheduled: refund exactly the recorded charge, and forget it.
    pre = fresh_state("", SCHEDULED)
    bk = subject.book_at(p, pre.ledger, pre.charges())
    assert pre.book_x is not None
    refund = bk.preempt("x")
    post = AbsState(bk.ledger, pre.n, pre.t, REFUNDED, pre.q_x, bk.charges.get("x"))
    step(
        "preempt x while scheduled: refund its charge once",
        pre,
        _lemma_instances(subject, p, pre.q_x),
        post,
        as_bool(charge_eq(refund, pre.book_x)),
    )

    # Preempt x while the book holds no charge for it: nothing is refunded.
    for status, label in ((UNSCHEDULED, "never charged"), (REFUNDED, "already refunded")):
        pre = fresh_state("", status)
        bk = subject.book_at(p, pre.ledger, pre.charges())
        refund = bk.preempt("x")
        post = AbsState(bk.ledger, pre.n, pre.t, status, pre.q_x, bk.charges.get("x"))
        step(
            f"preempt x {label}: refund nothing",
            pre,
            [],
            post,
            as_bool(charge_eq(refund, Charge(0, 0))),
        )
    return out


def _st(status: int) -> str:
    return ("unscheduled", "scheduled", "refunded")[status]


def reach_queries(subject: Subject, layout_name: str) -> list[Query]:
    cfg = sym_config(layout_named(layout_name))
    p = cfg.p
    base = _base(subject, cfg)
    out: list[Query] = []
    book = subject.open_book(p)
    need = z3.Int("need")
    granted = book.grant(need)
    prem = [need >= 1, as_bool(neg(book.exhausted())), granted >= 1]
    book.schedule("a", granted)
    refund = book.preempt("a")
    out.append(
        Query(
            "schedule a request, preempt it, refund > 0",
            [*base, *prem, z3.Or(refund.tokens >= 1, refund.rows >= 1)],
            {"C2-reach-refund": None},
        )
    )

    needs = list(z3.Ints("need0 need1"))
    run = fcfs_step(subject, p, needs)
    cut = z3.Or(*(g < n for g, n in zip(run.granted, needs, strict=True)))
    under_cap = z3.And(run.count < cfg.m, run.count < subject.policy.max_active_requests(p))
    out.append(
        Query(
            "a step where the budget cuts a request short",
            [*base, *(n >= 1 for n in needs), cut, under_cap],
            {"C3-reach-budget-bound": None},
        )
    )
    return out


def c3_queries(subject: Subject, layout_name: str) -> list[Query]:
    layout = layout_named(layout_name)
    cfg = sym_config(layout)
    policy, p = subject.policy, cfg.p
    base = _base(subject, cfg)
    q = z3.Int("q")
    out = [
        Query(
            "lemma: true draft rows affine in q",
            [*base, q >= 1],
            {"C3": as_bool(affine_lemma(p.draft_rows, q))},
        )
    ]
    st = fresh_state("", UNSCHEDULED)
    inv = invariant(subject, cfg, st)
    opened = policy.open(p)
    d = true_draft_rows(cfg, st)
    shown = {"n": st.n, "T": st.t, "D": d, "opened_target": opened.token_budget}
    out.append(
        Query(
            "invariant implies the buffer peak bound",
            [*base, inv.all()],
            {"C3": c3_holds(cfg, opened.token_budget, st.target(), d)},
            shown,
        )
    )
    if subject.profile == "vllm-0.33" and layout_name in OWN_PASS_LAYOUTS:
        n, t = z3.Ints("n T")
        cap = floordiv(p.max_num_batched_tokens, policy.num_lookahead_tokens(p))
        draft = affine_sum(p.draft_rows, n, t)
        prem = [*base, n >= 0, t >= n, z3.Implies(n == 0, t == 0), n <= cap]
        out.append(
            Query(
                "n <= B // num_lookahead_tokens implies D <= B",
                prem,
                {"C3-static-cap": draft <= p.max_num_batched_tokens},
                {"n": n, "T": t, "D": draft},
            )
        )
    return out


def c4_queries(subject: Subject, layout_name: str) -> list[Query]:
    cfg = sym_config(layout_named(layout_name))
    policy, p = subject.policy, cfg.p
    base = _base(subject, cfg)
    need = z3.Int("need")
    book = subject.open_book(p)
    progress = z3.And(
        policy.max_active_requests(p) >= 1, as_bool(neg(book.exhausted())), book.grant(need) >= 1
    )
    out = [
        Query(
            "empty step of an accepted config grants a token",
            [*base, need >= 1],
            {"C4": progress},
            {"need": need},
        )
    ]

    st = fresh_state("", UNSCHEDULED)
    inv = invariant(subject, cfg, st)
    bk = subject.book_at(p, st.ledger, st.charges())
    prem = [
        *base,
        inv.all(),
        need >= 1,
        st.count() < policy.max_active_requests(p),
        as_bool(neg(bk.exhausted())),
    ]
    granted = bk.grant(need)
    out.append(
        Query(
            "not exhausted implies 1 <= grant <= need",
            prem,
            {"C4-no-stall": z3.And(granted >= 1, granted <= need)},
            {"n": st.n, "T": st.t, "need": need},
        )
    )

    fits = c3_holds(cfg, cfg.hard_target_cap(), 1, p.draft_rows(1))
    out.append(
        Query(
            "a config where one 1-token request fits is accepted",
            [*cfg.engine(), fits],
            {"C4-converse": accepted(subject, p)},
        )
    )
    return out


def c5_queries(subject: Subject, layout_name: str) -> list[Query]:
    cfg = sym_config(layout_named(layout_name))
    policy, p = subject.policy, cfg.p
    base = _base(subject, cfg)
    st = fresh_state("", UNSCHEDULED)
    inv = invariant(subject, cfg, st)
    bk = subject.book_at(p, st.ledger, st.charges())
    need = z3.Int("need")
    refused = z3.Or(st.count() >= policy.max_active_requests(p), as_bool(bk.exhausted()))
    got = z3.If(refused, 0, bk.grant(need))
    d = true_draft_rows(cfg, st)
    prem = [*base, inv.all(), st.count() < cfg.m, need >= 1, got < need]
    more = fits_hard_limits(cfg, st.target() + got + 1, d + p.draft_rows(got + 1), st.count() + 1)
    shown = {"n": st.n, "T": st.t, "D": d, "need": need, "granted": got}
    return [
        Query(
            "a request cut short could not take one more token", prem, {"C5": z3.Not(more)}, shown
        )
    ]


def c6_queries(hi: Subject, lo: Subject, layout_name: str) -> list[Query]:
    cfg = sym_config(layout_named(layout_name))
    p = cfg.p
    needs = list(z3.Ints(" ".join(f"need{i}" for i in range(C6_QUEUE))))
    length = z3.Int("queue_len")
    present = [length > i for i in range(C6_QUEUE)]
    run_hi = fcfs_step(hi, p, needs, present)
    run_lo = fcfs_step(lo, p, needs, present)
    prem = [
        *cfg.engine(),
        accepted(hi, p),
        accepted(lo, p),
        length >= 1,
        length <= C6_QUEUE,
        *(n >= 1 for n in needs),
    ]
    shown = {
        "T_" + hi.profile: run_hi.target,
        "T_" + lo.profile: run_lo.target,
        "n_" + hi.profile: run_hi.count,
        "n_" + lo.profile: run_lo.count,
    }
    return [
        Query(
            f"{hi.profile} vs {lo.profile} on one queue",
            prem,
            {
                f"C6-tokens-vs-{lo.profile}": run_hi.target >= run_lo.target,
                f"C6-requests-vs-{lo.profile}": run_hi.count >= run_lo.count,
            },
            shown,
        )
    ]


def family_queries(
    family: str, subjects: Mapping[str, Subject], profile: str, layout: str
) -> list[Query]:
    subject = subjects[profile]
    builders: dict[str, Callable[[Subject, str], list[Query]]] = {
        "inductive": inductive_queries,
        "reach": reach_queries,
        "C3": c3_queries,
        "C4": c4_queries,
        "C5": c5_queries,
    }
    if family == "C6":
        lower = lower_of(profile)
        assert lower is not None
        return c6_queries(subject, subjects[lower], layout)
    return builders[family](subject, layout)
