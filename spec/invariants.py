"""The contract items C1-C3 as predicates over one step.

Each predicate is written over ``arith`` and returns a condition (a bool, or a z3 term in
a proof); ``step_violations`` evaluates all three on a concrete step and says which broke.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from .arith import Cond, Num, all_of, imin
from .policies import Charge, Ledger, Policy, StepParams


def nonnegative(ledger: Ledger) -> Cond:
    """C1 nonnegative: every budget the policy keeps is ``>= 0``."""
    return all_of(ledger.token_budget >= 0, ledger.input_budget >= 0)


def conserved(opened: Ledger, ledger: Ledger, charged_tokens: Num, charged_rows: Num) -> Cond:
    """C2 conservation: each budget is its opening value minus what the scheduled
    requests were charged (a refunded request no longer counts among them)."""
    return all_of(
        ledger.token_budget == opened.token_budget - charged_tokens,
        ledger.input_budget == opened.input_budget - charged_rows,
    )


def buffer_peak_ok(p: StepParams, target_cap: Num, target_rows: Num, draft_rows: Num) -> Cond:
    """C3 buffer peak: ``T <= S``, ``T <= B`` and ``D <= B``, so ``max(T, D) <= B``.

    ``target_cap`` is ``S`` as the policy opened its token budget; ``draft_rows`` must be
    the method's true ``D = sum C(q_i)``, never the policy's own charge.
    """
    b = p.max_num_batched_tokens
    return all_of(
        target_rows <= target_cap,
        target_rows <= imin(p.max_num_scheduled_tokens, b),
        draft_rows <= b,
    )


@dataclass(frozen=True)
class Violation:
    contract: str
    message: str


@dataclass(frozen=True)
class StepTotals:
    """What a finished step adds up to, from the tokens each request was scheduled."""

    target_rows: int
    """``T``: the target forward's rows, the scheduled target tokens."""
    draft_rows: int
    """``D = sum C(q_i)``: the method's true draft input rows, never a policy's charge."""
    charged: Charge
    """What the policy charges for all of it: the sum of ``charge(q_i)``."""


def step_totals(
    policy: Policy,
    p: StepParams,
    scheduled: Mapping[str, int],
    per_q: dict[int, tuple[int, int, int]] | None = None,
) -> StepTotals:
    """``T``, ``D`` and the charges of a concrete step.

    Run by the reference after every step, so written for speed: the policy's charge and
    ``C(q)`` are functions of ``q`` alone, evaluated once per distinct ``q`` (and kept in
    ``per_q`` across the steps of one config, when the caller passes it).
    """
    if per_q is None:
        per_q = {}
    target_rows = tokens = rows = draft_rows = 0
    for q, n in Counter(scheduled.values()).items():
        of_q = per_q.get(q)
        if of_q is None:
            charge = policy.charge(p, q)
            of_q = per_q[q] = (charge.tokens, charge.rows, p.draft_rows(q))
        target_rows += n * q
        tokens += n * of_q[0]
        rows += n * of_q[1]
        draft_rows += n * of_q[2]
    return StepTotals(target_rows, draft_rows, Charge(tokens, rows))


def step_violations(
    policy: Policy, p: StepParams, ledger: Ledger, totals: StepTotals
) -> list[Violation]:
    """C1-C3 on a finished concrete step: ``ledger`` is what the step's budgets ended at,
    ``totals`` what its scheduled requests add up to (``step_totals``).

    C2 compares the ledger with the policy's own ``open`` and ``charge``, so it also
    checks whoever moved the ledger (the reference's compiled kernel) against the spec.
    """
    opened = policy.open(p)
    found = []
    if not nonnegative(ledger):
        found.append(Violation("C1", f"negative budget: {ledger}"))
    charged = totals.charged
    if not conserved(opened, ledger, charged.tokens, charged.rows):
        found.append(
            Violation(
                "C2",
                f"ledger {ledger} != opened {opened} minus charged"
                f" ({charged.tokens}, {charged.rows})",
            )
        )
    target_rows, draft_rows = totals.target_rows, totals.draft_rows
    if not buffer_peak_ok(p, opened.token_budget, target_rows, draft_rows):
        found.append(
            Violation(
                "C3",
                f"buffer peak: T={target_rows} D={draft_rows} target_cap={opened.token_budget}"
                f" max_num_scheduled_tokens={p.max_num_scheduled_tokens}"
                f" max_num_batched_tokens={p.max_num_batched_tokens}",
            )
        )
    return found
