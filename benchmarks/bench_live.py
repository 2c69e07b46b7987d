"""Steps per second of the reference, the live vLLM scheduler and lockstep, on the same
workloads, with the ratio reference/live measured in one run.

    python benchmarks/bench_live.py [--json FILE] [--profile P]

The same as ``dualbudget bench``; run it inside a vLLM environment
(docs/vllm-environments.md). Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys

from dualbudget.integration.commands import bench
from dualbudget.spec.profiles import PROFILE_NAMES


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--profile", choices=PROFILE_NAMES)
    return bench(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
