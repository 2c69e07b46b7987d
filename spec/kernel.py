"""The step book's transitions on one config, compiled from the formulas its own code
builds.

The reference asks the book about every request of every step: is the step exhausted,
how many tokens does this request get, what does scheduling it leave in the ledger. Run
through the generic code (ledger and charge objects, method chains, ``arith`` dispatch),
those three questions cost more than everything else the reference does for a request.

So the reference runs their formulas instead. Once per policy and method layout,
``StepBook``'s own ``exhausted``, ``grant``, ``schedule`` and ``preempt`` (and through
them the policy's methods, ``room`` among them) run on z3 symbols for the ledger, the
request and the config numbers, as the proofs run them: the very formulas the proofs
check. Each formula is translated node for node into Python source, the config numbers
left as slots; ``compile_kernel`` fills in one config's numbers and compiles it (under a
millisecond). Nothing is restated by hand: a change to a policy or to the book reaches the
kernel when it is next compiled, and a formula with a construct the translator does not
know is refused, never approximated. The translator is tested, not proved
(``tests/test_spec_kernel.py``).

The kernel's functions take and return plain ints (the ledger as ``token_budget,
input_budget``); the caller keeps the book's record (which request was scheduled with how
many tokens) and must, as ``StepBook.schedule`` demands, only take ``q >= 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .book import StepBook
from .methods import MethodLayout
from .policies import Ledger, Policy, StepParams

# The symbols the kernel's functions take, in the book's vocabulary.
TOKEN_BUDGET, INPUT_BUDGET, NEED, Q = "token_budget", "input_budget", "need", "q"
_MAX_CACHED = 4096
"""Kernels (and templates) kept; a fuzz run meets a few hundred configs."""


class UntranslatableFormula(ValueError):
    """A book formula uses a construct (or a symbol) the translator does not know."""


@dataclass(frozen=True)
class BudgetKernel:
    """A profile's budget rules on one config, as functions of ints."""

    opened: tuple[int, int]
    """The ledger of an empty step: ``(token_budget, input_budget)``."""
    max_active_requests: int
    exhausted: Callable[[int, int], bool]
    """``(token_budget, input_budget) -> StepBook.exhausted()``."""
    room: Callable[[int, int], int]
    """``(token_budget, input_budget) -> policy.room``."""
    grant: Callable[[int, int, int], int]
    """``(token_budget, input_budget, need) -> StepBook.grant(need)``."""
    take: Callable[[int, int, int], tuple[int, int, bool]]
    """``(token_budget, input_budget, q) ->`` the ledger after ``StepBook.schedule(_, q)``,
    and whether the book is then exhausted (the scheduler's next question, in one call)."""
    give_back: Callable[[int, int, int], tuple[int, int]]
    """``(token_budget, input_budget, q) ->`` the ledger after preempting a request the
    book charged for ``q`` tokens (``StepBook.preempt``)."""
    source: str
    """The generated Python, for whoever wants to read what runs."""


def compile_kernel(policy: Policy, p: StepParams) -> BudgetKernel:
    """The kernel of ``policy`` on the concrete ``p`` (cached per policy and config)."""
    values = {name: getattr(p, name) for name in PARAMS}
    if not all(type(value) is int for value in values.values()):
        raise TypeError(f"compile_kernel needs a concrete config, got {values}")
    key = (policy, p.layout.name, *values.values())
    kernel = _KERNELS.get(key)
    if kernel is None:
        if len(_KERNELS) >= _MAX_CACHED:
            _KERNELS.clear()
        source = _template(policy, p.layout).format_map(
            {name: repr(value) if value >= 0 else f"({value})" for name, value in values.items()}
        )
        namespace: dict[str, Any] = {}
        exec(compile(source, f"<budget kernel: {policy.name}>", "exec"), namespace)
        opened = policy.open(p)
        kernel = _KERNELS[key] = BudgetKernel(
            opened=(int(opened.token_budget), int(opened.input_budget)),
            max_active_requests=int(policy.max_active_requests(p)),
            exhausted=namespace["exhausted"],
            room=namespace["room"],
            grant=namespace["grant"],
            take=namespace["take"],
            give_back=namespace["give_back"],
            source=source,
        )
    return kernel


# The config numbers a formula may read; the template leaves a ``{name}`` slot for each.
PARAMS = (
    "max_num_batched_tokens",
    "max_num_scheduled_tokens",
    "max_num_seqs",
    "num_speculative_tokens",
)
_KERNELS: dict[tuple[Any, ...], BudgetKernel] = {}
_TEMPLATES: dict[tuple[Policy, str], str] = {}


def _template(policy: Policy, layout: MethodLayout) -> str:
    """The kernel's source for every config of one layout, the config numbers as slots.

    The formulas are built as the proofs build them, with symbolic config numbers, once
    per policy and layout; a config fills in its numbers (which Python's compiler folds).
    """
    template = _TEMPLATES.get((policy, layout.name))
    if template is not None:
        return template
    import z3

    b, s, m, k = z3.Ints(" ".join(PARAMS))
    p = StepParams(b, s, m, k, layout)
    tb, ib, need, q = z3.Ints(f"{TOKEN_BUDGET} {INPUT_BUDGET} {NEED} {Q}")
    ledger = Ledger(tb, ib)

    def book() -> StepBook:
        return StepBook(policy, p, ledger)

    scheduled = book()
    scheduled.schedule("r", q)
    charged = StepBook(policy, p, ledger, {"r": policy.charge(p, q)})
    charged.preempt("r")
    ledger_vars = [TOKEN_BUDGET, INPUT_BUDGET]
    functions = [
        ("exhausted", ledger_vars, [book().exhausted()]),
        ("room", ledger_vars, [policy.room(p, ledger)]),
        ("grant", [*ledger_vars, NEED], [book().grant(need)]),
        (
            "take",
            [*ledger_vars, Q],
            [scheduled.ledger.token_budget, scheduled.ledger.input_budget, scheduled.exhausted()],
        ),
        (
            "give_back",
            [*ledger_vars, Q],
            [charged.ledger.token_budget, charged.ledger.input_budget],
        ),
    ]
    template = "\n\n".join(_function_source(name, args, outs) for name, args, outs in functions)
    if len(_TEMPLATES) >= _MAX_CACHED:
        _TEMPLATES.clear()
    _TEMPLATES[(policy, layout.name)] = template
    return template


def _function_source(name: str, args: list[str], outputs: list[Any]) -> str:
    """``def name(args): ...`` computing ``outputs``: a node used once is written in place,
    a node shared by several (z3 builds ``min(a, b)`` as ``If(b < a, b, a)``) is computed
    once into a temporary, leaves first."""
    import z3

    infix = {
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

    def is_leaf(expr: Any) -> bool:
        return not z3.is_expr(expr) or z3.is_const(expr)

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
            return repr(z3.is_true(expr))
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
        if kind in infix:
            code = f" {infix[kind]} ".join(kids)
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
