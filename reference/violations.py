"""How the reference reports a broken contract item: raised, or collected per step.

The scheduler evaluates ``spec.invariants.step_violations`` (C1-C3) after every step. In
``raise`` mode the first break raises ``ContractViolation``; in ``collect`` mode every
break is kept as a ``StepViolation`` and scheduling goes on, so that known findings
(vllm-0.32 with dspark-fill-in breaks C3) can be replayed and inspected. The contract
itself is ``spec/contract.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

CheckMode = Literal["raise", "collect"]
CHECK_MODES: tuple[str, ...] = get_args(CheckMode)


VLLM_CRASHES = (
    "padded-decode-cut-by-long-prefill-threshold",
    "mamba-checkpoint-past-block-hashes",
    "pool-short-of-counted-blocks",
    "mamba-moves-a-shared-block",
    "mamba-takes-several-state-blocks",
    "negative-output-placeholders",
    "lookup-past-lookahead-hashes",
)
"""The vLLM assertions the reference mirrors, by name: where vLLM fails one, the reference
raises ``UnmirroredVllmCrash`` naming it. ``proofs/manifest.toml`` ``[crashes.NAME]``
records, under the same name, how the engine reaches one; a fuzz that mirrors a crash the
manifest does not record reports it as new."""


class UnmirroredVllmCrash(RuntimeError):
    """A state in which vLLM itself fails an assertion; the reference refuses to guess.

    ``crash`` names the assertion (one of ``VLLM_CRASHES``), so that a fuzz counts the
    crashes it mirrors by kind."""

    def __init__(self, crash: str, message: str) -> None:
        if crash not in VLLM_CRASHES:
            raise ValueError(f"unknown vLLM crash {crash!r}: VLLM_CRASHES names them")
        super().__init__(message)
        self.crash = crash


@dataclass(frozen=True)
class StepViolation:
    """A contract item broken at one step, with what is needed to inspect it."""

    step: int
    contract: str
    message: str
    step_state: Mapping[str, Any]
    """The step's ledger, charges, scheduled set and the scheduler state after it."""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "contract": self.contract,
            "message": self.message,
            "step_state": dict(self.step_state),
        }


class ContractViolation(Exception):
    """A contract item broke in a step (``raise`` mode); carries what is needed to replay it."""

    def __init__(self, violation: StepViolation, scenario: Mapping[str, Any] | None = None) -> None:
        super().__init__(
            f"contract {violation.contract} broken at step {violation.step}: {violation.message}"
        )
        self.violation = violation
        self.contract = violation.contract
        self.step = violation.step
        self.step_state = violation.step_state
        self.scenario = scenario

    def to_json(self) -> dict[str, Any]:
        return {**self.violation.to_json(), "scenario": self.scenario}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)
