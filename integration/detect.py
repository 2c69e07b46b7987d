"""Which profile the installed vLLM follows.

A release build of a known release is recognised by ``vllm.__version__``
(``spec.releases.release_of``: its record names its profile). Anything else (a
development checkout, as vLLM's own CI would run this) is probed: the slots vLLM reports
per method and whether it caps DFlash/DSpark admission are compared with what each
release's record predicts. No match is an error that prints what was found.
``--profile`` overrides detection; lockstep then shows any mismatch as a divergence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import profile_named
from dualbudget.spec.releases import RELEASES, release_of

from .live import Unsupported, build_vllm_config, require_vllm

# The probes: one config per method row whose slots or admission differ between profiles.
PROBE_K = 4
PROBE_B = 20
PROBE_SEQS = 16
PROBES = {
    "p-eagle": SpeculativeConfig("eagle3", PROBE_K, True),
    "pard": SpeculativeConfig("draft_model", PROBE_K, True),
    "dflash": SpeculativeConfig("dflash", PROBE_K, True),
    "dspark-anchor": SpeculativeConfig("dspark", PROBE_K, True, "anchor"),
}


class DetectionFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Detection:
    profile: str
    vllm_version: str
    how: str
    """``version`` or ``probe``."""
    observed: dict[str, Any]


def _probe_config(spec: SpeculativeConfig) -> EngineConfig:
    return EngineConfig(
        max_num_batched_tokens=PROBE_B,
        max_num_seqs=PROBE_SEQS,
        max_model_len=256,
        block_size=16,
        num_gpu_blocks=64,
        speculative_config=spec,
    )


def observe() -> dict[str, Any]:
    """What the installed vLLM derives for each probe config."""
    observed: dict[str, Any] = {}
    for name, spec in PROBES.items():
        try:
            vllm_config, _ = build_vllm_config(_probe_config(spec))
        except Unsupported as err:
            observed[name] = {"refused": err.reason}
            continue
        sched = vllm_config.scheduler_config
        active = sched.max_num_active_seqs
        observed[name] = {
            "slots": int(vllm_config.speculative_config.max_num_new_slots_for_drafting),
            "max_num_active_seqs": int(active) if active is not None else sched.max_num_seqs,
        }
    return observed


def predicted(profile_name: str) -> dict[str, Any]:
    """What a profile's release says vLLM derives for each probe config."""
    policy = profile_named(profile_name).policy
    out: dict[str, Any] = {}
    for name, spec in PROBES.items():
        p = StepParams.of(_probe_config(spec))
        out[name] = {
            "slots": int(policy.draft_slots(p)),
            "max_num_active_seqs": int(policy.max_active_requests(p)),
        }
    return out


def detect() -> Detection:
    version = require_vllm()
    # A release build (major.minor.patch); a development version is probed instead.
    release = release_of(version) if re.fullmatch(r"\d+\.\d+\.\d+", version) else None
    if release is not None:
        return Detection(release.profile_name, version, "version", {})
    return detect_by_probe(version)


def detect_by_probe(version: str) -> Detection:
    observed = observe()
    names = [release.profile_name for release in RELEASES.values()]
    candidates = [name for name in names if predicted(name) == observed]
    if len(candidates) != 1:
        lines = [f"no profile matches vLLM {version}; observed (K={PROBE_K}, B={PROBE_B}):"]
        lines += [f"  {name}: {value}" for name, value in observed.items()]
        lines += [f"  {name} predicts: {predicted(name)}" for name in names]
        raise DetectionFailed("\n".join(lines))
    return Detection(candidates[0], version, "probe", observed)
