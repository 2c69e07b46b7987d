"""Trace validation: feed a recorded trace's outside events to the reference and check
that every decision the real scheduler made is the one the reference makes.

The profile comes from the trace's vLLM version (``spec.releases.release_of``: the
profile of the release that recorded it) unless the caller names one. A replay that
checked no step is a failure, never a pass. Where the trace recorded vLLM's free KV
blocks after a step (version 4), the reference's pool must hold as many: a block held or
freed a step early is a divergence where it happens, not only once the pool runs short.
A trace holding a setting the reference does not replay (``reference/formats/settings.py``: a
user ``max_num_active_seqs``, a KV watermark, ...) is refused naming it, and so is a
version-1 trace recorded under async scheduling, whose model outputs do not say which
step they answer, and a trace recorded with prefix caching before version 3, which holds
no block hashes to take the hits from. ``--json FILE`` writes one summary per trace
(docs/traces.md).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualbudget.spec.errors import BadInput
from dualbudget.spec.profiles import Profile, profile_named, release_profile
from dualbudget.spec.releases import RELEASE_VERSIONS, release_of

from ..async_scheduler import make_scheduler
from ..events import ScheduleStep, StepRecord
from ..formats.settings import first_unreplayed
from ..formats.trace import HASHES_FROM, VERSION, Trace, TraceError, read_trace
from ..violations import StepViolation


def profile_for_vllm_version(version: str) -> Profile:
    """The profile of the release that recorded a trace (``0.33.1`` -> ``vllm-0.33``)."""
    release = release_of(version)
    if release is None:
        raise BadInput(
            f"no profile for vLLM {version!r} (known releases: {', '.join(RELEASE_VERSIONS)});"
            " name one with --profile"
        )
    return release_profile(release)


@dataclass
class ReplayResult:
    path: str
    profile: str
    vllm_version: str = ""
    async_scheduling: bool = False
    natural_stops: int = 0
    """Requests the trace saw stop on EOS or a stop token."""
    prefix_hits: int = 0
    """Requests admitted with a prefix-cache hit, as the reference replayed them (its
    ``observed["prefix_hit"]``; 0 without prefix caching)."""
    steps_checked: int = 0
    free_blocks_checked: int = 0
    """Steps whose recorded free KV blocks the reference's pool matched."""
    divergence: tuple[int, StepRecord, StepRecord] | None = None
    """(step, recorded, reference) at the first decision that differs."""
    free_blocks_divergence: tuple[int, int, int] | None = None
    """(step, vLLM's free blocks, the reference's) at the first step whose decisions
    agree but whose pools do not."""
    violations: list[StepViolation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.divergence is None
            and self.free_blocks_divergence is None
            and not self.violations
            and self.steps_checked > 0
        )

    def to_json(self) -> dict[str, Any]:
        """One entry of ``replay --json`` (docs/traces.md)."""
        divergence = None
        if self.divergence is not None:
            step, recorded, reference = self.divergence
            divergence = {
                "step": step,
                "recorded": recorded.decision(),
                "reference": reference.decision(),
            }
        free_blocks = None
        if self.free_blocks_divergence is not None:
            step, recorded_free, reference_free = self.free_blocks_divergence
            free_blocks = {"step": step, "recorded": recorded_free, "reference": reference_free}
        return {
            "path": self.path,
            "vllm_version": self.vllm_version,
            "profile": self.profile,
            "async_scheduling": self.async_scheduling,
            "steps_checked": self.steps_checked,
            "natural_stops": self.natural_stops,
            "prefix_hits": self.prefix_hits,
            "free_blocks_checked": self.free_blocks_checked,
            "divergence": divergence,
            "free_blocks_divergence": free_blocks,
            "violations": [
                {"contract": v.contract, "step": v.step, "message": v.message}
                for v in self.violations
            ],
        }


def check_replayable(trace: Trace, profile: Profile) -> None:
    """Raise TraceError, naming the setting, for a trace the reference cannot replay."""
    header = trace.header
    if header.async_scheduling and header.version < 2:
        raise TraceError(
            f"trace {trace.path!r}: a version-1 trace recorded under async scheduling; its"
            " model outputs do not name the step they answer, so it cannot be replayed"
            f" (record it again: the recorder writes version {VERSION})"
        )
    if header.enable_prefix_caching and header.version < HASHES_FROM:
        raise TraceError(
            f"trace {trace.path!r} was recorded with enable_prefix_caching = true in version"
            f" {header.version}, which holds no block hashes to reproduce its hits (they"
            f" come with version {HASHES_FROM}: record it again)"
        )
    check_settings(trace, profile)


def check_settings(trace: Trace, profile: Profile) -> None:
    """Raise TraceError naming the first setting of the trace's header, or of one of its
    requests, that the reference does not replay: the one check of ``replay`` and of
    ``simulate --trace``."""
    header = trace.header
    unreplayed = [(first_unreplayed(header.settings, header.config, profile), "")]
    unreplayed += [
        (first_unreplayed(settings, header.config, profile), f" (request {rid!r})")
        for rid, settings in trace.request_settings.items()
    ]
    for found, where in unreplayed:
        if found is not None:
            setting, value = found
            raise TraceError(
                f"trace {trace.path!r} was recorded with {setting.name} ="
                f" {json.dumps(value)}{where}, which the reference does not model (it"
                f" replays {setting.name} = {json.dumps(setting.assumed)}"
                f"{' ' + setting.also if setting.also else ''} only)"
            )


def replay_trace(trace: Trace, profile: Profile | None = None) -> ReplayResult:
    chosen = profile or profile_for_vllm_version(trace.header.vllm_version)
    check_replayable(trace, chosen)
    scheduler = make_scheduler(trace.header.config, chosen, check="collect")
    result = ReplayResult(
        trace.path,
        chosen.name,
        vllm_version=trace.header.vllm_version,
        async_scheduling=trace.header.async_scheduling,
        natural_stops=trace.natural_stops,
    )
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
        recorded_free = trace.free_blocks.get(entry.step)
        if recorded_free is not None:
            if recorded_free != scheduler.state.free_blocks:
                result.free_blocks_divergence = (
                    entry.step,
                    recorded_free,
                    scheduler.state.free_blocks,
                )
                break
            result.free_blocks_checked += 1
    result.violations = list(scheduler.violations)
    result.prefix_hits = scheduler.observed.get("prefix_hit", 0)
    return result


@dataclass(frozen=True, kw_only=True)
class ReplayOptions:
    """One ``dualbudget replay`` run; the command line fills it from its flags."""

    traces: tuple[str, ...]
    """The trace files, replayed in this order."""
    profile: str | None = None
    """None: each trace's own, from its vLLM version (``profile_for_vllm_version``)."""
    json_path: str | None = None
    """Where one summary per trace goes (docs/traces.md); None: nowhere."""


def replay(options: ReplayOptions) -> int:
    profile = profile_named(options.profile) if options.profile else None
    failed = False
    results: list[ReplayResult] = []
    for path in options.traces:
        result = replay_trace(read_trace(path), profile)
        results.append(result)
        if result.divergence is not None:
            step, recorded, reference = result.divergence
            print(f"{path}: DIVERGES at step {step} (profile {result.profile})")
            print(f"  recorded:  {json.dumps(recorded.decision(), sort_keys=True)}")
            print(f"  reference: {json.dumps(reference.decision(), sort_keys=True)}")
            failed = True
        elif result.free_blocks_divergence is not None:
            step, recorded_free, reference_free = result.free_blocks_divergence
            print(
                f"{path}: DIVERGES at step {step} (profile {result.profile}): the decisions"
                f" agree, but vLLM's KV pool had {recorded_free} free blocks after it and"
                f" the reference's {reference_free}"
            )
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
            pools = (
                f"; vLLM's free KV blocks match the reference's at"
                f" {result.free_blocks_checked} of them"
                if result.free_blocks_checked
                else ""
            )
            print(
                f"{path}: {result.steps_checked} steps replayed, all decisions agree{pools}"
                f" (profile {result.profile})"
            )
    sys.stdout.flush()
    if options.json_path:
        document = {"traces": [result.to_json() for result in results]}
        Path(options.json_path).write_text(json.dumps(document, indent=2) + "\n")
    return 1 if failed else 0
