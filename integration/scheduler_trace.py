"""Write the live vLLM scheduler, driven by a scenario, as a ``scheduler`` trace.

The scenario's event stream (arrivals, sampled counts, natural stops, draft proposals) is
made by the reference's ``EventDriver``, in lockstep (``lockstep.live_records``), and fed
to a real vLLM scheduler of the recording class (``recorder.RecordingScheduler``, or
``RecordingAsyncScheduler`` when the scenario's config asks for async scheduling, where
step n+1 is scheduled before step n's output is applied); what vLLM decided lands in the
trace, and ``dualbudget replay`` then checks it against the reference. With the scenario's
``enable_prefix_caching`` on, the events carry token ids and vLLM's requests hash their
blocks with vLLM's own hasher (``live.request_block_hasher``), so the trace holds vLLM's
block hashes, not the reference's: its replay takes every hit from them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from dualbudget.reference.formats.deployments import DEPLOYMENTS
from dualbudget.reference.formats.scenario import Scenario
from dualbudget.spec.config import EngineConfig, SpeculativeConfig, runs_async
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import layout_for
from dualbudget.spec.releases import Release

from .live import LiveScheduler, build_vllm_config
from .lockstep import live_records
from .recorder import NOTES_ENV, SOURCE_ENV, TRACE_ENV


def write_scheduler_trace(
    scenario: Scenario,
    path: Path,
    max_steps: int | None = None,
    notes: dict[str, str] | None = None,
) -> int:
    """Write the trace of vLLM scheduling ``scenario``; returns the number of steps."""
    from .recorder import RecordingAsyncScheduler, RecordingScheduler

    # How vLLM was made to build this method on CPU goes into the header (DSpark needs
    # model runner V2 here), so the trace never passes a workaround off as native.
    _, construction = build_vllm_config(scenario.config)
    facts = {"construction": construction.how, **(notes or {})}
    environ = {TRACE_ENV: str(path), SOURCE_ENV: "scheduler", NOTES_ENV: json.dumps(facts)}
    saved = {key: os.environ.get(key) for key in environ}
    os.environ.update(environ)
    try:
        recording = (
            RecordingAsyncScheduler if scenario.config.async_scheduling else RecordingScheduler
        )
        live = LiveScheduler(scenario.config, scheduler_cls=recording)
        records = live_records(scenario, live, max_steps)
        live.scheduler.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return len(records)


def deployment_config(
    config: EngineConfig,
    family: str,
    stand_in: str | None,
    release: Release,
    prefix_caching: bool = True,
) -> tuple[EngineConfig, dict[str, str]]:
    """``config`` (a workload's budgets and pool) run as deployment ``family`` at vLLM's
    defaults on ``release``, and the notes that say how."""
    found = [d for d in DEPLOYMENTS if d.family == family]
    if not found:
        names = ", ".join(repr(d.family) for d in DEPLOYMENTS)
        raise BadInput(f"no deployment {family!r} (the families: {names})")
    deployment = found[0]
    defaults = deployment.config(release)
    notes = {
        "deployment": f"{family} at vLLM's defaults (prefix caching on, async as the release"
        " runs the drafter): its KV cache groups and drafter replace the workload's"
    }
    kv_groups = defaults.kv_groups
    if not prefix_caching:
        notes["prefix_caching"] = (
            "off, against vLLM's default: the reference does not model this layout's prefix"
            " caching (dualbudget replay names what it refuses); Mamba groups then run in"
            " mode none, as vLLM sets them without prefix caching"
        )
        kv_groups = tuple(dataclasses.replace(g, mamba_cache_mode="none") for g in kv_groups)
    spec = defaults.speculative_config
    assert spec is not None
    if stand_in:
        check_stands_in(spec, stand_in, release)
        notes["stand_in"] = (
            f"{stand_in} K={spec.num_speculative_tokens} stands in for {spec.method}"
            f" K={spec.num_speculative_tokens}: the project's CPU environments hold no"
            f" {spec.method} model, and vLLM's scheduler treats the two alike (the same"
            " method-table row, async rule, prefix-hit drop and block-hash lookahead)"
        )
        spec = dataclasses.replace(spec, method=stand_in)
    config = dataclasses.replace(
        config,
        block_size=defaults.block_size,
        kv_groups=kv_groups,
        # The family's Mamba layers reserve their checkpoint blocks in align mode only.
        mamba_prefill_checkpoint_blocks=deployment.recorded_settings(served=False)[
            "mamba_prefill_checkpoint_blocks"
        ]
        if prefix_caching
        else 0,
        speculative_config=spec,
        async_scheduling=runs_async(spec, release),
        enable_prefix_caching=prefix_caching,
    )
    return config, notes


def check_stands_in(spec: SpeculativeConfig, stand_in: str, release: Release) -> None:
    """Refuse a stand-in drafter that ``release``'s scheduler treats otherwise than
    ``spec``'s: another method-table row, async rule, hit drop or hash lookahead."""
    method, parallel = spec.method, spec.parallel_drafting

    def treatment(name: str) -> tuple[object, ...]:
        return (
            layout_for(name, parallel, spec.dspark_layout).name,
            release.runs_async(name, parallel),
            release.drops_last_hit_block(name),
            release.num_hash_lookahead_tokens(name),
        )

    if treatment(stand_in) != treatment(method):
        raise BadInput(
            f"--stand-in {stand_in!r}: vLLM {release.version}'s scheduler treats it otherwise"
            f" than {method!r} ({treatment(stand_in)} against {treatment(method)})"
        )
