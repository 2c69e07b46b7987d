"""The book compiler: the step book's formulas, built on z3 symbols, written as Python.

The reference runs ``StepBook``'s ``exhausted``, ``grant``, ``schedule`` and ``preempt``
(and through them the policy's ``room``, ``charge``, ``apply``, ``refund``) as plain
Python functions of ints, one set per policy and method layout (``spec/kernel.py``). They
are made here, once, ahead of time: the book's own code runs on z3 symbols for the ledger,
the request and the config numbers, as the proofs run it, and each formula is translated
node for node into Python source, the config numbers left as ``{name}`` slots. The
templates are stored in the generated module ``spec/compiled_book.py``, so that no
reference run imports z3:

    python -m dualbudget.proofs.compile_book --write   # after a change to a policy or the book
    python -m dualbudget.proofs.compile_book --check   # exit 1 when the stored module is stale

A formula with a construct (or a symbol) the translator does not know is refused, never
approximated. That the stored templates are the spec's formulas is itself an obligation
of ``dualbudget prove`` (check ``compiled``, ``proofs/kernel_source.py``), so a stale
module fails the proofs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import z3

from dualbudget.spec.book import StepBook
from dualbudget.spec.kernel import (
    INPUT_BUDGET,
    KERNEL_FUNCTIONS,
    NEED,
    PARAMS,
    TOKEN_BUDGET,
    Q,
    TemplateKey,
    template_key,
)
from dualbudget.spec.methods import LAYOUTS, NO_SPECULATION, MethodLayout
from dualbudget.spec.policies import Ledger, Policy, StepParams
from dualbudget.spec.profiles import PROFILES

COMPILED_LAYOUTS = (*LAYOUTS, NO_SPECULATION)
"""Every row of the method table, and the row of a config without speculative decoding."""
COMPILED_BOOK = Path(__file__).resolve().parent.parent / "spec" / "compiled_book.py"
REGENERATE = "python -m dualbudget.proofs.compile_book --write"


class UntranslatableFormula(ValueError):
    """A book formula uses a construct (or a symbol) the translator does not know."""


@dataclass(frozen=True)
class BookSymbols:
    """The z3 symbols the kernel's functions are built on, named as their arguments and
    as the config numbers (``spec.kernel.PARAMS``)."""

    params: dict[str, Any]
    arguments: dict[str, Any]


def book_symbols() -> BookSymbols:
    params = dict(zip(PARAMS, z3.Ints(" ".join(PARAMS)), strict=True))
    names = (TOKEN_BUDGET, INPUT_BUDGET, NEED, Q)
    arguments = dict(zip(names, z3.Ints(" ".join(names)), strict=True))
    return BookSymbols(params, arguments)


def book_formulas(
    policy: Policy, layout: MethodLayout, symbols: BookSymbols, book: type[StepBook] = StepBook
) -> dict[str, list[Any]]:
    """function name -> the outputs the spec's code computes on the symbols, in the order
    ``spec.kernel.KERNEL_FUNCTIONS`` gives them (the kernel's interface)."""
    b, s, m, k = (symbols.params[name] for name in PARAMS)
    p = StepParams(b, s, m, k, layout)
    a = symbols.arguments
    ledger = Ledger(a[TOKEN_BUDGET], a[INPUT_BUDGET])

    def fresh() -> StepBook:
        return book(policy, p, ledger)

    scheduled = fresh()
    scheduled.schedule("r", a[Q])
    charged = book(policy, p, ledger, {"r": policy.charge(p, a[Q])})
    charged.preempt("r")
    formulas = {
        "exhausted": [fresh().exhausted()],
        "room": [policy.room(p, ledger)],
        "grant": [fresh().grant(a[NEED])],
        "take": [
            scheduled.ledger.token_budget,
            scheduled.ledger.input_budget,
            scheduled.exhausted(),
        ],
        "give_back": [charged.ledger.token_budget, charged.ledger.input_budget],
    }
    assert tuple(formulas) == tuple(function.name for function in KERNEL_FUNCTIONS)
    return formulas


def template(policy: Policy, layout: MethodLayout) -> str:
    """The kernel's source for every config of one layout, the config numbers as slots."""
    symbols = book_symbols()
    formulas = book_formulas(policy, layout, symbols)
    return "\n\n".join(
        function_source(name, list(args), formulas[name]) for name, args, _ in KERNEL_FUNCTIONS
    )


_INFIX = {
    z3.Z3_OP_ADD: "+",
    z3.Z3_OP_SUB: "-",
    z3.Z3_OP_MUL: "*",
    z3.Z3_OP_LE: "<=",
    z3.Z3_OP_LT: "<",
    z3.Z3_OP_GE: ">=",
    z3.Z3_OP_GT: ">",
    z3.Z3_OP_EQ: "==",
    z3.Z3_OP_AND: "and",
    z3.Z3_OP_OR: "or",
}


def function_source(name: str, args: list[str], outputs: list[Any]) -> str:
    """``def name(args): ...`` computing ``outputs``: a node used once is written in place,
    a node shared by several (z3 builds ``min(a, b)`` as ``If(b < a, b, a)``) is computed
    once into a temporary, leaves first."""

    def is_leaf(expr: Any) -> bool:
        return not z3.is_expr(expr) or bool(z3.is_const(expr))

    uses: dict[int, int] = {}

    def count(expr: Any) -> None:
        if is_leaf(expr):
            return
        uses[expr.get_id()] = uses.get(expr.get_id(), 0) + 1
        if uses[expr.get_id()] == 1:
            for kid in expr.children():
                count(kid)

    for out in outputs:
        count(out)
    lines: list[str] = []
    temps: dict[int, str] = {}

    def emit(expr: Any) -> str:
        """Python for ``expr``: a literal, an argument, a temporary or an expression."""
        if isinstance(expr, (bool, int)):
            return repr(expr)
        if z3.is_int_value(expr):
            return repr(expr.as_long())
        if z3.is_true(expr) or z3.is_false(expr):
            return repr(bool(z3.is_true(expr)))
        if z3.is_const(expr):
            symbol = str(expr.decl().name())
            if expr.decl().kind() == z3.Z3_OP_UNINTERPRETED:
                if symbol in args:
                    return symbol
                if symbol in PARAMS:
                    return "{" + symbol + "}"
            raise UntranslatableFormula(f"{name} reads {symbol!r}, not one of {args}")
        known = temps.get(expr.get_id())
        if known is not None:
            return known
        kind = expr.decl().kind()
        kids = [operand(kid) for kid in expr.children()]
        if kind in _INFIX:
            code = f" {_INFIX[kind]} ".join(kids)
        elif kind == z3.Z3_OP_UMINUS:
            code = f"-{kids[0]}"
        elif kind == z3.Z3_OP_NOT:
            code = f"not {kids[0]}"
        elif kind == z3.Z3_OP_ITE:
            code = f"{kids[1]} if {kids[0]} else {kids[2]}"
        elif kind == z3.Z3_OP_IDIV and z3.is_int_value(expr.arg(1)) and expr.arg(1).as_long() > 0:
            # z3's integer division floors for a positive divisor, as ``//`` does.
            code = f"{kids[0]} // {kids[1]}"
        else:
            raise UntranslatableFormula(f"{name}: no translation for {expr.decl()} in {expr}")
        if uses[expr.get_id()] == 1:
            return code
        temp = f"t{len(temps)}"
        temps[expr.get_id()] = temp
        lines.append(f"{temp} = {code}")
        return temp

    def operand(expr: Any) -> str:
        code = emit(expr)
        atom = code.isidentifier() or code.isdigit() or code[1:-1] in PARAMS
        return code if atom else f"({code})"

    results = [operand(out) for out in outputs] if len(outputs) > 1 else [emit(outputs[0])]
    body = [f"    {line}" for line in lines]
    body.append(f"    return {', '.join(results)}")
    return f"def {name}({', '.join(args)}):\n" + "\n".join(body)


# -- the generated module ----------------------------------------------------------------


def templates() -> dict[TemplateKey, str]:
    """``template_key`` -> template, for every profile's policy and every layout."""
    return {
        template_key(profile.policy, layout): template(profile.policy, layout)
        for profile in PROFILES.values()
        for layout in COMPILED_LAYOUTS
    }


_CHUNK = 80
"""Longest string literal piece of the generated module (it stays within ruff's 100)."""


def _literal_lines(text: str) -> Iterable[str]:
    """``text`` as double-quoted literals, one a line, each cut at a space to at most
    ``_CHUNK`` characters (the templates hold no quote and no backslash)."""
    assert '"' not in text and "\\" not in text
    for line in text.splitlines(keepends=True):
        while len(line) > _CHUNK:
            cut = line.rfind(" ", len(line) - len(line.lstrip()) + 1, _CHUNK) + 1
            if cut <= 0:
                break
            yield '"' + line[:cut] + '"'
            line = line[cut:]
        yield '"' + line.replace("\n", "\\n") + '"'


def render_module(stored: dict[TemplateKey, str]) -> str:
    lines = [
        f'"""GENERATED by ``{REGENERATE}``: do not edit.',
        "",
        "The step book's transitions per ``spec.kernel.template_key`` (policy, layout, and",
        "the release's slots and lookahead there), as Python templates whose ``{name}``",
        "slots are the config numbers of ``spec.kernel.PARAMS``: the formulas",
        "``StepBook`` and the policy build on z3 symbols, translated by",
        "``proofs/compile_book.py``. ``dualbudget prove`` proves each equal to the spec's",
        "formula (check ``compiled``), so a stale module fails the proofs.",
        '"""',
        "",
        "TEMPLATES: dict[tuple[str, str, str, str], str] = {",
    ]
    for key, source in stored.items():
        quoted = ", ".join(f'"{part}"' for part in key)
        lines.append(f"    ({quoted}): (")
        lines += [f"        {literal}" for literal in _literal_lines(source)]
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dualbudget.proofs.compile_book")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"regenerate {COMPILED_BOOK.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when it is stale")
    args = parser.parse_args(argv)
    text = render_module(templates())
    if args.write:
        COMPILED_BOOK.write_text(text)
        print(f"wrote {COMPILED_BOOK}")
        return 0
    if COMPILED_BOOK.read_text() != text:
        print(f"{COMPILED_BOOK} is stale: run {REGENERATE}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
