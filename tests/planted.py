"""A budget kernel with some of its methods replaced, for a test that plants a wrong
answer in a reference run. The tests run the sources (conftest.py), where the scheduling
loop looks each method up on the kernel it holds, so a method set on the instance wins."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from dualbudget.reference.budget_kernel import Kernel


def planted_kernel(kernel: Kernel, **methods: Callable[..., Any]) -> Kernel:
    """A copy of ``kernel`` whose named methods are ``methods``; refuses a name that is not
    one of the kernel's methods, so that a typo cannot plant nothing."""
    twin = copy.copy(kernel)
    for name, method in methods.items():
        if not callable(getattr(Kernel, name, None)):
            raise AttributeError(f"the budget kernel has no method {name!r}")
        setattr(twin, name, method)
    return twin
