"""The stored kernel read back as z3 terms, for the ``compiled`` obligation.

``spec/compiled_book.py`` holds, per policy and layout, the Python source the reference
runs (``spec/kernel.py``). To prove it equal to the spec's formulas, the source is parsed
(Python's own ``ast``) and evaluated on z3 symbols by this interpreter. It knows exactly
the constructs ``proofs/compile_book.py`` emits, with their meaning on Python ints and
bools: ``+ - *``, ``//`` by a positive literal (z3's integer division floors there, as
``//`` does), one comparison ``< <= > >= ==``, ``and``, ``or``, ``not``, unary ``-``,
``a if c else b``, int and bool literals, the function's arguments, the config numbers
(``spec.kernel.PARAMS``) and temporaries assigned once before use. Anything else, and any
mix of ints and bools (Python would coerce, z3 would not), is refused: the obligation then
fails, never passes on a guess.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import z3

from dualbudget.spec.kernel import KERNEL_FUNCTIONS, PARAMS

from .compile_book import BookSymbols


class UnreadableSource(ValueError):
    """The stored source holds a construct the interpreter does not know."""


def read_template(template: str, symbols: BookSymbols) -> dict[str, list[Any]]:
    """function name -> its outputs as z3 terms over ``symbols``, for the template whose
    ``{name}`` slots stand for the config numbers."""
    try:
        source = template.format_map({name: name for name in PARAMS})
        tree = ast.parse(source)
    except (KeyError, ValueError, SyntaxError) as err:
        raise UnreadableSource(f"not a kernel template: {err}") from None
    wanted = {function.name: function.args for function in KERNEL_FUNCTIONS}
    out: dict[str, list[Any]] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            raise UnreadableSource(f"line {node.lineno}: only function definitions")
        if node.name not in wanted or node.name in out:
            raise UnreadableSource(f"line {node.lineno}: unexpected function {node.name!r}")
        out[node.name] = _function(node, wanted[node.name], symbols)
    missing = [name for name in wanted if name not in out]
    if missing:
        raise UnreadableSource(f"missing functions: {', '.join(missing)}")
    return out


def _function(node: ast.FunctionDef, args: tuple[str, ...], symbols: BookSymbols) -> list[Any]:
    a = node.args
    names = tuple(arg.arg for arg in a.args)
    plain = not (a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults)
    if names != args or not plain or node.decorator_list or node.returns:
        raise UnreadableSource(f"{node.name}: the signature is not ({', '.join(args)})")
    scope: dict[str, Any] = {name: symbols.arguments[name] for name in args}
    *assignments, last = node.body
    for stmt in assignments:
        if not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            raise UnreadableSource(f"{node.name}, line {stmt.lineno}: only `name = expression`")
        target = stmt.targets[0].id
        if target in scope or target in PARAMS:
            raise UnreadableSource(f"{node.name}, line {stmt.lineno}: {target!r} bound twice")
        scope[target] = _expr(stmt.value, scope, symbols)
    if not isinstance(last, ast.Return) or last.value is None:
        raise UnreadableSource(f"{node.name}: the body must end in `return`")
    values = last.value.elts if isinstance(last.value, ast.Tuple) else [last.value]
    return [_expr(value, scope, symbols) for value in values]


def _int(term: Any, node: ast.AST) -> Any:
    if not z3.is_int(term):
        raise UnreadableSource(f"line {getattr(node, 'lineno', '?')}: an int is expected here")
    return term


def _bool(term: Any, node: ast.AST) -> Any:
    if not z3.is_bool(term):
        raise UnreadableSource(f"line {getattr(node, 'lineno', '?')}: a bool is expected here")
    return term


_ARITH: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda x, y: x + y,
    ast.Sub: lambda x, y: x - y,
    ast.Mult: lambda x, y: x * y,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Lt: lambda x, y: x < y,
    ast.LtE: lambda x, y: x <= y,
    ast.Gt: lambda x, y: x > y,
    ast.GtE: lambda x, y: x >= y,
}


def _expr(node: ast.expr, scope: dict[str, Any], symbols: BookSymbols) -> Any:
    def sub(kid: ast.expr) -> Any:
        return _expr(kid, scope, symbols)

    where = f"line {node.lineno}"
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            return z3.BoolVal(node.value)
        if isinstance(node.value, int):
            return z3.IntVal(node.value)
        raise UnreadableSource(f"{where}: literal {node.value!r}")
    if isinstance(node, ast.Name):
        if node.id in scope:
            return scope[node.id]
        if node.id in PARAMS:
            return symbols.params[node.id]
        raise UnreadableSource(f"{where}: unknown name {node.id!r}")
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub):
            return -_int(sub(node.operand), node)
        if isinstance(node.op, ast.Not):
            return z3.Not(_bool(sub(node.operand), node))
    if isinstance(node, ast.BinOp):
        left = _int(sub(node.left), node)
        arith = _ARITH.get(type(node.op))
        if arith is not None:
            return arith(left, _int(sub(node.right), node))
        divisor = node.right
        if (
            isinstance(node.op, ast.FloorDiv)
            and isinstance(divisor, ast.Constant)
            and type(divisor.value) is int
            and divisor.value > 0
        ):
            return left / z3.IntVal(divisor.value)
    if isinstance(node, ast.BoolOp):
        conds = [_bool(sub(value), node) for value in node.values]
        return z3.And(*conds) if isinstance(node.op, ast.And) else z3.Or(*conds)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right = sub(node.left), sub(node.comparators[0])
        (op,) = node.ops
        if isinstance(op, ast.Eq):
            if z3.is_bool(left) and z3.is_bool(right):
                return left == right
            return _int(left, node) == _int(right, node)
        compare = _COMPARE.get(type(op))
        if compare is not None:
            return compare(_int(left, node), _int(right, node))
    if isinstance(node, ast.IfExp):
        test = _bool(sub(node.test), node)
        then, otherwise = sub(node.body), sub(node.orelse)
        if z3.is_bool(then) != z3.is_bool(otherwise):
            raise UnreadableSource(f"{where}: the branches of `if` differ in type")
        return z3.If(test, then, otherwise)
    raise UnreadableSource(f"{where}: no reading for {ast.dump(node)[:80]}")
