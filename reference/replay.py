"""Trace validation: feed a recorded trace's outside events to the reference and check
that every decision the real scheduler made is the one the reference makes.

The profile comes from the trace's vLLM version (``0.32.x`` -> ``vllm-0.32``, ``0.33.x``
-> ``vllm-0.33``) unless the caller names one. A replay that checked no step is a
failure, never a pass. Traces recorded under async scheduling are refused: the reference
does not model output placeholders (see docs/traces.md), and so are traces recorded with
prefix caching on, which the reference's subset leaves out.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import KNOWN_RELEASES, Profile, profile_named

from .events import ScheduleStep, StepRecord
from .scheduler import Scheduler
from .trace import Trace, TraceError, read_trace
from .violations import StepViolation


def profile_for_vllm_version(version: str) -> Profile:
    release = ".".join(version.split(".")[:2])
    if release not in KNOWN_RELEASES:
        raise BadInput(
            f"no profile for vLLM {version!r} (known releases: {', '.join(KNOWN_RELEASES)});"
            " name one with --profile"
        )
    return profile_named(KNOWN_RELEASES[release])


@dataclass
class ReplayResult:
    path: str
    profile: str
    steps_checked: int = 0
    divergence: tuple[int, StepRecord, StepRecord] | None = None
    """(step, recorded, reference) at the first decision that differs."""
    violations: list[StepViolation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.divergence is None and not self.violations and self.steps_checked > 0


def replay_trace(trace: Trace, profile: Profile | None = None) -> ReplayResult:
    if trace.header.async_scheduling:
        raise TraceError(
            f"trace {trace.path!r} was recorded under async scheduling; the reference does"
            " not model output placeholders, so it cannot replay it (record with"
            " async_scheduling off)"
        )
    if trace.header.enable_prefix_caching:
        raise TraceError(
            f"trace {trace.path!r} was recorded with prefix caching on, which the reference"
            " does not model (record with enable_prefix_caching off)"
        )
    chosen = profile or profile_for_vllm_version(trace.header.vllm_version)
    scheduler = Scheduler(trace.header.config, chosen, check="collect")
    result = ReplayResult(trace.path, chosen.name)
    for entry in trace.entries:
        if not isinstance(entry, StepRecord):
            scheduler.handle(entry)
            continue
        mine = scheduler.handle(ScheduleStep())
        assert mine is not None
        if mine.decision() != entry.decision():
            result.divergence = (entry.step, entry, mine)
            break
        result.steps_checked += 1
    result.violations = list(scheduler.violations)
    return result


def replay(args: argparse.Namespace) -> int:
    profile = profile_named(args.profile) if args.profile else None
    failed = False
    for path in args.traces:
        result = replay_trace(read_trace(path), profile)
        if result.divergence is not None:
            step, recorded, reference = result.divergence
            print(f"{path}: DIVERGES at step {step} (profile {result.profile})")
            print(f"  recorded:  {json.dumps(recorded.decision(), sort_keys=True)}")
            print(f"  reference: {json.dumps(reference.decision(), sort_keys=True)}")
            failed = True
        elif result.violations:
            for violation in result.violations:
                print(
                    f"{path}: the recorded scheduler broke {violation.contract} at step"
                    f" {violation.step}: {violation.message}"
                )
            failed = True
        elif result.steps_checked == 0:
            print(f"{path}: holds no step; a replay that checks nothing is not a pass")
            failed = True
        else:
            print(
                f"{path}: {result.steps_checked} steps replayed, all decisions agree"
                f" (profile {result.profile})"
            )
    sys.stdout.flush()
    return 1 if failed else 0
