"""Steps per second of the reference, the live vLLM scheduler and lockstep, on the same
workloads, with the ratio reference/live measured in one run.

    python benchmarks/bench_live.py [--json FILE] [--profile P] [--repeat N]

The same as ``dualbudget bench`` (it runs that command, with the same options); run it
inside a vLLM environment (docs/vllm-environments.md). Timings are printed, never asserted.
"""

from __future__ import annotations

import sys

from dualbudget.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
