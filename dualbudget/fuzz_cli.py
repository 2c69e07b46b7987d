"""``dualbudget fuzz``: its flags as the typed stage ``integration.commands.FuzzOptions``.

The command line fills what ``integration/`` may not read itself: the known findings come
from the proofs' manifest (``proofs.manifest.expected_findings``), the one list of the
policies' expected failures, narrowed to the items the reference checks every step; and a
``--scheduler-cls`` that names no vLLM scheduler is bad input naming the flag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualbudget.spec.errors import BadInput

if TYPE_CHECKING:
    from dualbudget.integration.commands import FuzzOptions
    from dualbudget.integration.outcome import FindingKey

STEP_CHECKED = ("C1", "C2", "C3")
"""The contract items the reference checks after every step (``spec.invariants.
step_violations``): the only breaks a fuzz can find."""


def known_findings() -> frozenset[FindingKey]:
    """(profile, layout, contract) of every expected failure of the proofs that the
    reference's per-step check sees: a fuzz that meets one reports it and goes on."""
    from dualbudget.proofs.manifest import expected_findings

    return frozenset(key for key in expected_findings() if key[2] in STEP_CHECKED)


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


def fuzz(options: FuzzOptions) -> int:
    """The fuzz stage (or, with ``options.replay``, one scenario's lockstep), after the
    check of ``--scheduler-cls``."""
    from dualbudget.integration.commands import run_fuzz_stage

    check_scheduler_cls(options.scheduler_cls)
    return run_fuzz_stage(options)
