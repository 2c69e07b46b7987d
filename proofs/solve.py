"""Deciding queries: non-vacuity first, then the negated goal, each under a timeout.

``unknown`` (a timeout included) is never a pass: a check with an unknown query gets the
verdict ``unknown``, which matches no manifest entry and so fails the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from .obligations import Query

QUERY_TIMEOUT_MS = 5000
"""Per-query z3 timeout; a query that needs longer is ``unknown``, i.e. a failure."""
PRODUCT_HINT_BOUND = 9
"""Products ``x * y`` of two variables (``max_num_seqs * K`` in the global reserve) get
monotonicity lemmas ``x >= j -> x*y >= j*y`` and ``0 <= x <= j -> x*y <= j*y`` for
``j <= 9`` (one more than the C6 queue); see ``_abstract_products``."""


def _nonlinear_products(exprs: Sequence[Any]) -> list[Any]:
    return [
        e
        for e in subterms(exprs)
        if z3.is_mul(e) and sum(not z3.is_int_value(c) for c in e.children()) >= 2
    ]


def subterms(exprs: Sequence[Any]) -> Iterator[Any]:
    """Every distinct subterm of ``exprs`` (shared subterms once)."""
    seen: set[int] = set()
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        yield e
        stack.extend(e.children())


def _abstract_products(exprs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Replace each product of two variable terms by a fresh integer ``P`` constrained by
    valid monotonicity lemmas. The result is implied by the original (every lemma holds
    of ``P = x * y``), so *unsat* of the abstraction proves the original unsat; a *sat*
    answer may be spurious and is re-decided on the original formula."""
    simplified = [z3.simplify(e) for e in exprs]
    products = _nonlinear_products(simplified)
    if not products:
        return list(exprs), []
    pairs, lemmas = [], []
    for i, product in enumerate(products):
        x, *rest = product.children()
        y = rest[0] if len(rest) == 1 else z3.simplify(z3.Product(*rest))
        fresh = z3.Int(f"__product{i}")
        pairs.append((product, fresh))
        for a, b in ((x, y), (y, x)):
            for j in range(PRODUCT_HINT_BOUND + 1):
                lemmas.append(z3.Implies(z3.And(a >= j, b >= 0), fresh >= j * b))
                lemmas.append(z3.Implies(z3.And(a >= 0, a <= j, b >= 0), fresh <= j * b))
    return [z3.substitute(e, *pairs) for e in simplified], lemmas


@dataclass
class CheckResult:
    check: str
    verdict: str = "holds"
    """``holds``, ``fails`` or ``unknown``."""
    nonvacuous: bool = True
    reasons: list[str] = field(default_factory=list)
    counterexample: dict[str, str] | None = None
    seconds: float = 0.0


def _model_values(model: z3.ModelRef, shown: dict[str, Any]) -> dict[str, str]:
    values: dict[str, str] = {}
    for decl in sorted(model.decls(), key=lambda d: d.name()):
        if decl.arity() == 0 and not decl.name().startswith("__"):
            values[decl.name()] = str(model[decl])
    for label, term in shown.items():
        values[label] = str(model.eval(term, model_completion=True))
    return values


def _worse(a: str, b: str) -> str:
    order = {"holds": 0, "unknown": 1, "fails": 2}
    return a if order[a] >= order[b] else b


def _refute(premises: Sequence[Any], goal: Any, timeout_ms: int) -> Any:
    """``premises and not goal`` on the product abstraction: unsat proves the goal."""
    abstracted, lemmas = _abstract_products([*premises, z3.Not(goal)])
    if not lemmas:
        return z3.unknown
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(*abstracted[:-1], *lemmas)
    # Incremental mode (check, push, check) is markedly faster on these formulas.
    if solver.check() != z3.sat:
        return z3.unknown
    solver.push()
    solver.add(abstracted[-1])
    return solver.check()


RETRY_SEEDS = (1, 2)
"""On ``unknown`` a query is tried again on a fresh solver with these random seeds (each
under the same timeout); it is ``unknown`` only when every try is."""


def _check(assertions: Sequence[Any], timeout_ms: int, seed: int = 0) -> tuple[Any, Any]:
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.set("random_seed", seed)
    solver.add(*assertions)
    answer = solver.check()
    return answer, solver


def _decide_goal(
    premises: Sequence[Any], goal: Any, solver: z3.Solver, timeout_ms: int
) -> tuple[Any, Any, str]:
    """``premises and not goal``: (answer, model or None, reason when unknown)."""
    if _refute(premises, goal, timeout_ms) == z3.unsat:
        return z3.unsat, None, ""
    solver.push()
    solver.add(z3.Not(goal))
    answer = solver.check()
    model = solver.model() if answer == z3.sat else None
    reason = solver.reason_unknown() if answer == z3.unknown else ""
    solver.pop()
    for seed in RETRY_SEEDS:
        if answer != z3.unknown:
            break
        answer, retry = _check([*premises, z3.Not(goal)], timeout_ms, seed)
        model = retry.model() if answer == z3.sat else None
        reason = retry.reason_unknown() if answer == z3.unknown else ""
    return answer, model, reason


def decide(queries: Sequence[Query], timeout_ms: int = QUERY_TIMEOUT_MS) -> dict[str, CheckResult]:
    """Run every query; return one result per check named in them."""
    results: dict[str, CheckResult] = {}
    for query in queries:
        started = time.perf_counter()
        premises, solver = _check(query.premises, timeout_ms)
        for seed in RETRY_SEEDS:
            if premises != z3.unknown:
                break
            premises, solver = _check(query.premises, timeout_ms, seed)
        spent = time.perf_counter() - started
        for check, goal in query.goals.items():
            result = results.setdefault(check, CheckResult(check))
            t0 = time.perf_counter()
            if premises == z3.unknown:
                result.verdict = _worse(result.verdict, "unknown")
                result.reasons.append(
                    f"{query.label}: premises unknown ({solver.reason_unknown()})"
                )
            elif premises == z3.unsat:
                result.nonvacuous = False
                result.verdict = "fails"
                result.reasons.append(f"{query.label}: premises unsatisfiable (vacuous)")
            elif goal is not None:
                answer, model, reason = _decide_goal(query.premises, goal, solver, timeout_ms)
                if answer == z3.sat:
                    result.verdict = "fails"
                    result.reasons.append(f"{query.label}: counterexample")
                    if result.counterexample is None:
                        result.counterexample = _model_values(model, query.shown)
                elif answer == z3.unknown:
                    result.verdict = _worse(result.verdict, "unknown")
                    result.reasons.append(f"{query.label}: unknown ({reason})")
            result.seconds += spent / len(query.goals) + (time.perf_counter() - t0)
    return results
