"""``dualbudget schedule SCENARIO.json``: the reference's step records as NDJSON.

Exit 0 when the run ends (every request finished, or ``--max-steps``); exit 1 when the
reference flags a contract violation or a stall (the finding goes to stderr with its step,
after the record of that step); bad input raises BadInput (the CLI's exit 2).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from ..formats.scenario import load_scenario
from ..scheduler import UnmirroredVllmCrash
from .driver import ScenarioRun


@dataclass(frozen=True, kw_only=True)
class ScheduleOptions:
    """One ``dualbudget schedule`` run; the command line fills it from its flags."""

    scenario: str
    """The scenario JSON file."""
    profile: str | None = None
    """None: the scenario's own profile."""
    max_steps: int | None = None
    """None: run until every request has finished."""


def schedule(options: ScheduleOptions) -> int:
    scenario = load_scenario(options.scenario)
    run = ScenarioRun(
        scenario, profile=options.profile, max_steps=options.max_steps, check="collect"
    )
    violations = run.scheduler.violations
    try:
        for record in run.records():
            print(json.dumps(record.to_json()), flush=True)
            if violations:
                for violation in violations:
                    print(
                        f"dualbudget schedule: contract {violation.contract} broken at step"
                        f" {violation.step} (profile {run.scenario.profile}): {violation.message}",
                        file=sys.stderr,
                    )
                return 1
    except UnmirroredVllmCrash as err:
        print(f"dualbudget schedule: {err}", file=sys.stderr)
        return 1
    if run.stall is not None:
        print(f"dualbudget schedule: {run.stall.message()}", file=sys.stderr)
        return 1
    return 0
