"""The step book as the scheduling loop asks it: the spec's own ``StepBook``, on ints.

The loop keeps the step's ledger as two ints (``token_budget, input_budget``) and the
tokens each scheduled request was charged for (``OpenStep.scheduled``). Each question it
asks is answered by ``spec.book.StepBook`` and the policy's methods, the code the proofs
run on z3 symbols, here handed Python ints: there is one executable form of the budget
rule, so what ``dualbudget prove`` shows of it is what the reference runs.

Each answer is a function of its int arguments alone (the policy and config are fixed),
and the loop asks the same questions step after step (every step opens the same ledger,
and requests ask alike), so each is remembered, up to ``REMEMBERED`` answers per question.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Final, TypeVar

from dualbudget.spec.book import StepBook
from dualbudget.spec.policies import Ledger, Policy, StepParams

REMEMBERED: Final = 1 << 16
"""Answers kept per question: a long sweep meets more ledgers than it asks twice."""

A = TypeVar("A")


def _remembered(answers: dict[Hashable, A], key: Hashable, answer: Callable[[], A]) -> A:
    found = answers.get(key)
    if found is None:
        found = answer()
        if len(answers) < REMEMBERED:
            answers[key] = found
    return found


class BudgetRules:
    """A profile's budget rules on one config, asked with the ledger as two ints."""

    def __init__(self, policy: Policy, params: StepParams) -> None:
        self.policy = policy
        self.params = params
        ledger = policy.open(params)
        self.opened = (int(ledger.token_budget), int(ledger.input_budget))
        """The ledger of an empty step: ``(token_budget, input_budget)``."""
        self.max_active_requests = int(policy.max_active_requests(params))
        self._exhausted: dict[Hashable, bool] = {}
        self._room: dict[Hashable, int] = {}
        self._grant: dict[Hashable, int] = {}
        self._take: dict[Hashable, tuple[int, int, bool]] = {}
        self._give_back: dict[Hashable, tuple[int, int]] = {}

    def _book(self, token_budget: int, input_budget: int) -> StepBook:
        return StepBook(self.policy, self.params, Ledger(token_budget, input_budget))

    def exhausted(self, token_budget: int, input_budget: int) -> bool:
        """``StepBook.exhausted()``."""
        return _remembered(
            self._exhausted,
            (token_budget, input_budget),
            lambda: bool(self._book(token_budget, input_budget).exhausted()),
        )

    def room(self, token_budget: int, input_budget: int) -> int:
        """``policy.room``: what an admission may take at most."""
        return _remembered(
            self._room,
            (token_budget, input_budget),
            lambda: int(self.policy.room(self.params, Ledger(token_budget, input_budget))),
        )

    def grant(self, token_budget: int, input_budget: int, need: int) -> int:
        """``StepBook.grant(need)``."""
        return _remembered(
            self._grant,
            (token_budget, input_budget, need),
            lambda: int(self._book(token_budget, input_budget).grant(need)),
        )

    def take(self, token_budget: int, input_budget: int, q: int) -> tuple[int, int, bool]:
        """The ledger after ``StepBook.schedule`` of ``q`` tokens, and whether the book is
        then exhausted (the loop's next question, answered with the same book)."""

        def answer() -> tuple[int, int, bool]:
            book = self._book(token_budget, input_budget)
            book.schedule("", q)
            ledger = book.ledger
            return int(ledger.token_budget), int(ledger.input_budget), bool(book.exhausted())

        return _remembered(self._take, (token_budget, input_budget, q), answer)

    def give_back(self, token_budget: int, input_budget: int, q: int) -> tuple[int, int]:
        """The ledger after ``StepBook.preempt`` of a request the book charged for ``q``
        tokens: it refunds the recorded charge, and the charge is a function of ``q``
        alone, so the loop records ``q`` (``OpenStep.scheduled``)."""

        def answer() -> tuple[int, int]:
            charge = self.policy.charge(self.params, q)
            ledger = self.policy.refund(Ledger(token_budget, input_budget), charge)
            return int(ledger.token_budget), int(ledger.input_budget)

        return _remembered(self._give_back, (token_budget, input_budget, q), answer)
