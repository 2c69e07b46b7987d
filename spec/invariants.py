"""The contract items C1-C6 as predicates over one step (the items' statements:
``contract.CONTRACT``).

Each predicate is written over ``arith`` and returns a condition (a bool, or a z3 term in
a proof), so that the proofs' obligations and the reference's per-step check evaluate the
same function: C1 ``nonnegative``, C2 ``conserved``, C3 ``buffer_peak_ok``, C4
``empty_step_progress`` and ``no_stall`` (and ``one_token_fits``, its converse), C5
``one_more_token_fits``, C6 ``dominates``. ``step_violations`` evaluates the safety items
C1-C3 on a finished concrete step and says which broke; C4-C6 speak of what a step could
have done, so only the proofs (and the tests) evaluate them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .arith import Cond, Num, all_of, imin, ite
from .book import StepBook
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


def within_hard_limits(p: StepParams, target_rows: Num, draft_rows: Num, num_requests: Num) -> Cond:
    """The hard limits of a step, whatever the policy (C4, C5): C3 against ``min(S, B)``
    and ``B``, and at most ``max_num_seqs`` requests."""
    hard_target_cap = imin(p.max_num_scheduled_tokens, p.max_num_batched_tokens)
    return all_of(
        buffer_peak_ok(p, hard_target_cap, target_rows, draft_rows),
        num_requests <= p.max_num_seqs,
    )


def empty_step_progress(book: StepBook, need: Num) -> Cond:
    """C4 progress: the empty step ``book`` (just opened, on a config the policy accepts)
    allows a running request, is not exhausted, and grants a runnable request that needs
    ``need >= 1`` tokens at least one of them."""
    policy, p = book.policy, book.params
    return all_of(
        policy.max_active_requests(p) >= 1,
        ite(book.exhausted(), False, True),
        book.grant(need) >= 1,
    )


def no_stall(book: StepBook, need: Num) -> Cond:
    """C4 progress, within a step: a book that is not exhausted, asked for a request the
    step may still take (fewer than ``max_active_requests`` scheduled) that needs ``need
    >= 1`` tokens, grants it between one and ``need`` of them. So a step ends only where
    ``exhausted`` or the request cap says so, never on a grant of 0 (vLLM asserts
    ``num_new_tokens > 0`` once its stop checks pass)."""
    granted = book.grant(need)
    return all_of(granted >= 1, granted <= need)


def one_token_fits(p: StepParams) -> Cond:
    """C4, its converse: one request scheduled with one token keeps the hard limits
    (``T = 1``, ``D = C(1)``). A policy that refuses such a config refuses more than the
    contract needs."""
    return within_hard_limits(p, 1, p.draft_rows(1), 1)


def one_more_token_fits(
    p: StepParams, target_rows: Num, draft_rows: Num, num_requests: Num, granted: Num
) -> Cond:
    """C5 tightness: a request granted ``granted`` tokens (0: not scheduled) could have
    taken one more within the hard limits, ``target_rows``, ``draft_rows`` and
    ``num_requests`` being what the rest of the step holds. C5 demands this be false of
    every request granted fewer tokens than it needs."""
    return within_hard_limits(
        p, target_rows + granted + 1, draft_rows + p.draft_rows(granted + 1), num_requests + 1
    )


@dataclass(frozen=True)
class Violation:
    contract: str
    message: str


@dataclass(slots=True)
class StepTotals:
    """What a finished step adds up to, from the tokens each request was scheduled.
    (Made once per reference step: slots, not frozen, for the cost of a frozen init.)"""

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
    # A step's requests share few distinct q (decodes all take 1 + K): count them first
    # (``list.count`` per distinct q beats building a Counter at these sizes).
    qs = list(scheduled.values())
    for q in set(qs):
        count = qs.count(q)
        of_q = per_q.get(q)
        if of_q is None:
            charge = policy.charge(p, q)
            of_q = per_q[q] = (charge.tokens, charge.rows, p.draft_rows(q))
        target_rows += count * q
        tokens += count * of_q[0]
        rows += count * of_q[1]
        draft_rows += count * of_q[2]
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


def dominates(measure: str, hi_tokens: Num, hi_count: Num, lo_tokens: Num, lo_count: Num) -> Cond:
    """C6 dominance: on the same queue in the same order, the step of the policy that
    relaxes another schedules at least as many target tokens (``measure="tokens"``: ``T``)
    or at least as many requests (``measure="requests"``) as the other's step."""
    if measure == "tokens":
        return hi_tokens >= lo_tokens
    if measure == "requests":
        return hi_count >= lo_count
    raise ValueError(f"unknown C6 measure {measure!r}")
