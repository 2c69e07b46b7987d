"""Whether two profiles can decide differently at all, within bounds on the config.

The reference scheduler asks a policy four things (docs/design.md §1.3): whether it
accepts the config, its cap on running requests (``max_active_requests``), and, inside a
step, whether the budgets are exhausted and how many tokens a request of ``need`` gets
(``grant``); preemption refunds exactly a request's charge (C2). Two profiles therefore
make the same decisions on every scenario when, for every config in the bounds:

1. they accept the same configs;
2. their ``max_active_requests`` are equal where both accept, or, on scenarios of at most
   ``Bounds.requests`` requests, both at or above that count (no cap there binds);
3. from any two *tied* lanes of one step (the same requests scheduled, each ledger the
   opening minus those charges: ``dominance.on_track``), one more request of any
   ``need >= 1`` gets the same grant and leaves the lanes tied (``dominance.serve``).

(3) covers every step of every run by induction over the step's requests, a preemption
included (it returns a lane to a tied, on-track state of one request fewer). Each is a z3
query, one per K of the bounds (K fixed keeps the formulas linear); ``unsat`` of every
negation proves the profiles equal, a model says which item separates them. The lanes'
charge sums use the affine identity of each charge, itself checked here as a lemma.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from dualbudget.spec.methods import layout_named

from .dominance import Relation, charge_lemmas, fresh_lane, on_track, opened_lane, serve, tied
from .model import Subject, accepted, affine_lemma, as_bool, charge_fields, sym_config
from .runner import base_subjects

SAME_TIMEOUT_MS = 10000


@dataclass(frozen=True)
class Bounds:
    b: tuple[int, int]
    m: tuple[int, int]
    k: tuple[int, int]
    requests: int | None = None
    """The most requests a scenario holds (None: no bound): a cap on running requests at
    or above it never binds, so caps that differ only there separate nothing."""


@dataclass(frozen=True)
class Separation:
    """A config on which z3 found the two profiles apart: where a search starts."""

    label: str
    k: int
    b: int
    max_num_seqs: int


@dataclass
class SameDecisions:
    equal: bool
    """True only when every query answered unsat."""
    reason: str
    """What separates the profiles (or ``unknown``), or what was proved."""
    separations: tuple[Separation, ...] = ()
    """Each separating item's config, as z3's model gave it."""


def same_decisions(a: str, b: str, layout_name: str, bounds: Bounds) -> SameDecisions:
    subjects = base_subjects()
    pair = (subjects[a], subjects[b])
    found: dict[str, str] = {}
    separations: list[Separation] = []
    for k in range(bounds.k[0], bounds.k[1] + 1):
        for label, formula in _separations(pair, layout_name, bounds, k):
            if label in found:
                continue
            solver = z3.Solver()
            solver.set("timeout", SAME_TIMEOUT_MS)
            solver.add(formula)
            answer = solver.check()
            if answer == z3.sat:
                tokens, seqs = _least(formula, solver.model())
                found[label] = f"{label} (K={k}, B={tokens}, max_num_seqs={seqs})"
                separations.append(Separation(label, k, tokens, seqs))
            elif answer == z3.unknown:
                found[label] = f"unknown: {label} (K={k}) timed out"
    if found:
        return SameDecisions(False, "; ".join(found.values()), tuple(separations))
    return SameDecisions(
        True,
        f"proved: {a} and {b} accept the same configs, cap running requests alike and grant"
        f" every request the same in every step on {layout_name}, for B in"
        f" {list(bounds.b)}, max_num_seqs in {list(bounds.m)}, K in {list(bounds.k)}",
    )


def _least(formula: z3.BoolRef, model: z3.ModelRef) -> tuple[int, int]:
    """The least B, then the least ``max_num_seqs``, that satisfy ``formula`` (``model``
    one that does): the model z3 picks depends on what its context solved before, the
    least does not, so a run's separating config is the same in every process. A check
    that times out counts as no, which keeps the answer a config that separates."""
    names = (z3.Int("B"), z3.Int("max_num_seqs"))

    def values(found: z3.ModelRef) -> list[int]:
        return [int(str(found.eval(name, model_completion=True))) for name in names]

    current = values(model)
    solver = z3.Solver()
    solver.set("timeout", SAME_TIMEOUT_MS)
    solver.add(formula)
    for i, name in enumerate(names):
        low, high = 0, current[i]
        while low < high:
            mid = (low + high) // 2
            solver.push()
            solver.add(name <= mid)
            if solver.check() == z3.sat:
                high, current = mid, values(solver.model())
            else:
                low = mid + 1
            solver.pop()
        solver.add(name == high)
    return current[0], current[1]


def _separations(
    pair: tuple[Subject, Subject], layout_name: str, bounds: Bounds, k: int
) -> list[tuple[str, z3.BoolRef]]:
    cfg = sym_config(layout_named(layout_name))
    p = cfg.p
    box = [
        *cfg.engine(),
        cfg.k == k,
        cfg.s == cfg.b,
        cfg.b >= bounds.b[0],
        cfg.b <= bounds.b[1],
        cfg.m >= bounds.m[0],
        cfg.m <= bounds.m[1],
    ]
    (sa, sb), relation = pair, Relation()
    both = [*box, accepted(sa, p), accepted(sb, p)]
    caps = (sa.policy.max_active_requests(p), sb.policy.max_active_requests(p))
    binds = [] if bounds.requests is None else [z3.Or(*(cap < bounds.requests for cap in caps))]
    out: list[tuple[str, z3.BoolRef]] = [
        ("they accept different configs", z3.And(*box, accepted(sa, p) != accepted(sb, p))),
        (
            "their caps on running requests (max_active_requests) differ",
            z3.And(*both, caps[0] != caps[1], *binds),
        ),
    ]
    q = z3.Int("q")
    for subject in pair:
        for name, f in charge_fields(subject, p).items():
            if name != "true draft rows":
                out.append(
                    (
                        f"{subject.profile}'s {name} is not affine in q",
                        z3.And(*both, q >= 1, z3.Not(as_bool(affine_lemma(f, q)))),
                    )
                )
    lanes = (fresh_lane("a"), fresh_lane("b"))
    opened = (opened_lane(sa, p), opened_lane(sb, p))
    need = z3.Int("need")
    (next_a, got_a), (next_b, got_b) = serve(sa, p, lanes[0], need), serve(sb, p, lanes[1], need)
    premises = [
        *both,
        on_track(sa, cfg, lanes[0], relation),
        on_track(sb, cfg, lanes[1], relation),
        tied(*lanes),
        need >= 1,
        *charge_lemmas(sa, p, got_a).values(),
        *charge_lemmas(sb, p, got_b).values(),
    ]
    out.append(
        (
            "the opened books are not tied",
            z3.And(*both, z3.Not(tied(*opened))),
        )
    )
    separate = z3.Or(got_a != got_b, as_bool(next_a.going) != as_bool(next_b.going))
    out.append(
        ("one request is granted differently in the same step state", z3.And(*premises, separate))
    )
    return out
