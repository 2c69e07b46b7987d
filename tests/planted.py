"""The step book's rules with some of their methods replaced, for a test that plants a
wrong answer in a reference run: the scheduling loop looks each method up on the rules it
holds, so a method set on the instance wins."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from dualbudget.reference.budget_rules import BudgetRules


def planted_rules(rules: BudgetRules, **methods: Callable[..., Any]) -> BudgetRules:
    """A copy of ``rules`` whose named methods are ``methods``; refuses a name that is not
    one of their methods, so that a typo cannot plant nothing."""
    twin = copy.copy(rules)
    for name, method in methods.items():
        if not callable(getattr(BudgetRules, name, None)):
            raise AttributeError(f"the budget rules have no method {name!r}")
        setattr(twin, name, method)
    return twin
