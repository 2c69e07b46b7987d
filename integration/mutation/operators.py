"""The mutation operators and the budget sites they apply to, on a function's AST.

A *budget statement* is one that reads or writes a budget name (``BUDGET_NAMES``: the
two budgets of a step, the draft slots, a request's grant bound, a refund, the padded
width, the long-prefill threshold, the active-request cap). Inside it, a *site* is a node
an operator can change:

- ``drop-term``: a ``+``/``-`` loses its right term, a ``min``/``max`` one argument, a
  charge (``budget -= x``) the whole statement;
- ``double-term``: the right term of a ``+``/``-``, or a charge, counts twice;
- ``shift-boundary``: ``<`` and ``<=``, ``>`` and ``>=`` swap;
- ``remove-refund``: a refund (``budget += x``) is dropped;
- ``refund-twice``: a refund is made twice;
- ``skip-break``: a ``break`` under a test on a budget name does not break.

A node counts as a site when it reads a budget name itself, or when the statement assigns
a budget name (then all of the value is budget code: ``padded = 1 + K`` is the padding
rule). Assertions are vLLM's checks of its own budgets, not budget decisions: skipped.
Sites are numbered in source order, so a mutant's name is stable for a given source and
does not depend on which other operators were asked for.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

BUDGET_NAMES = frozenset(
    {
        "token_budget",
        "input_budget",
        "draft_slots",
        "request_token_budget",
        "restored",
        "padded_num_tokens",
        "long_prefill_token_threshold",
        "max_num_active_reqs",
    }
)

OPERATORS = (
    "drop-term",
    "double-term",
    "shift-boundary",
    "remove-refund",
    "refund-twice",
    "skip-break",
)

_SHIFTED: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
}


class NoSite(ValueError):
    """An operator found no site: the source no longer has the shape it was written for."""


@dataclass(frozen=True)
class Site:
    """One operator at one place of one function: one mutant."""

    operator: str
    function: str
    line: int
    """Line in the file the function was parsed from."""
    anchor: str
    """The budget names the site reads (or the name its statement assigns)."""
    ordinal: int
    """1-based among the sites of this operator, function and anchor."""
    index: int
    """Position in the source-order list of this operator's sites in the function."""

    @property
    def name(self) -> str:
        return f"{self.operator}/{self.function}/{self.anchor}/{self.ordinal}"

    @property
    def location(self) -> str:
        return f"{self.function}:{self.line}"


_Apply = Callable[[], None]
_Parent = tuple[ast.AST, str, int | None]


def _names(node: ast.AST) -> set[str]:
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in BUDGET_NAMES:
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute) and sub.attr in BUDGET_NAMES:
            found.add(sub.attr)
    return found


def _parents(root: ast.AST) -> dict[int, _Parent]:
    parents: dict[int, _Parent] = {}
    for node in ast.walk(root):
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, ast.AST):
                        parents[id(item)] = (node, field, i)
            elif isinstance(value, ast.AST):
                parents[id(value)] = (node, field, None)
    return parents


def _preorder(node: ast.AST) -> Iterator[ast.AST]:
    """Source order (``ast.walk`` is breadth-first)."""
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _preorder(child)


def _replacer(parents: dict[int, _Parent], old: ast.AST, new: ast.AST) -> _Apply:
    parent, field, index = parents[id(old)]

    def apply() -> None:
        if index is None:
            setattr(parent, field, new)
        else:
            getattr(parent, field)[index] = new

    return apply


def _twice(node: ast.expr) -> ast.expr:
    return ast.BinOp(ast.Constant(2), ast.Mult(), node)


def _candidates(function: ast.FunctionDef) -> Iterator[tuple[str, int, str, _Apply]]:
    """(operator, line, anchor, apply) for every site, in source order; ``apply`` plants
    the bug in ``function`` itself."""
    parents = _parents(function)
    for stmt in _preorder(function):
        if not isinstance(stmt, ast.stmt) or stmt is function:
            continue
        if any(isinstance(p, ast.Assert) for p in _ancestors(parents, stmt)):
            continue
        whole, target_anchor = False, ""
        if isinstance(stmt, ast.If | ast.While):
            expr: ast.expr = stmt.test
            if isinstance(stmt, ast.If) and _names(stmt.test):
                anchor = "+".join(sorted(_names(stmt.test)))
                for body_stmt in stmt.body:
                    if isinstance(body_stmt, ast.Break):
                        yield (
                            "skip-break",
                            body_stmt.lineno,
                            anchor,
                            _replacer(parents, body_stmt, ast.Pass()),
                        )
        elif isinstance(stmt, ast.Assign):
            targets = set().union(*(_names(t) for t in stmt.targets))
            expr, whole = stmt.value, bool(targets)
            target_anchor = "+".join(sorted(targets))
        elif (
            isinstance(stmt, ast.AugAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.target.id in BUDGET_NAMES
        ):
            anchor = "+".join(sorted({stmt.target.id} | _names(stmt.value)))
            expr, whole, target_anchor = stmt.value, True, stmt.target.id
            if isinstance(stmt.op, ast.Sub):
                yield "drop-term", stmt.lineno, anchor, _replacer(parents, stmt, ast.Pass())
                doubled = ast.AugAssign(stmt.target, stmt.op, _twice(stmt.value))
                yield "double-term", stmt.lineno, anchor, _replacer(parents, stmt, doubled)
            elif isinstance(stmt.op, ast.Add):
                yield "remove-refund", stmt.lineno, anchor, _replacer(parents, stmt, ast.Pass())
                yield "refund-twice", stmt.lineno, anchor, _inserter(parents, stmt)
        else:
            continue
        for node in _preorder(expr):
            names = _names(node)
            if not (names or whole):
                continue
            anchor = "+".join(sorted(names)) if names else target_anchor
            yield from _expression_sites(parents, node, anchor)


def _expression_sites(
    parents: dict[int, _Parent], node: ast.AST, anchor: str
) -> Iterator[tuple[str, int, str, _Apply]]:
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            shifted = _SHIFTED.get(type(op))
            if shifted is not None:
                yield "shift-boundary", node.lineno, anchor, _shift(node, i, shifted)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        yield "drop-term", node.lineno, anchor, _replacer(parents, node, node.left)
        doubled = ast.BinOp(node.left, node.op, _twice(node.right))
        yield "double-term", node.lineno, anchor, _replacer(parents, node, doubled)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("min", "max")
        and len(node.args) >= 2
        and not node.keywords
    ):
        for i in range(len(node.args)):
            rest = node.args[:i] + node.args[i + 1 :]
            new = rest[0] if len(rest) == 1 else ast.Call(node.func, rest, [])
            yield "drop-term", node.args[i].lineno, anchor, _replacer(parents, node, new)


def _shift(node: ast.Compare, i: int, shifted: type[ast.cmpop]) -> _Apply:
    def apply() -> None:
        node.ops[i] = shifted()

    return apply


def _inserter(parents: dict[int, _Parent], stmt: ast.stmt) -> _Apply:
    parent, field, index = parents[id(stmt)]
    assert index is not None

    def apply() -> None:
        getattr(parent, field).insert(index + 1, copy.deepcopy(stmt))

    return apply


def _ancestors(parents: dict[int, _Parent], node: ast.AST) -> Iterator[ast.AST]:
    while id(node) in parents:
        node = parents[id(node)][0]
        yield node


def find_sites(function: ast.FunctionDef, operators: tuple[str, ...] = OPERATORS) -> list[Site]:
    """Every site of ``operators`` in ``function``; raises ``NoSite`` naming each operator
    that found none."""
    unknown = sorted(set(operators) - set(OPERATORS))
    if unknown:
        raise ValueError(f"unknown operators: {', '.join(unknown)}")
    sites: list[Site] = []
    index: dict[str, int] = {}
    ordinal: dict[tuple[str, str], int] = {}
    for operator, line, anchor, _ in _candidates(function):
        i = index[operator] = index.get(operator, -1) + 1
        n = ordinal[(operator, anchor)] = ordinal.get((operator, anchor), 0) + 1
        if operator in operators:
            sites.append(Site(operator, function.name, line, anchor, n, i))
    missing = [op for op in operators if op not in index]
    if missing:
        raise NoSite(
            f"operator {', '.join(missing)} found no site in {function.name}() "
            f"(line {function.lineno}): the source does not have the shape it was written for"
        )
    return sites


def mutate(function: ast.FunctionDef, site: Site) -> ast.FunctionDef:
    """A copy of ``function`` with ``site``'s bug planted (``function`` is untouched)."""
    mutant = copy.deepcopy(function)
    found = [c for c in _candidates(mutant) if c[0] == site.operator]
    _, line, anchor, apply = found[site.index]
    if (line, anchor) != (site.line, site.anchor):
        raise NoSite(f"{site.name}: the source changed since its sites were found")
    apply()
    return ast.fix_missing_locations(mutant)
