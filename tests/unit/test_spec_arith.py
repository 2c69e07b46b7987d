"""The arithmetic's shortcuts for plain ints agree with its fold, and leave z3 terms to it.

``imin``/``imax``/``any_of`` take a shortcut when handed two plain ints (bools): the
reference's hot path. The fold below them is what proofs run; these tests pin that the
shortcut returns what the fold returns, and that z3 terms still build the fold's formula.
"""

from __future__ import annotations

import itertools

import z3

from dualbudget.spec.arith import all_of, any_of, imax, imin, ite


def fold_min(*values: object) -> object:
    result = values[0]
    for value in values[1:]:
        result = ite(value < result, value, result)  # type: ignore[operator]
    return result


def fold_max(*values: object) -> object:
    result = values[0]
    for value in values[1:]:
        result = ite(value > result, value, result)  # type: ignore[operator]
    return result


def test_int_shortcuts_agree_with_the_fold() -> None:
    numbers = [-3, -1, 0, 1, 2, 7]
    for a, b in itertools.product(numbers, repeat=2):
        assert imin(a, b) == fold_min(a, b) and type(imin(a, b)) is int
        assert imax(a, b) == fold_max(a, b) and type(imax(a, b)) is int
    for values in itertools.product([0, 1, 5], repeat=3):
        assert imin(*values) == fold_min(*values)
        assert imax(*values) == fold_max(*values)
    for a, b in itertools.product([False, True], repeat=2):
        assert any_of(a, b) is (a or b)
        assert all_of(a, b) is (a and b)
        assert imin(a, b) == fold_min(a, b)
        assert imax(a, b) == fold_max(a, b)


def test_z3_terms_still_build_the_folds_formula() -> None:
    x, y = z3.Ints("x y")
    assert z3.eq(imin(x, y), z3.If(y < x, y, x))
    assert z3.eq(imax(x, y), z3.If(y > x, y, x))
    assert z3.eq(imin(3, x), z3.If(x < 3, x, 3))
    assert z3.eq(imax(x, 0), z3.If(x < 0, 0, x))  # the fold's ``0 > x`` is z3's ``x < 0``
    assert z3.eq(any_of(x > 0, y > 0), z3.Or(x > 0, y > 0))
    assert z3.eq(any_of(True, y > 0), z3.Or(True, y > 0))
    assert z3.eq(all_of(x > 0, True), z3.And(x > 0, True))
