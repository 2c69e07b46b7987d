"""How the reference reports a broken contract item: raised, or collected per step.

The scheduler evaluates ``spec.invariants.step_violations`` (C1-C3) after every step. In
``raise`` mode the first break raises ``ContractViolation``; in ``collect`` mode every
break is kept as a ``StepViolation`` and scheduling goes on, so that known findings
(vllm-0.32 with dspark-fill-in breaks C3) can be replayed and inspected. The contract
itself is ``spec/contract.py``.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, get_args

CheckMode = Literal["raise", "collect"]
CHECK_MODES: tuple[str, ...] = get_args(CheckMode)


@dataclass(frozen=True)
class VllmRaises:
    """What vLLM raises where it fails one of its assertions: the exception's class and
    the module (a path under the ``vllm`` package, or a folder of it) of the innermost
    frame of vLLM's own code."""

    exception: str
    module: str

    def __str__(self) -> str:
        return f"{self.exception} in {self.module}"


VLLM_CRASHES: Mapping[str, VllmRaises] = MappingProxyType(
    {
        "padded-decode-cut-by-long-prefill-threshold": VllmRaises(
            "AssertionError", "vllm/v1/core/sched/scheduler.py"
        ),
        "mamba-checkpoint-past-block-hashes": VllmRaises(
            "AssertionError", "vllm/v1/core/block_pool.py"
        ),
        "pool-short-of-counted-blocks": VllmRaises("ValueError", "vllm/v1/core/block_pool.py"),
        "mamba-moves-a-shared-block": VllmRaises(
            "AssertionError", "vllm/v1/core/single_type_kv_cache_manager.py"
        ),
        "mamba-takes-several-state-blocks": VllmRaises(
            "AssertionError", "vllm/v1/core/single_type_kv_cache_manager.py"
        ),
        # The assertion sits in the scheduler or its async subclass, by release.
        "negative-output-placeholders": VllmRaises("AssertionError", "vllm/v1/core/sched/"),
        "lookup-past-lookahead-hashes": VllmRaises(
            "IndexError", "vllm/v1/core/single_type_kv_cache_manager.py"
        ),
    }
)
"""The vLLM assertions the reference mirrors, by name, with what vLLM raises there: where
vLLM fails one, the reference raises ``UnmirroredVllmCrash`` naming it, and a lockstep
counts the two as one mirrored crash only when vLLM's exception is the one named here
(``raised_as``). ``proofs/manifest.toml`` ``[crashes.NAME]`` records, under the same name,
how the engine reaches one; a fuzz that mirrors a crash the manifest does not record
reports it as new."""


def raised_as(err: BaseException, crash: str) -> bool:
    """Whether ``err`` is what vLLM raises where it fails the assertion ``crash``."""
    expected = VLLM_CRASHES[crash]
    if type(err).__name__ != expected.exception:
        return False
    frames = traceback.extract_tb(err.__traceback__)
    in_vllm = [
        f.filename.replace("\\", "/").rpartition("/vllm/")
        for f in frames
        if "/vllm/" in f.filename.replace("\\", "/")
    ]
    if not in_vllm:
        return False
    _, _, rest = in_vllm[-1]
    return f"vllm/{rest}".startswith(expected.module)


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
