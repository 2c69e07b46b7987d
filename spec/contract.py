"""The contract C1-C6: what every budget policy must guarantee, every step.

This module is the contract's one home. ``CONTRACT`` holds each item as data (its id, its
name and one sentence); the README, the proofs' README, the design document and the
design-review report render their statements from it (``contract_markdown``), and a test
fails when a rendered copy drifts. The predicates that state each item over ``arith`` (so
that they run on ints in the reference and on z3 terms in the proofs) are in
``invariants``, their docstrings opening with the item's id (tests/test_contract.py pins
each on hand-worked cases). Each obligation of the proofs names its item in its
``contract`` field; docs/design.md §2 maps every item to its predicates, obligations and
tests, generated from those homes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContractItem:
    id: str
    """``C1`` .. ``C6``."""
    name: str
    statement: str
    """One sentence, in the vocabulary of vLLM's config and of the method table."""
    kind: str
    """``safety`` (broken: a wrong or unsafe step) or ``efficiency`` (broken: capacity
    left unused, never a crash)."""


CONTRACT: tuple[ContractItem, ...] = (
    ContractItem(
        "C1",
        "nonnegative",
        "every budget the policy keeps is >= 0 after every decision.",
        "safety",
    ),
    ContractItem(
        "C2",
        "conservation",
        "each budget equals its opening value minus what the requests scheduled in the step"
        " were charged, and a preempted request's refund is exactly its charge, given once.",
        "safety",
    ),
    ContractItem(
        "C3",
        "buffer peak",
        "the target rows T and the true draft rows D = sum C(q_i) satisfy T <= S <= B and"
        " D <= B, so the step's buffer peak max(T, D) fits max_num_batched_tokens B.",
        "safety",
    ),
    ContractItem(
        "C4",
        "progress",
        "a config the policy accepts can always schedule at least one token of a runnable"
        " request in an empty step (no budget deadlock).",
        "safety",
    ),
    ContractItem(
        "C5",
        "tightness",
        "a request is granted fewer tokens than it needs only when one more token would break"
        " C3 or another hard limit (max_num_seqs, max_num_scheduled_tokens).",
        "efficiency",
    ),
    ContractItem(
        "C6",
        "dominance",
        "on the same queue in the same order, a policy that relaxes another schedules at"
        " least as many tokens and at least as many requests.",
        "efficiency",
    ),
)
CONTRACT_IDS: tuple[str, ...] = tuple(item.id for item in CONTRACT)


def contract_item(contract_id: str) -> ContractItem:
    for item in CONTRACT:
        if item.id == contract_id:
            return item
    raise KeyError(f"unknown contract item {contract_id!r} (known: {', '.join(CONTRACT_IDS)})")


def contract_markdown() -> str:
    """The contract as a Markdown list, one item a line: the text every document shows."""
    return "".join(f"- **{item.id} {item.name}**: {item.statement}\n" for item in CONTRACT)
