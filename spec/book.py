"""The step book: one step's ledger plus what each scheduled request was charged.

A policy's ``refund`` gives back whatever charge it is handed; the book is what makes that
charge the right one. It records, per request id, the ``Charge`` its ``schedule`` applied,
and ``preempt`` refunds exactly that record and deletes it. So a request is never refunded
twice, nor refunded without having been charged: preempting a request the book holds no
charge for (never scheduled this step, or already preempted) refunds nothing.

Written over ``arith`` like the policies: the ledger and the charges may be z3 terms, the
request ids stay concrete. The proofs run this very class on symbolic ledgers; the
reference runs the formulas of its transitions, compiled for one config (``kernel``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .arith import Cond, Num, is_concrete
from .policies import Charge, Ledger, Policy, StepParams

NO_CHARGE = Charge(0, 0)


@dataclass
class StepBook:
    """The budgets of one step and the charge of every request scheduled in it."""

    policy: Policy
    params: StepParams
    ledger: Ledger
    charges: dict[str, Charge] = field(default_factory=dict)

    @classmethod
    def opened(cls, policy: Policy, params: StepParams) -> StepBook:
        """The book of an empty step: the policy's opening budgets, nothing charged."""
        return cls(policy, params, policy.open(params))

    def copy(self) -> StepBook:
        return type(self)(self.policy, self.params, self.ledger, dict(self.charges))

    # -- questions, delegated to the policy --------------------------------------------
    def exhausted(self) -> Cond:
        return self.policy.exhausted(self.params, self.ledger)

    def grant(self, need: Num) -> Num:
        return self.policy.grant(self.params, self.ledger, need)

    @property
    def count(self) -> int:
        """How many requests hold a charge in this step."""
        return len(self.charges)

    # -- transitions -------------------------------------------------------------------
    def schedule(self, request_id: str, q: Num) -> Charge:
        """Charge ``q >= 1`` target tokens for ``request_id`` and record the charge."""
        if request_id in self.charges:
            raise ValueError(f"request {request_id!r} is already scheduled in this step")
        if is_concrete(q) and q < 1:
            raise ValueError(f"request {request_id!r}: cannot schedule {q} tokens")
        charge = self.policy.charge(self.params, q)
        self.ledger = self.policy.apply(self.ledger, charge)
        self.charges[request_id] = charge
        return charge

    def preempt(self, request_id: str) -> Charge:
        """Refund exactly what ``request_id`` was charged this step and forget it.

        Returns the refund: the recorded charge, or nothing when the book holds none.
        """
        charge = self.charges.pop(request_id, None)
        if charge is None:
            return NO_CHARGE
        self.ledger = self.policy.refund(self.ledger, charge)
        return charge
