"""``dualbudget mutate``: its flags as the typed stage ``integration.mutate.MutateOptions``
(the known findings, as for ``fuzz``, from the proofs' manifest: ``fuzz_cli``)."""

from __future__ import annotations

import argparse

from dualbudget.spec.errors import BadInput


def mutate(args: argparse.Namespace) -> int:
    from dualbudget.fuzz_cli import default_jobs, known_findings
    from dualbudget.integration.mutate import DEFAULT_EXAMPLES, MutateOptions, run_mutate_stage
    from dualbudget.integration.mutation.operators import OPERATORS

    operators = tuple(args.operators or OPERATORS)
    unknown = sorted(set(operators) - set(OPERATORS))
    if unknown:
        raise BadInput(f"--operators: unknown {', '.join(unknown)} (known: {', '.join(OPERATORS)})")
    return run_mutate_stage(
        MutateOptions(
            known_findings=known_findings(),
            jobs=args.jobs or default_jobs(),
            operators=operators,
            examples=args.examples or DEFAULT_EXAMPLES,
            seed=args.seed,
            profile=args.profile,
            json=args.json,
            out_dir=args.out_dir or "mutants",
        )
    )
