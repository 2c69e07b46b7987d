"""Buggy twins of the ledger code: each a spec policy (or the step book) with one method
overridden by a bug of a class that has happened, or could, in a scheduler budget.

``dualbudget prove --mutants`` runs, for each mutant, every obligation that runs the
mutated profile's code, and reports the obligations whose verdict then differs from the
manifest: the mutant's killers. A mutant no obligation kills is a hole in the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dualbudget.spec.arith import Cond, Num, any_of, floordiv, imax, imin, ite
from dualbudget.spec.book import NO_CHARGE, StepBook
from dualbudget.spec.policies import (
    Additive,
    AdmissionRule,
    Charge,
    Dual,
    GlobalReserve,
    Ledger,
    Policy,
    StepParams,
)
from dualbudget.spec.profiles import PROFILES

from .model import Subject

# -- vllm-0.32 (additive) ---------------------------------------------------------------


class RefundTargetOnly(Additive):
    def refund(self, ledger: Ledger, charge: Charge) -> Ledger:
        return Ledger(ledger.token_budget + charge.tokens, ledger.input_budget)


class RefundForgetsSlots(Additive):
    def refund(self, ledger: Ledger, charge: Charge) -> Ledger:
        # ``input_budget += restored`` without ``+ draft_slots``
        return Ledger(ledger.token_budget + charge.tokens, ledger.input_budget + charge.tokens)


class StrictStop(Additive):
    def exhausted(self, p: StepParams, ledger: Ledger) -> Cond:
        return any_of(ledger.token_budget <= 0, ledger.input_budget < self.draft_slots(p))


class DflashChargedKMinus1(Additive):
    def draft_slots(self, p: StepParams) -> Num:
        slots = super().draft_slots(p)
        if p.layout.name == "dflash":
            return p.num_speculative_tokens - 1
        return slots


class AdmissionOffByOne(Additive):
    def admission_rules(self, p: StepParams) -> list[AdmissionRule]:
        slots = self.draft_slots(p)
        return [AdmissionRule("max_num_batched_tokens", p.max_num_batched_tokens >= slots, "")]


class RoomIgnoresTokenBudget(Additive):
    def room(self, p: StepParams, ledger: Ledger) -> Num:
        return ledger.input_budget - self.draft_slots(p)


class OwnPassCapEight(Additive):
    """A hard-coded batch size: at most 8 DFlash/DSpark requests per step. Every step of
    up to 8 requests is unchanged, so only C6 past 8 requests can see it."""

    def max_active_requests(self, p: StepParams) -> Num:
        if not p.layout.drafts_in_own_pass:
            return p.max_num_seqs
        return imin(p.max_num_seqs, 8)


class RefundUnscheduledVictim(StepBook):
    """vLLM's refund without its ``if preempted_req in scheduled_running_reqs``:
    ``restored = num_scheduled_tokens.pop(id, 0)`` and ``input_budget += restored + slots``."""

    def preempt(self, request_id: str) -> Charge:
        charge = self.charges.pop(request_id, None)
        if charge is None:
            charge = self.policy.charge(self.params, 0)
        self.ledger = self.policy.refund(self.ledger, charge)
        return charge


# -- vllm-0.33 (additive with the own-pass cap) -----------------------------------------


class StaticCapFromK(Additive):
    def max_active_requests(self, p: StepParams) -> Num:
        if not p.layout.drafts_in_own_pass:
            return p.max_num_seqs
        return imin(p.max_num_seqs, floordiv(p.max_num_batched_tokens, p.num_speculative_tokens))


class StaticCapMissing(Additive):
    def max_active_requests(self, p: StepParams) -> Num:
        return p.max_num_seqs


# -- global-reserve ---------------------------------------------------------------------


class ReserveOneRequest(GlobalReserve):
    def reserved_target_cap(self, p: StepParams) -> Num:
        return imin(p.max_num_scheduled_tokens, p.max_num_batched_tokens - self.draft_slots(p))


# -- dual -------------------------------------------------------------------------------


class DraftBudgetFromTarget(Dual):
    def open(self, p: StepParams) -> Ledger:
        target_budget = imin(p.max_num_scheduled_tokens, p.max_num_batched_tokens)
        return Ledger(target_budget, p.max_num_scheduled_tokens)


class DualChargesTargetRowsOnly(Dual):
    def charge(self, p: StepParams, q: Num) -> Charge:
        return Charge(q, p.layout.carries_target_rows * q)


class DualRoomIgnoresFixedRows(Dual):
    def room(self, p: StepParams, ledger: Ledger) -> Num:
        if p.layout.carries_target_rows:
            return imin(ledger.token_budget, ledger.input_budget)
        return super().room(p, ledger)


class DualAdmitsFixedRowsOnly(Dual):
    def admission_rules(self, p: StepParams) -> list[AdmissionRule]:
        return [
            AdmissionRule("max_num_batched_tokens", p.max_num_batched_tokens >= p.draft_rows(0), "")
        ]


class DualStrictRoom(Dual):
    def room(self, p: StepParams, ledger: Ledger) -> Num:
        fixed_rows = p.draft_rows(0)
        if p.layout.carries_target_rows:
            return imin(ledger.token_budget, ledger.input_budget - fixed_rows)
        return ite(ledger.input_budget > fixed_rows, ledger.token_budget, 0)


class DualGrantIgnoresNeed(Dual):
    def grant(self, p: StepParams, ledger: Ledger, need: Num) -> Num:
        return imax(0, imin(need + 1, self.room(p, ledger)))


class DoubleRefund(StepBook):
    """The book refunds the recorded charge but keeps the record (``get`` for ``pop``)."""

    def preempt(self, request_id: str) -> Charge:
        charge = self.charges.get(request_id)
        if charge is None:
            return NO_CHARGE
        self.ledger = self.policy.refund(self.ledger, charge)
        return charge


class BookRecordsTargetOnly(StepBook):
    """The book applies the policy's charge but records only its target tokens."""

    def schedule(self, request_id: str, q: Num) -> Charge:
        charge = self.policy.charge(self.params, q)
        self.ledger = self.policy.apply(self.ledger, charge)
        self.charges[request_id] = Charge(charge.tokens, charge.tokens)
        return charge


@dataclass(frozen=True)
class Mutant:
    name: str
    profile: str
    description: str
    build: Callable[[], Subject]


def _policy(profile: str, cls: type[Policy]) -> Callable[[], Subject]:
    return lambda: Subject(profile, cls(PROFILES[profile].release))


def _book(profile: str, cls: type[StepBook]) -> Callable[[], Subject]:
    return lambda: Subject(profile, PROFILES[profile].policy, cls)


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "refund-target-only",
        "vllm-0.32",
        "preemption refunds the target tokens but not the input-budget rows",
        _policy("vllm-0.32", RefundTargetOnly),
    ),
    Mutant(
        "refund-forgets-slots",
        "vllm-0.32",
        "preemption refunds q rows of the input budget, forgetting the draft slots",
        _policy("vllm-0.32", RefundForgetsSlots),
    ),
    Mutant(
        "double-refund",
        "dual",
        "the book refunds a preempted request but keeps its record, so a second"
        " preemption refunds it again",
        _book("dual", DoubleRefund),
    ),
    Mutant(
        "refund-unscheduled-victim",
        "vllm-0.32",
        "preempting a victim not scheduled this step refunds charge(0) = its draft slots",
        _book("vllm-0.32", RefundUnscheduledVictim),
    ),
    Mutant(
        "book-records-target-only",
        "vllm-0.33",
        "the book records a charge of q rows instead of what it applied",
        _book("vllm-0.33", BookRecordsTargetOnly),
    ),
    Mutant(
        "strict-stop",
        "vllm-0.32",
        "the stop condition uses input_budget < slots instead of <=",
        _policy("vllm-0.32", StrictStop),
    ),
    Mutant(
        "dflash-charged-K-minus-1",
        "vllm-0.32",
        "DFlash charged K-1 draft slots instead of K",
        _policy("vllm-0.32", DflashChargedKMinus1),
    ),
    Mutant(
        "admission-off-by-one",
        "vllm-0.32",
        "admission accepts max_num_batched_tokens >= slots instead of >",
        _policy("vllm-0.32", AdmissionOffByOne),
    ),
    Mutant(
        "room-ignores-token-budget",
        "vllm-0.32",
        "a request's room is input_budget - slots, without the token budget",
        _policy("vllm-0.32", RoomIgnoresTokenBudget),
    ),
    Mutant(
        "own-pass-cap-eight",
        "vllm-0.32",
        "DFlash/DSpark steps hold at most 8 requests (a hard-coded batch size), so past 8"
        " requests global-reserve schedules more",
        _policy("vllm-0.32", OwnPassCapEight),
    ),
    Mutant(
        "static-cap-from-K",
        "vllm-0.33",
        "the DFlash/DSpark admission cap is B // K instead of B // num_lookahead_tokens",
        _policy("vllm-0.33", StaticCapFromK),
    ),
    Mutant(
        "static-cap-missing",
        "vllm-0.33",
        "DFlash/DSpark slots are 0 but the admission cap is not applied",
        _policy("vllm-0.33", StaticCapMissing),
    ),
    Mutant(
        "reserve-one-request",
        "global-reserve",
        "the static reserve is one request's slots instead of max_num_seqs * slots",
        _policy("global-reserve", ReserveOneRequest),
    ),
    Mutant(
        "draft-budget-from-target",
        "dual",
        "the draft budget is opened from max_num_scheduled_tokens instead of B",
        _policy("dual", DraftBudgetFromTarget),
    ),
    Mutant(
        "dual-charges-target-rows-only",
        "dual",
        "the draft budget is charged e*q, without the method's K-dependent rows",
        _policy("dual", DualChargesTargetRowsOnly),
    ),
    Mutant(
        "dual-room-ignores-fixed-rows",
        "dual",
        "the room of a carrying layout forgets the fixed draft rows C(0)",
        _policy("dual", DualRoomIgnoresFixedRows),
    ),
    Mutant(
        "dual-admits-fixed-rows-only",
        "dual",
        "admission checks B >= C(0) instead of B >= C(1)",
        _policy("dual", DualAdmitsFixedRowsOnly),
    ),
    Mutant(
        "dual-strict-room",
        "dual",
        "a DFlash/DSpark request fits only when input_budget > C(0) (> for >=)",
        _policy("dual", DualStrictRoom),
    ),
    Mutant(
        "grant-over-need",
        "dual",
        "grant gives up to need + 1 tokens (one more than the request can use)",
        _policy("dual", DualGrantIgnoresNeed),
    ),
)

MUTANT_NAMES = tuple(m.name for m in MUTANTS)


def mutant_named(name: str) -> Mutant:
    for mutant in MUTANTS:
        if mutant.name == name:
            return mutant
    raise KeyError(name)
