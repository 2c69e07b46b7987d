"""Record the live vLLM scheduler driven by a workload preset as a ``scheduler`` trace.

    .venv-vllm-0.33/bin/python scripts/record_scheduler_trace.py dspark-bench \\
        tests/data/traces/scheduler-dspark-bench.ndjson.gz --max-steps 300

The preset's arrivals, per-position acceptance and draft proposals drive vLLM's own
``Scheduler`` (of the recording class) on CPU; the trace header names the vLLM version and
how the method was built (DSpark only builds under model runner V2 on CPU). A name ending
in ``.gz`` is written gzip-compressed.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")


def main() -> int:
    from dualbudget.integration.scheduler_trace import write_scheduler_trace
    from dualbudget.reference.workload import preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int)
    args = parser.parse_args()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    workload = preset(args.workload)
    scenario = workload.scenario(args.seed)
    notes = {"workload": workload.name, "seed": str(args.seed), "summary": workload.summary}
    if args.max_steps:
        notes["max_steps"] = str(args.max_steps)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.ndjson"
        steps = write_scheduler_trace(scenario, plain, args.max_steps, notes)
        if args.out.name.endswith(".gz"):
            with plain.open("rb") as source, gzip.GzipFile(args.out, "wb", mtime=0) as target:
                shutil.copyfileobj(source, target)
        else:
            shutil.copy(plain, args.out)
    print(f"{args.out}: {steps} steps of {workload.name} (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
