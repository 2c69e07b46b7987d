"""A campaign's driver as its own process, for tests/unit/test_campaign.py to kill: runs
``logged_square`` over ``units`` units kept in the campaign DIR (argv: DIR LOG UNITS)."""

from __future__ import annotations

import json
import sys

from dualbudget.campaign.executor import LocalExecutor
from dualbudget.campaign.store import Campaign, map_resumed

from .executor_units import logged_square

KEY = "logged_square"


def run(directory: str, log: str, count: int) -> tuple[list[int], int]:
    """(the results in unit order, the units this call ran)."""
    units = [(i, log) for i in range(count)]
    with Campaign(directory, KEY) as campaign, LocalExecutor(1) as executor:
        results = list(
            map_resumed(
                executor, campaign, logged_square, units, [f"u{i:03}" for i in range(count)]
            )
        )
        return results, campaign.ran


if __name__ == "__main__":
    results, ran = run(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    print(json.dumps({"results": results, "ran": ran}))
