"""Units for the executor tests: module-level, so that a worker process or a Ray actor
imports them by name."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from dualbudget.campaign.executor import cancelled
from dualbudget.integration.fuzz import UnitPlan
from dualbudget.integration.outcome import UnitRun

# Local workers start from a forkserver, which takes this session's sys.path when it
# starts; pytest's importlib mode puts no entry there from which ``tests`` imports by name.
# Imported at collection, before any test starts a forkserver.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)


def square(x: int) -> int:
    # Later units finish first: map must still yield in unit order.
    time.sleep(0.01 * (5 - x % 5))
    return x * x


def fails_at_three(x: int) -> int:
    if x == 3:
        raise ValueError("three is refused")
    return x


def dies_once(unit: tuple[int, str]) -> int:
    """Kills its own worker the first time (a marker file says it did): a worker lost
    mid-unit, as a killed process or a lost Ray node."""
    value, marker = unit
    if not Path(marker).exists():
        Path(marker).write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    return value


def waits_for_cancel(x: int) -> bool:
    """Unit 0 returns at once; later units wait until told that unit 0 stopped the map."""
    if x == 0:
        return False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if cancelled():
            return True
        time.sleep(0.01)
    return False


def logged_square(unit: tuple[int, str]) -> int:
    """Appends its value to a log file (one line per execution) and is slow enough for
    a driver to be killed between two units."""
    value, log = unit
    time.sleep(0.2)
    with open(log, "a") as out:
        out.write(f"{value}\n")
    return value * value


def process_fingerprint() -> str:
    """Differs in every process: a worker's never equals the driver's."""
    return f"process {os.getpid()}"


def fuzz_unit(plan: UnitPlan) -> UnitRun:
    """A fuzz unit that runs no vLLM: counts as ``run_plan`` would (its examples, steps
    and one coverage event by seed), diverges at its first example in seed 1's first
    unit, and logs its id (one line per execution) in ``plan.out_dir``/ran.log."""
    from dualbudget.integration.coverage import EVENT_NAMES
    from dualbudget.integration.fuzz import unit_id
    from dualbudget.integration.lockstep import Divergence

    run = UnitRun(
        plan.profile, plan.layout, plan.aim, plan.seed, Path(plan.out_dir), plan.known_findings
    )
    time.sleep(0.02)
    run.examples, run.steps = plan.examples, 3 * plan.examples
    run.coverage = dict.fromkeys(EVENT_NAMES, 0)
    run.coverage[EVENT_NAMES[0]] = plan.seed + 1
    if plan.seed == 1 and plan.index == 0:
        run.examples, run.steps = 1, 2
        run.divergences.append(Divergence("decision", 2, {"x": 1}, {"x": 2}, seed=plan.seed))
    with open(Path(plan.out_dir) / "ran.log", "a") as log:
        log.write(unit_id(plan) + "\n")
    return run
