"""``dualbudget fuzz``: its flags as the typed stage ``integration.commands.FuzzOptions``.

The command line fills what ``integration/`` may not read itself: the known findings come
from the proofs' manifest (``proofs.manifest.expected_findings``), the one list of the
policies' expected failures, narrowed to the items a live step is checked for (by the
reference and by the contract monitor); and a ``--scheduler-cls`` that names no vLLM
scheduler is bad input naming the flag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualbudget.spec.errors import BadInput

if TYPE_CHECKING:
    from dualbudget.integration.commands import FuzzOptions
    from dualbudget.integration.outcome import FindingKey

REFERENCE_CHECKED = ("C1", "C2", "C3")
"""The contract items the reference checks after every step (``spec.invariants.
step_violations``)."""


def step_checked() -> tuple[str, ...]:
    """The contract items a live step is checked for: the reference's and the contract
    monitor's (``integration.monitor.MONITORED``): the only breaks a fuzz can find."""
    from dualbudget.integration.monitor import MONITORED

    return tuple(sorted({*REFERENCE_CHECKED, *MONITORED}, key=lambda item: int(item[1:])))


OF_THE_CONFIG = ("C4-converse",)
"""Checks of a step-checked item that speak of the configs a policy accepts, never of a
step: their failures are no known finding of a live step (a refused config is void)."""


def known_findings() -> frozenset[FindingKey]:
    """(profile, layout, contract) of every expected failure of the proofs that a live
    step's checks see, and every break the manifest records outside the spec's model: a
    fuzz that meets one reports it as known and goes on. Which finding a break on such a
    key is, if any, is its cause's to say: the manifest row whose condition the run's
    config meets (``integration.outcome.known_as``)."""
    from dualbudget.proofs.manifest import load_manifest, outside_model_findings
    from dualbudget.proofs.obligations import catalog

    checked, manifest = step_checked(), load_manifest()
    proven = frozenset(
        (ob.profile, ob.layout, ob.contract)
        for ob in catalog()
        if ob.contract in checked
        and ob.check not in OF_THE_CONFIG
        and manifest.expected(ob.name) == "fails"
    )
    return proven | outside_model_findings()


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
    from dualbudget.integration.vllm_source import use_vllm_source

    use_vllm_source(options.vllm_src)  # before the class check imports vLLM
    check_scheduler_cls(options.scheduler_cls)
    return run_fuzz_stage(options)
