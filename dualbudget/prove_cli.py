"""``dualbudget prove`` on the executor seam: the reach queries of ``--reach`` as units.

``proofs/`` imports only ``spec/``, so the executor (``campaign.executor``) is built here,
in the command layer, and its ``map`` handed to ``proofs.commands.prove``; the units and
the function that runs one are the proofs' own (``reach.reach_units``,
``commands.reach_unit``). Results come back in unit order, so the report is the same for
any executor and width.
"""

from __future__ import annotations

from dualbudget.proofs.commands import ProveOptions
from dualbudget.proofs.commands import prove as prove_here
from dualbudget.spec.errors import BadInput


def prove(options: ProveOptions) -> int:
    from dualbudget.campaign.executor import (
        EXECUTORS,
        ExecutorUnavailable,
        UnitFailed,
        executor_for,
    )

    if not options.reach:
        return prove_here(options)
    if options.executor not in EXECUTORS:
        raise BadInput(f"--executor: unknown {options.executor!r} (known: {', '.join(EXECUTORS)})")
    if options.jobs is not None and (
        options.jobs < 0 or (options.jobs == 0 and options.executor == "local")
    ):
        raise BadInput("--jobs: must be >= 1 (0: every CPU of a Ray cluster)")
    if options.jobs is not None:
        width = options.jobs
    elif options.executor == "local":
        from dualbudget.proofs.runner import workers

        width = workers()
    else:
        width = 0
    try:
        with executor_for(options.executor, width, options.ray_address) as executor:
            return prove_here(options, executor.map)
    except UnitFailed as err:
        raise BadInput(f"--reach: {err}") from None
    except ExecutorUnavailable as err:
        raise BadInput(f"--executor {options.executor}: {err}") from None
