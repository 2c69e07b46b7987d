"""One arithmetic for the concrete run and the proof.

Every budget rule in ``spec`` is written with these helpers instead of ``min``, ``max``
and ``if``. Handed Python ints they compute ints; handed z3 integer terms they build the
z3 formula of the very same rule. That is how the proofs check the code that runs: there
is no second encoding to drift from it.
"""

from __future__ import annotations

from typing import Any, TypeAlias

# A budget quantity: a Python int in a concrete run, a z3 ``ArithRef`` in a proof.
# ``Any`` stands for the z3 case so that ``spec`` needs no z3 stubs to type-check.
Num: TypeAlias = Any
# A condition: a Python bool in a concrete run, a z3 ``BoolRef`` in a proof.
Cond: TypeAlias = Any


def is_concrete(*values: object) -> bool:
    """True when every value is a plain Python int or bool (no z3 term among them)."""
    return all(isinstance(v, (int, bool)) for v in values)


def ite(cond: Cond, then: Num, otherwise: Num) -> Num:
    """``then if cond else otherwise``; a z3 ``If`` when ``cond`` is symbolic."""
    if isinstance(cond, bool):
        return then if cond else otherwise
    import z3  # only proofs hand us z3 terms

    return z3.If(cond, then, otherwise)


# The concrete run calls ``imin``, ``imax`` and ``any_of`` with two plain ints (bools) for
# every request of every step: those calls take a shortcut that computes what the fold
# below computes (``ite(b < a, b, a)`` for ``imin``), and every other call (z3 terms, more
# values) takes the fold itself, so a proof builds exactly the formula it always did.


def imin(*values: Num) -> Num:
    """The least of the values (at least one)."""
    if len(values) == 2:
        a, b = values
        if type(a) is int and type(b) is int:
            return b if b < a else a
    result = values[0]
    for value in values[1:]:
        result = ite(value < result, value, result)
    return result


def imax(*values: Num) -> Num:
    """The greatest of the values (at least one)."""
    if len(values) == 2:
        a, b = values
        if type(a) is int and type(b) is int:
            return b if b > a else a
    result = values[0]
    for value in values[1:]:
        result = ite(value > result, value, result)
    return result


def floordiv(numerator: Num, denominator: Num) -> Num:
    """Floor division for a positive denominator (z3's integer ``/`` agrees there)."""
    if is_concrete(numerator, denominator):
        return int(numerator) // int(denominator)
    return numerator / denominator


def all_of(*conds: Cond) -> Cond:
    """Conjunction of conditions, concrete or symbolic."""
    for c in conds:
        if not isinstance(c, bool):
            break
    else:
        return all(conds)
    import z3

    return z3.And(*conds)


def any_of(*conds: Cond) -> Cond:
    """Disjunction of conditions, concrete or symbolic."""
    if len(conds) == 2:
        a, b = conds
        if type(a) is bool and type(b) is bool:
            return a or b
    for c in conds:
        if not isinstance(c, bool):
            break
    else:
        return any(conds)
    import z3

    return z3.Or(*conds)
