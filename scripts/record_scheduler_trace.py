"""Record the live vLLM scheduler driven by a workload preset as a ``scheduler`` trace.

    .venv-vllm-0.33/bin/python scripts/record_scheduler_trace.py dspark-bench \\
        dualbudget/traces/scheduler-dspark-bench.ndjson.gz --max-steps 300

The preset's arrivals, per-position acceptance and draft proposals drive vLLM's own
``Scheduler`` (of the recording class) on CPU; the trace header names the vLLM version and
how the method was built (DSpark only builds under model runner V2 on CPU). A name ending
in ``.gz`` is written gzip-compressed.

``--async-scheduling`` drives vLLM's ``AsyncScheduler`` instead, as the engine does (step
n+1 scheduled before step n's output is applied): the CPU engine forces async scheduling
off, so async traces come from here. ``--stop-rate P`` makes each request that samples in
a step stop there (EOS or a stop token) with probability ``P``, at a token drawn from the
ones it sampled; ``--num-gpu-blocks N`` shrinks the KV pool so that requests preempt::

    .venv-vllm-0.32/bin/python scripts/record_scheduler_trace.py chat-poisson \
        dualbudget/traces/scheduler-async-0.32-chat-poisson.ndjson.gz --max-steps 300 \
        --async-scheduling --stop-rate 0.03 --num-gpu-blocks 130

``--deployment FAMILY`` (a family of ``reference/formats/deployments.py``, by name) records it
with that family's vLLM defaults: its KV cache groups (one ``KVCacheGroupSpec`` each),
drafter and K, async scheduling as the installed release runs that drafter, prefix caching
on (Mamba in ``align`` mode, as vLLM sets it then). ``--stand-in METHOD`` builds another
drafter of the same K where the family's cannot be built here (MTP needs a model with an
MTP module), and the header's notes say so. ``--no-prefix-caching`` turns vLLM's default
off (a Mamba group then runs in mode ``none``, as vLLM sets it), for a layout whose prefix
caching the reference does not model; the notes say that too.
``--prefix-cache-retention-interval N`` builds vLLM's ``KVCacheConfig`` with that
retention (the engine's default is 0; a ``KVCacheConfig`` built alone holds None)::

    .venv-vllm-0.33/bin/python scripts/record_scheduler_trace.py chat-system-prompt \
        dualbudget/traces/scheduler-async-0.33-deepseek-mtp.ndjson.gz --max-steps 300 \
        --deployment "DeepSeek V3 / V3.1 + MTP" --stand-in eagle --stop-rate 0.03 \
        --num-gpu-blocks 100

``--reset-prefix-cache S1,S2`` makes the engine reset the prefix cache, with its running
requests, before each of those steps, and ``--pause S:STATE,...`` set the pause state
(``paused_new``, ``paused_all``, ``unpaused``) before each such step, as between weight
updates of an RL rollout (a version-5 trace records both calls)::

    .venv-vllm-0.33/bin/python scripts/record_scheduler_trace.py chat-system-prompt \
        dualbudget/traces/scheduler-async-0.33-chat-system-prompt-engine-calls.ndjson.gz \
        --max-steps 300 --async-scheduling --stop-rate 0.03 --num-gpu-blocks 300 \
        --reset-prefix-cache 100,200 --pause 150:paused_new,160:paused_all,170:unpaused
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import logging
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from dualbudget.spec.config import EngineConfig
from dualbudget.spec.errors import BadInput
from dualbudget.spec.releases import release_of

if TYPE_CHECKING:
    from dualbudget.reference.formats.scenario import Scenario

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")


def main() -> int:
    from dualbudget.integration.live import installed_vllm_version
    from dualbudget.reference.formats.scenario import validate
    from dualbudget.reference.runs.replay import profile_for_vllm_version
    from dualbudget.reference.runs.workload import preset

    args = _parser().parse_args()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    workload = preset(args.workload)
    scenario = workload.scenario(args.seed)
    notes = {"workload": workload.name, "seed": str(args.seed), "summary": workload.summary}
    if args.max_steps:
        notes["max_steps"] = str(args.max_steps)
    try:
        config = _recorded_config(args, scenario.config, notes)
    except BadInput as err:
        print(f"record_scheduler_trace.py: {err}", file=sys.stderr)
        return 2
    stops = None
    if args.stop_rate:
        ids = [request.id for request in scenario.requests]
        stops = stop_table(ids, args.max_steps or 1000, args.stop_rate, args.seed)
        notes["stop_rate"] = f"{args.stop_rate} per request and step that samples"
    # The lockstep recording checks vLLM against the installed release's own profile.
    profile = profile_for_vllm_version(installed_vllm_version() or "").name
    resets = {int(step): True for step in args.reset_prefix_cache.split(",") if step}
    pauses = {
        int(step): state
        for step, _, state in (call.partition(":") for call in args.pause.split(",") if call)
    }
    if resets or pauses:
        notes["engine_calls"] = (
            f"reset_prefix_cache(reset_running_requests=True) before steps {sorted(resets)};"
            f" set_pause_state {dict(sorted(pauses.items()))}"
        )
    scenario = validate(
        dataclasses.replace(
            scenario,
            profile=profile,
            config=config,
            stops=stops,
            resets=resets or None,
            pauses=pauses or None,
        )
    )
    steps = _write(scenario, args.out, args.max_steps, notes)
    print(f"{args.out}: {steps} steps of {workload.name} (seed {args.seed})")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--stop-rate", type=float, default=0.0)
    parser.add_argument("--num-gpu-blocks", type=int)
    parser.add_argument("--deployment")
    parser.add_argument("--stand-in")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--prefix-cache-retention-interval", type=int)
    parser.add_argument("--reset-prefix-cache", default="", metavar="S1,S2")
    parser.add_argument("--pause", default="", metavar="S:STATE,...")
    return parser


def _recorded_config(
    args: argparse.Namespace, config: EngineConfig, notes: dict[str, str]
) -> EngineConfig:
    """The preset's config as the flags change it (a deployment's, the retention
    interval, async scheduling, the pool), each change noted in ``notes``."""
    from dualbudget.integration.live import installed_vllm_version
    from dualbudget.integration.scheduler_trace import deployment_config

    if args.deployment:
        version = installed_vllm_version() or ""
        release = release_of(version)
        if release is None:
            raise BadInput(f"no release record for vLLM {version!r}")
        config, deployment_notes = deployment_config(
            config, args.deployment, args.stand_in, release, not args.no_prefix_caching
        )
        notes.update(deployment_notes)
    if args.prefix_cache_retention_interval is not None:
        interval = args.prefix_cache_retention_interval
        config = dataclasses.replace(config, prefix_cache_retention_interval=interval)
        notes["prefix_cache_retention_interval"] = (
            f"{interval} in the KVCacheConfig (vLLM's engine copies its cache_config default"
            " 0 there; a scheduler built on its own KVCacheConfig runs None)"
        )
    if args.async_scheduling:
        config = dataclasses.replace(config, async_scheduling=True)
    if args.num_gpu_blocks:
        config = dataclasses.replace(config, num_gpu_blocks=args.num_gpu_blocks)
        notes["num_gpu_blocks"] = f"{args.num_gpu_blocks} (the preset's shrunk to preempt)"
    return config


def _write(scenario: Scenario, out: Path, max_steps: int | None, notes: dict[str, str]) -> int:
    """The recording, gzipped where ``out`` ends in ``.gz``; its steps."""
    from dualbudget.integration.scheduler_trace import write_scheduler_trace

    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.ndjson"
        steps = write_scheduler_trace(scenario, plain, max_steps, notes)
        if out.name.endswith(".gz"):
            with plain.open("rb") as source, gzip.GzipFile(out, "wb", mtime=0) as target:
                shutil.copyfileobj(source, target)
        else:
            shutil.copy(plain, out)
    return steps


def stop_table(ids: list[str], steps: int, rate: float, seed: int) -> dict[int, dict[str, int]]:
    """``{step: {id: n}}``: each (step, request) stops at its n-th sampled token with
    probability ``rate``, n uniform in 1..8 (the driver caps it at what was sampled); a
    request that samples nothing in that step ignores its entry."""
    rng = random.Random(f"stops-{seed}")
    table: dict[int, dict[str, int]] = {}
    for step in range(steps):
        for rid in ids:
            if rng.random() < rate:
                table.setdefault(step, {})[rid] = rng.randint(1, 8)
    return table


if __name__ == "__main__":
    sys.exit(main())
