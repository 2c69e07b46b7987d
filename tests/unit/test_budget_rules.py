"""The budget rules the reference's scheduling loop asks (reference/budget_rules.py): the
spec's ``StepBook`` and policy on ints, asked with the ledger as two ints. Each answer is
the book's own, for every profile and layout; preempting what was just scheduled gives
back exactly its charge (C2)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dualbudget.reference.budget_rules import BudgetRules
from dualbudget.spec.book import StepBook
from dualbudget.spec.methods import LAYOUT_NAMES, NO_SPECULATION, layout_named
from dualbudget.spec.policies import Ledger, StepParams
from dualbudget.spec.profiles import PROFILES

budgets = st.integers(min_value=-40, max_value=600)


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, StepParams]:
    profile = draw(st.sampled_from(sorted(PROFILES)))
    name = draw(st.sampled_from((*LAYOUT_NAMES, NO_SPECULATION.name)))
    layout = NO_SPECULATION if name == NO_SPECULATION.name else layout_named(name)
    b = draw(st.integers(min_value=1, max_value=512))
    s = draw(st.integers(min_value=1, max_value=600))
    m = draw(st.integers(min_value=1, max_value=b))
    k = draw(st.integers(min_value=1, max_value=12))
    return profile, StepParams(b, s, m, k, layout)


@settings(max_examples=300, deadline=None)
@given(configs(), budgets, budgets, st.integers(min_value=0, max_value=600), st.integers(1, 600))
def test_the_rules_answer_what_the_book_answers(
    config: tuple[str, StepParams], token_budget: int, input_budget: int, need: int, q: int
) -> None:
    name, p = config
    policy = PROFILES[name].policy
    rules = BudgetRules(policy, p)
    ledger = Ledger(token_budget, input_budget)
    book = StepBook(policy, p, ledger)
    opened = policy.open(p)
    assert rules.opened == (opened.token_budget, opened.input_budget)
    assert rules.max_active_requests == policy.max_active_requests(p)
    assert rules.exhausted(token_budget, input_budget) == book.exhausted()
    assert rules.room(token_budget, input_budget) == policy.room(p, ledger)
    assert rules.grant(token_budget, input_budget, need) == book.grant(need)

    book.schedule("r", q)
    after = book.ledger
    assert rules.take(token_budget, input_budget, q) == (
        after.token_budget,
        after.input_budget,
        book.exhausted(),
    )
    assert rules.give_back(after.token_budget, after.input_budget, q) == (
        token_budget,
        input_budget,
    )
    book.preempt("r")
    assert book.ledger == ledger


def test_the_rules_on_one_worked_config() -> None:
    # vLLM 0.32 on DFlash, K = 4, B = 512: 4 draft slots per request, so an input budget
    # of 10 grants 6 target tokens and a step with 4 or fewer input rows left is exhausted.
    rules = BudgetRules(
        PROFILES["vllm-0.32"].policy, StepParams(512, 512, 64, 4, layout_named("dflash"))
    )
    assert rules.opened == (512, 512)
    assert rules.grant(100, 10, 50) == 6
    assert rules.take(100, 10, 6) == (94, 0, True)
    assert rules.give_back(94, 0, 6) == (100, 10)
    assert rules.exhausted(100, 4) and not rules.exhausted(100, 5)
