"""The obligations: one per (profile, layout, contract item), each a list of z3 queries.

A query is a list of premises and, per check, a goal. A check holds when every query it
appears in has satisfiable premises (non-vacuity) and ``premises and not goal`` is
unsatisfiable. A reachability check has no goal: it holds when its premises are
satisfiable. Queries are built by running the spec's code on symbolic configurations
(see ``model``); nothing here restates a budget rule.

Each contract item is stated once, in ``spec/contract.py``, and written once as a
predicate over ``arith`` in ``spec/invariants.py``; the queries evaluate those predicates
on the spec's code run symbolically, and proofs/README.md gives each as a formula. The
families (``check`` names; ``contract`` is the item a check belongs to):

- ``C1``, ``C2`` (``inductive_queries``): ``nonnegative`` and ``conserved`` hold after
  ``open`` and are kept by every transition of the book; ``C2-reach-refund``
  (``reach_queries``) is a refund that can happen.
- ``C3``, ``C3-static-cap`` (``c3_queries``): ``buffer_peak_ok`` with the method's true
  draft rows; ``C3-reach-budget-bound`` a step the budget cuts short.
- ``C4``, ``C4-no-stall``, ``C4-converse`` (``c4_queries``): ``empty_step_progress``,
  ``no_stall`` in every step not exhausted, and ``one_token_fits`` implying acceptance.
- ``C5`` (``c5_queries``): ``one_more_token_fits`` is false of a request cut short.
- ``C6-tokens-vs-X``, ``C6-requests-vs-X`` (``c6_queries``): ``dominates`` against the
  next profile ``X`` down the chain dual > vllm-0.33 > vllm-0.32 > global-reserve (an
  upstream proposal: against the profile ``BRANCHES`` names), proven by induction over
  the queue (``dominance``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import z3

from dualbudget.spec.arith import floordiv
from dualbudget.spec.invariants import (
    empty_step_progress,
    no_stall,
    one_more_token_fits,
    one_token_fits,
)
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import Charge
from dualbudget.spec.profiles import PROFILE_NAMES, PROFILES

from .dominance import (
    MEASURES,
    Lane,
    Relation,
    ahead,
    charge_lemmas,
    fresh_lane,
    lower_done,
    on_track,
    opened_lane,
    related,
    serve,
    tied,
)
from .model import (
    REFUNDED,
    SCHEDULED,
    STATUS_NAMES,
    UNSCHEDULED,
    AbsState,
    Subject,
    SymConfig,
    accepted,
    affine_lemma,
    affine_sum,
    as_bool,
    c3_holds,
    charge_eq,
    charge_fields,
    fcfs_step,
    fresh_state,
    invariant,
    neg,
    sym_config,
    true_draft_rows,
)

# The dominance chain, from the most relaxed policy down; C6 compares each with the next.
CHAIN = ("dual", "vllm-0.33", "vllm-0.32", "global-reserve")
BRANCHES = {
    "pr-53080": "vllm-0.33",
    "pr-52996": "vllm-0.32",
    "fork-605": "pr-52996",
    "vllm-0.34": "vllm-0.33",
}
"""The upstream proposals off the chain, each with the profile it claims to relax: no one
order holds them all (pr-52996 changes DSpark only, so on DFlash it is vllm-0.32)."""
C6_QUEUE = 8
"""The queue length of C6's witness search and of the bounded cross-check of the proof
(tests/unit/test_proofs_dominance.py); the proof itself holds for queues of any length."""
C5_WITNESS_QUEUE = 3
OWN_PASS_LAYOUTS = ("dflash", "dspark-anchor", "dspark-fill-in")


@dataclass(frozen=True)
class Obligation:
    profile: str
    layout: str
    check: str
    family: str
    """Obligations of one family share their queries (one job)."""
    contract: str
    """The contract item the check proves (``C1`` .. ``C6``, ``spec/contract.py``)."""
    inductive: bool = True
    """Proven for any number of requests, not for queues up to a bound: C1/C2 and C6 by
    induction, C3-C5 from the inductive invariant. No obligation is bounded since C6's
    induction (proofs/dominance.py); a bounded one would say False here."""

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
    if profile in BRANCHES:
        return BRANCHES[profile]
    i = CHAIN.index(profile)
    return CHAIN[i + 1] if i + 1 < len(CHAIN) else None


def catalog() -> list[Obligation]:
    """Every obligation of the suite, in a stable order."""
    out: list[Obligation] = []
    for profile in PROFILE_NAMES:
        # A profile's release builds only some drafters (0.34: no parallel EAGLE, PARD
        # or ngram): nothing to prove of a config it refuses.
        for layout in PROFILES[profile].release.layouts:
            out += [
                Obligation(profile, layout, "C1", "inductive", "C1"),
                Obligation(profile, layout, "C2", "inductive", "C2"),
                Obligation(profile, layout, "C2-reach-refund", "reach", "C2"),
                Obligation(profile, layout, "C3", "C3", "C3"),
                Obligation(profile, layout, "C3-reach-budget-bound", "reach", "C3"),
            ]
            if PROFILES[profile].policy.caps_own_pass_admission and layout in OWN_PASS_LAYOUTS:
                out.append(Obligation(profile, layout, "C3-static-cap", "C3", "C3"))
            out += [
                Obligation(profile, layout, "C4", "C4", "C4"),
                Obligation(profile, layout, "C4-no-stall", "C4", "C4"),
                Obligation(profile, layout, "C4-converse", "C4", "C4"),
                Obligation(profile, layout, "C5", "C5", "C5"),
            ]
            lower = lower_of(profile)
            if lower is not None:
                out += [
                    Obligation(profile, layout, f"C6-tokens-vs-{lower}", "C6", "C6"),
                    Obligation(profile, layout, f"C6-requests-vs-{lower}", "C6", "C6"),
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
    """C1 and C2 by induction: the charge lemmas, the empty book (initiation), then one
    query per transition of the book from any state the invariant allows."""
    cfg = sym_config(layout_named(layout_name))
    base = _base(subject, cfg)
    out = _charge_lemma_queries(subject, cfg, base)
    out.append(_init_query(subject, cfg, base))
    for status in (UNSCHEDULED, SCHEDULED):
        out.append(_schedule_another(subject, cfg, base, status))
        out.append(_preempt_another(subject, cfg, base, status))
    out.append(_schedule_x(subject, cfg, base))
    out.append(_preempt_x_scheduled(subject, cfg, base))
    for status, label in ((UNSCHEDULED, "never charged"), (REFUNDED, "already refunded")):
        out.append(_preempt_x_uncharged(subject, cfg, base, status, label))
    return out


def _charge_lemma_queries(subject: Subject, cfg: SymConfig, base: list[Any]) -> list[Query]:
    """Each charged field is affine in ``q`` (the lemma the transitions instantiate)."""
    q = z3.Int("q")
    return [
        Query(
            f"lemma: {label} affine in q",
            [*base, q >= 1],
            {"C2": as_bool(affine_lemma(f, q))},
            {"q": q},
        )
        for label, f in charge_fields(subject, cfg.p).items()
        if label != "true draft rows"
    ]


def _init_query(subject: Subject, cfg: SymConfig, base: list[Any]) -> Query:
    """Initiation: the book of an empty step keeps the invariant."""
    qx = z3.Int("q_x")
    book = subject.open_book(cfg.p)
    init = AbsState(book.ledger, z3.IntVal(0), z3.IntVal(0), UNSCHEDULED, qx, None)
    inv0 = invariant(subject, cfg, init)
    empty: Any = z3.BoolVal(not book.charges)
    return Query(
        "init: open",
        [*base, qx >= 1],
        {"C1": inv0.c1, "C2": z3.And(inv0.c2, inv0.shape, empty)},
    )


def _step_query(
    subject: Subject,
    cfg: SymConfig,
    base: list[Any],
    label: str,
    pre: AbsState,
    extra: list[Any],
    post: AbsState,
    more: Any,
) -> Query:
    """One transition from ``pre`` (the invariant and ``extra`` assumed) to ``post``: the
    invariant holds after it, and so does ``more``."""
    inv = invariant(subject, cfg, pre)
    after = invariant(subject, cfg, post)
    shown = {
        "n": pre.n,
        "T": pre.t,
        "token_budget": pre.ledger.token_budget,
        "input_budget": pre.ledger.input_budget,
        "q_x": pre.q_x,
    }
    return Query(
        label,
        [*base, inv.all(), *extra],
        {"C1": after.c1, "C2": z3.And(after.c2, after.shape, more)},
        shown,
    )


def _schedule_another(subject: Subject, cfg: SymConfig, base: list[Any], status: int) -> Query:
    """Schedule another request: the loop's guards, then grant and charge."""
    policy, p = subject.policy, cfg.p
    pre = fresh_state("", status)
    bk = subject.book_at(p, pre.ledger, pre.charges())
    need = z3.Int("need")
    guards = [need >= 1, pre.count() < policy.max_active_requests(p), as_bool(neg(bk.exhausted()))]
    granted = bk.grant(need)
    guards.append(granted >= 1)
    recorded = bk.schedule("o", granted)
    post = AbsState(bk.ledger, pre.n + 1, pre.t + granted, status, pre.q_x, bk.charges.get("x"))
    same = charge_eq(recorded, policy.charge(p, granted))
    ok = z3.And(as_bool(same), as_bool(charge_eq(bk.charges["o"], recorded)))
    return _step_query(
        subject,
        cfg,
        base,
        f"schedule another request (x {_st(status)})",
        pre,
        [*guards, *_lemma_instances(subject, p, granted, pre.q_x)],
        post,
        ok,
    )


def _preempt_another(subject: Subject, cfg: SymConfig, base: list[Any], status: int) -> Query:
    """Preempt another scheduled request: the book refunds what it recorded for it."""
    policy, p = subject.policy, cfg.p
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
    return _step_query(
        subject,
        cfg,
        base,
        f"preempt another scheduled request (x {_st(status)})",
        pre,
        [*frame, *_lemma_instances(subject, p, q_o, pre.q_x)],
        post,
        z3.And(gone, exact),
    )


def _schedule_x(subject: Subject, cfg: SymConfig, base: list[Any]) -> Query:
    """Schedule the tracked request x."""
    policy, p = subject.policy, cfg.p
    pre = fresh_state("", UNSCHEDULED)
    bk = subject.book_at(p, pre.ledger, pre.charges())
    need = z3.Int("need")
    granted = bk.grant(need)
    cap = policy.max_active_requests(p)
    guards = [need >= 1, pre.count() < cap, as_bool(neg(bk.exhausted())), granted >= 1]
    bk.schedule("x", granted)
    post = AbsState(bk.ledger, pre.n, pre.t, SCHEDULED, granted, bk.charges.get("x"))
    extra = [*guards, *_lemma_instances(subject, p, granted)]
    return _step_query(subject, cfg, base, "schedule x", pre, extra, post, z3.BoolVal(True))


def _preempt_x_scheduled(subject: Subject, cfg: SymConfig, base: list[Any]) -> Query:
    """Preempt x while scheduled: refund exactly the recorded charge, and forget it."""
    pre = fresh_state("", SCHEDULED)
    bk = subject.book_at(cfg.p, pre.ledger, pre.charges())
    assert pre.book_x is not None
    refund = bk.preempt("x")
    post = AbsState(bk.ledger, pre.n, pre.t, REFUNDED, pre.q_x, bk.charges.get("x"))
    return _step_query(
        subject,
        cfg,
        base,
        "preempt x while scheduled: refund its charge once",
        pre,
        _lemma_instances(subject, cfg.p, pre.q_x),
        post,
        as_bool(charge_eq(refund, pre.book_x)),
    )


def _preempt_x_uncharged(
    subject: Subject, cfg: SymConfig, base: list[Any], status: int, label: str
) -> Query:
    """Preempt x while the book holds no charge for it: nothing is refunded."""
    pre = fresh_state("", status)
    bk = subject.book_at(cfg.p, pre.ledger, pre.charges())
    refund = bk.preempt("x")
    post = AbsState(bk.ledger, pre.n, pre.t, status, pre.q_x, bk.charges.get("x"))
    return _step_query(
        subject,
        cfg,
        base,
        f"preempt x {label}: refund nothing",
        pre,
        [],
        post,
        as_bool(charge_eq(refund, Charge(0, 0))),
    )


def _st(status: int) -> str:
    return STATUS_NAMES[status]


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
    if policy.caps_own_pass_admission and layout_name in OWN_PASS_LAYOUTS:
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
    progress = as_bool(empty_step_progress(book, need))
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
    out.append(
        Query(
            "not exhausted implies 1 <= grant <= need",
            prem,
            {"C4-no-stall": as_bool(no_stall(bk, need))},
            {"n": st.n, "T": st.t, "need": need},
        )
    )

    fits = as_bool(one_token_fits(p))
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
    more = as_bool(one_more_token_fits(p, st.target(), d, st.count(), got))
    shown = {"n": st.n, "T": st.t, "D": d, "need": need, "granted": got}
    return [
        Query(
            "a request cut short could not take one more token", prem, {"C5": z3.Not(more)}, shown
        )
    ]


def _c6_step(
    pair: tuple[Subject, Subject],
    cfg: SymConfig,
    base: list[Any],
    relation: Relation,
    label: str,
    lanes: tuple[Lane, Lane],
    extra: list[Any],
    checks: dict[str, str],
) -> Query:
    """One more request served by both profiles from ``lanes`` (``extra`` assumed): the
    relation holds after it for each measure of ``checks`` (measure to check name)."""
    hi, lo = pair
    p = cfg.p
    hi_lane, lo_lane = lanes
    need = z3.Int("need")
    hi_next, hi_got = serve(hi, p, hi_lane, need)
    lo_next, lo_got = serve(lo, p, lo_lane, need)
    premises = [
        *base,
        on_track(hi, cfg, hi_lane, relation),
        on_track(lo, cfg, lo_lane, relation),
        *extra,
        need >= 1,
        *charge_lemmas(hi, p, hi_got).values(),
        *charge_lemmas(lo, p, lo_got).values(),
    ]
    after = (hi_next, lo_next)
    goals = {check: related(m, pair, cfg, after, relation) for m, check in checks.items()}
    shown = {
        f"n_{hi.profile}": hi_lane.n,
        f"T_{hi.profile}": hi_lane.t,
        f"n_{lo.profile}": lo_lane.n,
        f"T_{lo.profile}": lo_lane.t,
        "need": need,
        f"granted_{hi.profile}": hi_got,
        f"granted_{lo.profile}": lo_got,
    }
    return Query(label, premises, goals, shown)


def c6_queries(
    hi: Subject, lo: Subject, layout_name: str, relation: Relation | None = None
) -> list[Query]:
    """C6 by induction over the queue (``proofs/dominance.py``): base, step from a tied
    state, step once ``lo`` is done, and the relation implying dominance; ``relation``
    picks the strengthenings (all of them unless a test asks for less)."""
    if relation is None:
        relation = Relation()
    cfg = sym_config(layout_named(layout_name))
    p = cfg.p
    pair = (hi, lo)
    base = [*cfg.engine(), accepted(hi, p), accepted(lo, p)]
    checks = {measure: f"C6-{measure}-vs-{lo.profile}" for measure in MEASURES}
    out: list[Query] = []

    q = z3.Int("q")
    for subject in pair:
        for field_name, lemma in charge_lemmas(subject, p, q).items():
            label = f"lemma: {subject.profile} {field_name} affine in q"
            out.append(Query(label, [*base, q >= 1], dict.fromkeys(checks.values(), lemma)))

    opened = (opened_lane(hi, p), opened_lane(lo, p))
    out.append(
        Query(
            "base: the opened books are tied",
            base,
            {check: related(m, pair, cfg, opened, relation) for m, check in checks.items()},
        )
    )

    def step(
        label: str, lanes: tuple[Lane, Lane], extra: list[Any], measures: tuple[str, ...]
    ) -> None:
        goals = {m: checks[m] for m in measures}
        out.append(_c6_step(pair, cfg, base, relation, label, lanes, extra, goals))

    lanes = (fresh_lane("hi"), fresh_lane("lo"))
    step("step: one more request from a tied state", lanes, [tied(*lanes)], MEASURES)
    for measure in MEASURES:
        lanes = (fresh_lane("hi"), fresh_lane("lo"))
        done = lower_done(lo, p, lanes[1], relation)
        step(
            f"step: one more request once {lo.profile} is done ({measure})",
            lanes,
            [done, ahead(measure, *lanes)],
            (measure,),
        )

    lanes = (fresh_lane("hi"), fresh_lane("lo"))
    for measure, check in checks.items():
        out.append(
            Query(
                f"conclusion: the relation implies {measure} dominance",
                [*base, related(measure, pair, cfg, lanes, relation)],
                {check: ahead(measure, *lanes)},
            )
        )
    return out


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
