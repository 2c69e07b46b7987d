"""Why a mutant is equivalent: the written reasons, and z3 on the arithmetic ones.

A mutant the fuzz does not kill is a survivor unless a ``Claim`` here names it (by its
stable name, ``Site.name``) with the reason it cannot change a decision. Where the reason
is arithmetic, the claim states it as a formula over integers: ``holds`` under
``assume`` (Python expression syntax: ``+ - * //``, comparisons, ``and or not``,
``min``/``max``, ``x if c else y``), and z3 must prove it; a claim z3 refutes fails the
run with z3's counterexample. A claimed mutant the fuzz kills fails the run too: the
reason was wrong.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dualbudget.spec.releases import RELEASE_VERSIONS, release_of


@dataclass(frozen=True)
class Claim:
    mutant: str
    reason: str
    versions: tuple[str, ...] = RELEASE_VERSIONS
    """The vLLM releases (``Release.version``) whose source the claim is about."""
    assume: tuple[str, ...] = ()
    holds: str | None = None
    """The arithmetic of ``reason``, when it has one: z3 proves ``assume -> holds``."""

    def applies_to(self, vllm_version: str) -> bool:
        release = release_of(vllm_version)
        return release is not None and release.version in self.versions


class ClaimRefuted(Exception):
    """z3 found integers where a claim's ``assume`` holds and its ``holds`` does not."""


_ADAPTIVE = (
    "Equivalent within dualbudget's declared subset only, not as a program: the change is"
    " in the adaptive long-prefill threshold, code that runs only with vLLM's"
    " SchedulerConfig.long_prefill_token_threshold_adaptive on. Its default is off, the"
    " live adapter never sets it (integration/live.py) and the reference does not mirror"
    " it, so in every config the fuzz can draw the guard `long_prefill_token_threshold > 0"
    " and adaptive` is false before and after the change; with the adaptive threshold on,"
    " the mutant would cut prefills differently, and no fuzz here could tell."
)
_ZERO_GRANT = (
    " The grant min(need, token_budget, input_budget - draft_slots), capped at"
    " max_model_len - computed - 1 (>= 0 for a running request), is then 0, and a request"
    " granted 0 tokens is skipped (vLLM's `num_new_tokens == 0` branch: nothing scheduled,"
    " no budget charged), so the extra turns of the loop change no decision."
)
_SAME_VALUE = (
    "At need == long_prefill_token_threshold the changed test also sets need to the"
    " threshold, which is its value already."
)

CLAIMS: tuple[Claim, ...] = (
    Claim("shift-boundary/schedule/long_prefill_token_threshold/2", _ADAPTIVE),
    Claim("drop-term/schedule/input_budget+long_prefill_token_threshold/1", _ADAPTIVE),
    Claim("drop-term/schedule/input_budget+long_prefill_token_threshold/2", _ADAPTIVE),
    Claim(
        "shift-boundary/schedule/token_budget/1",
        "The RUNNING loop's `token_budget > 0` as `>= 0` only adds turns at"
        " token_budget == 0." + _ZERO_GRANT,
        assume=("token_budget == 0", "need >= 0", "input_budget > draft_slots", "room >= 0"),
        holds="min(min(need, token_budget, input_budget - draft_slots), room) == 0",
    ),
    Claim(
        "shift-boundary/schedule/draft_slots+input_budget/1",
        "The RUNNING loop's stop `input_budget <= draft_slots` as `<` only goes on at"
        " input_budget == draft_slots, where the budgets never change again." + _ZERO_GRANT,
        assume=("input_budget == draft_slots", "need >= 0", "token_budget > 0", "room >= 0"),
        holds="min(min(need, token_budget, input_budget - draft_slots), room) == 0",
    ),
    Claim(
        "skip-break/schedule/draft_slots+input_budget/1",
        "Without the RUNNING loop's stop at `input_budget <= draft_slots` the loop goes on"
        " with input_budget - draft_slots <= 0: the grant is then <= 0, and vLLM's"
        " _reserve_prefill_lookahead, which schedule() applies to every running grant,"
        " returns max(grant, 0) = 0: the request is skipped (`num_new_tokens == 0`), no"
        " budget changes, and so every later request of the loop is skipped alike.",
        assume=("input_budget <= draft_slots", "need >= 0", "token_budget > 0", "room >= 0"),
        holds="max(min(min(need, token_budget, input_budget - draft_slots), room), 0) == 0",
    ),
    Claim(
        "shift-boundary/schedule/long_prefill_token_threshold/4",
        _SAME_VALUE + " (RUNNING loop)",
        holds="(t if 0 < t <= need else need) == (t if 0 < t < need else need)",
    ),
    Claim(
        "shift-boundary/schedule/long_prefill_token_threshold/6",
        _SAME_VALUE + " (WAITING loop)",
        holds="(t if 0 < t <= need else need) == (t if 0 < t < need else need)",
    ),
)
"""Keyed by ``Site.name``; the same sites, by name, in every release recorded."""


def claims_for(vllm_version: str, claims: Iterable[Claim] = CLAIMS) -> dict[str, Claim]:
    return {c.mutant: c for c in claims if c.applies_to(vllm_version)}


def counterexample(claim: Claim) -> str | None:
    """None when z3 proves the claim's arithmetic (or it has none); else a model."""
    if claim.holds is None:
        return None
    import z3

    symbols: dict[str, Any] = {}
    premises = [_z3(ast.parse(a, mode="eval").body, symbols) for a in claim.assume]
    goal = _z3(ast.parse(claim.holds, mode="eval").body, symbols)
    solver = z3.Solver()
    solver.add(*premises, z3.Not(goal))
    verdict = solver.check()
    if verdict == z3.unsat:
        return None
    if verdict == z3.sat:
        model = solver.model()
        values = ", ".join(
            f"{n} = {model.eval(s, model_completion=True)}" for n, s in symbols.items()
        )
        return values or "(any values)"
    return f"z3 answered {verdict}"


def check(claims: Iterable[Claim]) -> None:
    """Raise ``ClaimRefuted`` naming every claim z3 refutes."""
    refuted = []
    for claim in claims:
        found = counterexample(claim)
        if found is not None:
            refuted.append(
                f"{claim.mutant}: z3 refutes {claim.holds!r} under {claim.assume}: {found}"
            )
    if refuted:
        raise ClaimRefuted("; ".join(refuted))


def _z3(node: ast.expr, symbols: dict[str, Any]) -> Any:
    import z3

    def go(n: ast.expr) -> Any:
        return _z3(n, symbols)

    if isinstance(node, ast.Name):
        if node.id not in symbols:
            symbols[node.id] = z3.Int(node.id)
        return symbols[node.id]
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        return z3.BoolVal(node.value) if isinstance(node.value, bool) else z3.IntVal(node.value)
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub):
            return -go(node.operand)
        if isinstance(node.op, ast.Not):
            return z3.Not(go(node.operand))
    if isinstance(node, ast.BinOp):
        left, right = go(node.left), go(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.FloorDiv):
            # z3's integer division rounds down for a positive divisor, as Python's does;
            # a claim dividing must assume its divisor positive.
            return left / right
    if isinstance(node, ast.BoolOp):
        parts = [go(v) for v in node.values]
        return z3.And(*parts) if isinstance(node.op, ast.And) else z3.Or(*parts)
    if isinstance(node, ast.Compare):
        terms = [go(node.left), *(go(c) for c in node.comparators)]
        links = [_compare(op, a, b) for op, a, b in zip(node.ops, terms, terms[1:], strict=False)]
        return z3.And(*links) if len(links) > 1 else links[0]
    if isinstance(node, ast.IfExp):
        return z3.If(go(node.test), go(node.body), go(node.orelse))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("min", "max")
        and node.args
    ):
        values = [go(a) for a in node.args]
        out = values[0]
        for v in values[1:]:
            out = z3.If(v < out, v, out) if node.func.id == "min" else z3.If(v > out, v, out)
        return out
    raise ValueError(f"a claim's formula cannot hold {ast.unparse(node)!r}")


def _compare(op: ast.cmpop, a: Any, b: Any) -> Any:
    table: dict[type[ast.cmpop], Any] = {
        ast.Lt: lambda: a < b,
        ast.LtE: lambda: a <= b,
        ast.Gt: lambda: a > b,
        ast.GtE: lambda: a >= b,
        ast.Eq: lambda: a == b,
        ast.NotEq: lambda: a != b,
    }
    if type(op) not in table:
        raise ValueError(f"a claim's formula cannot compare with {type(op).__name__}")
    return table[type(op)]()
