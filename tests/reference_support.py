"""Builders shared by the reference tests; it holds no tests of its own."""

from __future__ import annotations

from typing import Any

from dualbudget.proofs.manifest import expected_findings
from dualbudget.reference.events import AddRequest, ScheduleStep, StepRecord
from dualbudget.reference.formats.scenario import Scenario, parse_scenario
from dualbudget.reference.runs.driver import ScenarioRun
from dualbudget.reference.scheduler import Scheduler
from dualbudget.spec.config import EngineConfig, SpeculativeConfig
from dualbudget.spec.methods import layout_named
from dualbudget.spec.profiles import PROFILE_NAMES, PROFILES, profile_named

_BREAKING_C3 = {(profile, layout) for profile, layout, item in expected_findings() if item == "C3"}
SOUND_PAIRS = tuple(
    (profile, layout)
    for profile in PROFILE_NAMES
    for layout in ("none", *PROFILES[profile].release.layouts)
    if (profile, layout) not in _BREAKING_C3
)
"""Every (profile, layout) pair the reference runs, but those whose C3 break the proofs
expect (``proofs/manifest.toml``): there the reference reports the break by design
(tests/unit/test_reference_findings.py pins them)."""


def speculative(layout: str, k: int) -> SpeculativeConfig | None:
    """The vLLM ``speculative_config`` that takes ``layout``'s row of the method table."""
    if layout == "none":
        return None
    row = layout_named(layout)
    return SpeculativeConfig(
        method=row.methods[0],
        num_speculative_tokens=k,
        parallel_drafting=bool(row.parallel_drafting),
        dspark_layout=row.dspark_layout,
    )


def config(layout: str = "none", k: int = 4, **fields: Any) -> EngineConfig:
    values: dict[str, Any] = {
        "max_num_batched_tokens": 20,
        "max_num_seqs": 4,
        "max_model_len": 64,
        "block_size": 16,
        "num_gpu_blocks": 1000,
    }
    values.update(fields)
    return EngineConfig(**values, speculative_config=speculative(layout, k))


def first_step(profile: str, cfg: EngineConfig, prompts: list[int]) -> StepRecord:
    scheduler = Scheduler(cfg, profile_named(profile))
    for i, prompt_len in enumerate(prompts):
        scheduler.handle(AddRequest(str(i), prompt_len, 8, arrival_time=float(i)))
    record = scheduler.handle(ScheduleStep())
    assert record is not None
    return record


def scenario(
    profile: str,
    cfg: dict[str, Any],
    requests: list[dict[str, Any]],
    **extra: Any,
) -> Scenario:
    obj: dict[str, Any] = {"profile": profile, "config": cfg, "requests": requests, **extra}
    return parse_scenario(obj)


def run(sc: Scenario, **kwargs: Any) -> tuple[ScenarioRun, list[StepRecord]]:
    scenario_run = ScenarioRun(sc, **kwargs)
    return scenario_run, list(scenario_run.records())


FILL_IN = {"method": "dspark", "num_speculative_tokens": 4, "dspark_layout": "fill-in"}


def fill_in_scenario(profile: str, prompt_len: int) -> Scenario:
    """Five prompts of ``prompt_len`` tokens under DSpark's fill-in layout at B = 20, K = 4:
    the step that breaks C3 where a profile reserves K - 1 draft rows for K + 1."""
    cfg: dict[str, Any] = {
        "max_num_batched_tokens": 20,
        "max_num_seqs": 5,
        "max_model_len": 64,
        "block_size": 16,
        "num_gpu_blocks": 100,
        "speculative_config": FILL_IN,
    }
    requests = [{"id": str(i), "prompt_len": prompt_len, "max_tokens": 3} for i in range(5)]
    return scenario(profile, cfg, requests, drafts={"fixed": 0})
