"""``dualbudget fuzz``: its flags as the typed stage ``integration.commands.FuzzOptions``.

The command line fills what ``integration/`` may not read itself: the known findings come
from the proofs' manifest (``proofs.manifest.expected_findings``), the one list of the
policies' expected failures, narrowed to the items the reference checks every step.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUT_NAMES

if TYPE_CHECKING:
    from dualbudget.integration.machine import FindingKey

STEP_CHECKED = ("C1", "C2", "C3")
"""The contract items the reference checks after every step (``spec.invariants.
step_violations``): the only breaks a fuzz can find."""


def known_findings() -> frozenset[FindingKey]:
    """(profile, layout, contract) of every expected failure of the proofs that the
    reference's per-step check sees: a fuzz that meets one reports it and goes on."""
    from dualbudget.proofs.manifest import expected_findings

    return frozenset(key for key in expected_findings() if key[2] in STEP_CHECKED)


def default_jobs() -> int:
    """The fuzz's worker processes when ``--jobs`` is not given: one per core."""
    return os.cpu_count() or 1


def check_scheduler_cls(path: str | None) -> None:
    """Refuse a ``--scheduler-cls`` that names no vLLM ``Scheduler`` subclass (bad input,
    one line naming the flag). Without vLLM there is nothing to check it against: the
    stage itself then reports the missing vLLM."""
    from dualbudget.integration.live import (
        SchedulerClassError,
        installed_vllm_version,
        scheduler_class,
    )

    if path is None or installed_vllm_version() is None:
        return
    try:
        scheduler_class(path)
    except SchedulerClassError as err:
        raise BadInput(f"--scheduler-cls {err}") from None


def fuzz(args: argparse.Namespace) -> int:
    from dualbudget.integration.commands import (
        DEFAULT_OUT_DIR,
        FuzzOptions,
        replay_scenario,
        run_fuzz_stage,
    )

    check_scheduler_cls(args.scheduler_cls)
    if args.replay:
        return replay_scenario(args.replay, args.profile, args.scheduler_cls)
    options = FuzzOptions(
        examples=args.examples,
        seed=args.seed,
        known_findings=known_findings(),
        jobs=args.jobs or default_jobs(),
        profile=args.profile,
        max_seconds=args.max_seconds,
        json_path=args.json,
        out_dir=args.out_dir or DEFAULT_OUT_DIR,
        layouts=tuple(args.layout or LAYOUT_NAMES),
        coverage_gate=not args.no_coverage_gate,
        scheduler_cls=args.scheduler_cls,
        top_up_rounds=args.top_up_rounds,
    )
    return run_fuzz_stage(options)
