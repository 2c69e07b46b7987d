"""Wall time of the proof suite: ``dualbudget prove`` without and with ``--mutants``.

Prints the measured times (targets: under 60 s, and under 10 minutes with mutants, on a
2-core machine); asserts nothing. Run: ``.venv/bin/python benchmarks/bench_proofs.py``
(``--no-mutants`` to skip the long part).
"""

from __future__ import annotations

import sys
import time

from dualbudget.proofs.manifest import load_manifest
from dualbudget.proofs.obligations import catalog
from dualbudget.proofs.runner import run, run_mutants, workers


def main(argv: list[str]) -> int:
    manifest = load_manifest()
    obligations = catalog()
    print(f"{len(obligations)} obligations, {workers()} worker processes")
    t0 = time.perf_counter()
    outcomes = run(obligations, manifest, witnesses=False)
    proofs = time.perf_counter() - t0
    t0 = time.perf_counter()
    with_witnesses = run(obligations, manifest)
    full = time.perf_counter() - t0
    by_family: dict[str, float] = {}
    for ob, o in zip(obligations, outcomes, strict=True):
        by_family[ob.family] = by_family.get(ob.family, 0.0) + o.seconds
    print(f"proofs alone:           {proofs:7.1f} s wall")
    print(f"proofs + witnesses:     {full:7.1f} s wall (target < 60 s)")
    for family, seconds in sorted(by_family.items(), key=lambda kv: -kv[1]):
        print(f"  solver time {family:<10} {seconds:7.1f} s")
    print(f"mismatches: {sum(not o.matches for o in with_witnesses)}")
    if "--no-mutants" not in argv:
        t0 = time.perf_counter()
        mutants = run_mutants(manifest)
        spent = time.perf_counter() - t0
        killed = sum(bool(m.killed_by) for m in mutants)
        print(f"mutants:                {spent:7.1f} s wall (target < 600 s)")
        print(f"mutants killed:         {killed}/{len(mutants)}")
        print(f"prove --mutants total:  {full + spent:7.1f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
