"""The contract items C1-C3 as predicates over one step.

Each predicate is written over ``arith`` and returns a condition (a bool, or a z3 term in
a proof); ``step_violations`` evaluates all three on a concrete step and says which broke.
"""

from __future__ import annotations

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


def step_violations(
    policy: Policy,
    p: StepParams,
    ledger: Ledger,
    scheduled: Mapping[str, int],
    charges: Mapping[str, Charge],
) -> list[Violation]:
    """C1-C3 on a finished step: ``scheduled`` maps request id to target tokens,
    ``charges`` what the ledger holds charged for each of them.

    Concrete only (ints), run by the reference after every step, so written for speed:
    the policy's charge and ``C(q)`` are functions of ``q`` alone, evaluated once per
    distinct ``q`` of the step.
    """
    opened = policy.open(p)
    found = []
    if not nonnegative(ledger):
        found.append(Violation("C1", f"negative budget: {ledger}"))
    if charges.keys() != scheduled.keys():
        found.append(
            Violation("C2", f"charged {sorted(charges)} but scheduled {sorted(scheduled)}")
        )
    draft_rows: Num = 0
    rows_of: dict[int, Num] = {}
    for q in scheduled.values():
        rows_q = rows_of.get(q)
        if rows_q is None:
            rows_q = rows_of[q] = p.draft_rows(q)
        draft_rows += rows_q
    charge_of: dict[int, Charge] = {}
    wrong = {}
    tokens: Num = 0
    rows: Num = 0
    for rid, c in charges.items():
        tokens += c.tokens
        rows += c.rows
        # The policy's charge of what ``rid`` was scheduled, None when it was not.
        q_charged = scheduled.get(rid)
        if q_charged is None:
            e = None
        else:
            e = charge_of.get(q_charged)
            if e is None:
                e = charge_of[q_charged] = policy.charge(p, q_charged)
        # ``e != c`` decides; the field comparison only spares the dataclass ``__eq__``
        # when both are the same class with equal fields (then ``e == c``).
        if (
            e is None or type(e) is not type(c) or e.tokens != c.tokens or e.rows != c.rows
        ) and e != c:
            wrong[rid] = c
    if wrong:
        found.append(Violation("C2", f"charges differ from the policy's: {wrong}"))
    if not conserved(opened, ledger, tokens, rows):
        found.append(
            Violation("C2", f"ledger {ledger} != opened {opened} minus charged ({tokens}, {rows})")
        )
    target_rows = sum(scheduled.values())
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
