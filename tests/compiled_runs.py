"""The runs ``test_compiled_build.py`` compares, made in a process of their own: under
``DUALBUDGET_INTERPRETED=0`` the reference's compiled build makes them, under ``1`` its
sources. Prints one JSON document: which build ran; every step's record, pool and counters
of the bench's streams, the shipped example scenarios and random caching scenarios (hybrid
layouts, short pools and priorities among them); and each shipped trace's replay."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from dualbudget.integration import commands
from dualbudget.reference.compiled import build_name
from dualbudget.reference.replay import replay_trace
from dualbudget.reference.scenario import load_scenario
from dualbudget.reference.trace import read_trace

from .test_bench_workloads import PROFILES, _random_scenario, _run

ROOT = Path(__file__).resolve().parent.parent
NUM_RANDOM_SCENARIOS = 200


def main() -> None:
    scenarios = [workload for profile in PROFILES for workload in commands.bench_workloads(profile)]
    scenarios += [load_scenario(path) for path in sorted((ROOT / "examples").glob("*.json"))]
    rng = random.Random(1)
    scenarios += [_random_scenario(rng, index) for index in range(NUM_RANDOM_SCENARIOS)]
    traces = sorted((ROOT / "dualbudget" / "traces").iterdir())
    json.dump(
        {
            "build": build_name(),
            "runs": [_run(scenario) for scenario in scenarios],
            "traces": [replay_trace(read_trace(path)).to_json() for path in traces],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
