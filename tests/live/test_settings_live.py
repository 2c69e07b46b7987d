"""The recorder reads every setting of the table from the live vLLM (needs vLLM;
docs/vllm-environments.md): each engine-scope row from a real ``VllmConfig`` and
``KVCacheConfig``, each request-scope row from a real ``Request``, at vLLM's default and
at a value other than it, and the trace it writes names them.

The CPU build cannot start an engine with pipeline parallelism, decode context
parallelism, a KV connector or routed-experts output (they need several devices, a
transfer backend or an MoE model), nor LoRA or multimodal inputs without such a model: for
those rows the value is set on the config (or request) vLLM built, the very objects the
recorder reads, so the test pins the field each release keeps it in, not vLLM's check of
it. Without vLLM these tests fail under CI=true, else skip.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from dualbudget.reference.formats.scenario import Acceptance, RequestSpec, Scenario, validate
from dualbudget.reference.formats.settings import (
    ENGINE_SETTINGS,
    KV_SPEC_KINDS,
    SETTINGS,
    Setting,
    assumed_request_settings,
    first_unreplayed,
)
from dualbudget.reference.formats.trace import TraceError, read_trace
from dualbudget.reference.runs.replay import check_settings
from dualbudget.spec.config import KVGroup, SpeculativeConfig
from dualbudget.spec.profiles import profile_named
from dualbudget.spec.releases import release_of
from tests.settings_changes import (
    CHANGES,
    CONFIG,
    GroupsChange,
    KVCacheChange,
    RequestChange,
    SpecChange,
    live_request,
)

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def live() -> Any:
    from dualbudget.integration.live import LiveScheduler

    return LiveScheduler(CONFIG)


def test_at_vllms_defaults_the_recorder_reads_the_defaults(live: Any) -> None:
    from dualbudget.integration.recorder import request_settings_of, settings_of

    values = settings_of(live.vllm_config, live.kv_cache_config)
    for setting in SETTINGS:
        if setting.scope == "engine" and setting.name != "enable_prefix_caching":
            assert values[setting.name] == setting.default, setting.name
    assert request_settings_of(live_request()) == assumed_request_settings()


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_the_recorder_reads_each_row_from_vllm(live: Any, setting: Setting) -> None:
    """Every row of the table, set away from vLLM's default on the objects vLLM built,
    is what the recorder writes; a row the release's vLLM lacks (``home_in`` None) has no
    field to set and is written at the default."""
    from dualbudget.integration.live import LiveScheduler, build_vllm_config
    from dualbudget.integration.recorder import request_settings_of, settings_of

    change = CHANGES[setting.name]
    release = release_of(live.version)
    assert release is not None
    read: Any
    wanted = change.value if not isinstance(change, RequestChange) else True
    if isinstance(change, RequestChange):
        read = request_settings_of(change.request())[setting.name]
    elif isinstance(change, GroupsChange):
        built = LiveScheduler(change.config)
        read = settings_of(built.vllm_config, built.kv_cache_config)[setting.name]
    elif isinstance(change, KVCacheChange):
        kv_cache_config = dataclasses.replace(live.kv_cache_config, **{setting.name: change.value})
        read = settings_of(live.vllm_config, kv_cache_config)[setting.name]
    elif isinstance(change, SpecChange):
        built = LiveScheduler(change.config)
        first, *others = built.kv_cache_config.kv_cache_groups
        spec = dataclasses.replace(first.kv_cache_spec, **{change.field: change.to})
        groups = [dataclasses.replace(first, kv_cache_spec=spec), *others]
        kv_cache_config = dataclasses.replace(built.kv_cache_config, kv_cache_groups=groups)
        read = settings_of(built.vllm_config, kv_cache_config)[setting.name]
    else:
        vllm_config, _ = build_vllm_config(change.config)
        if setting.home_in(release.version) is None:
            owner, _, field = setting.home.partition(" ")[0].rpartition(".")
            held = vllm_config
            for part in owner.split("."):
                held = getattr(held, part)
            assert not hasattr(held, field), f"vLLM {live.version} has {setting.home}"
            wanted = setting.default
        else:
            change.change(vllm_config)
        read = settings_of(vllm_config, live.kv_cache_config)[setting.name]
    assert read == wanted
    if setting.home_in(release.version) is not None:
        assert read != setting.default


def test_the_engine_retains_sparsely_and_the_lockstep_as_its_config_says(live: Any) -> None:
    """vLLM's engine copies ``cache_config.prefix_cache_retention_interval`` (default 0,
    sparse) into its ``KVCacheConfig``; the scheduler the lockstep builds runs the
    config's (None, dense, by default), and the recorder writes which."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.recorder import settings_of

    assert live.vllm_config.cache_config.prefix_cache_retention_interval == 0
    assert live.kv_cache_config.prefix_cache_retention_interval is None
    assert live.scheduler.kv_cache_manager.coordinator.retention_interval is None
    assert (
        settings_of(live.vllm_config, live.kv_cache_config)["prefix_cache_retention_interval"]
        is None
    )
    sparse = LiveScheduler(dataclasses.replace(CONFIG, prefix_cache_retention_interval=0))
    assert sparse.scheduler.kv_cache_manager.coordinator.retention_interval == 0
    recorded = settings_of(sparse.vllm_config, sparse.kv_cache_config)
    assert recorded["prefix_cache_retention_interval"] == 0


def test_a_recorded_trace_is_refused_naming_a_request_row(tmp_path: Path) -> None:
    from vllm.sampling_params import RepetitionDetectionParams

    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.recorder import TRACE_ENV, RecordingScheduler

    path = tmp_path / "t.ndjson"
    config = dataclasses.replace(CONFIG, enable_prefix_caching=False)
    repeated = RepetitionDetectionParams(max_pattern_size=4, min_pattern_size=1, min_count=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TRACE_ENV, str(path))
        live = LiveScheduler(config, scheduler_cls=RecordingScheduler)
        live.scheduler.add_request(live_request(repetition_detection=repeated))
        live.scheduler.shutdown()
    trace = read_trace(path)
    assert tuple(trace.header.settings) == ENGINE_SETTINGS
    assert trace.request_settings == {"r": {"repetition_detection": True}}
    with pytest.raises(TraceError, match="repetition_detection = true \\(request 'r'\\)"):
        check_settings(trace, profile_named(f"vllm-{live.version[:4]}"))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_ngram_gpu_schedules_as_the_ngram_row(async_scheduling: bool, profile: str) -> None:
    """vLLM builds ``ngram_gpu`` natively on CPU too; its scheduler treats it as n-gram
    (no lookahead slots, no drafting slots, async-capable): lockstep on the n-gram row."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.lockstep import run_in_lockstep

    config = dataclasses.replace(
        CONFIG,
        speculative_config=SpeculativeConfig("ngram_gpu", 2),
        async_scheduling=async_scheduling,
        enable_prefix_caching=False,
    )
    requests = tuple(RequestSpec(str(i), 20 + 7 * i, 12, i) for i in range(5))
    scenario = validate(Scenario(profile, config, requests, Acceptance(fixed=1)))
    live = LiveScheduler(config)
    assert live.vllm_config.speculative_config.method == "ngram_gpu"
    assert live.vllm_config.num_lookahead_tokens == 0
    steps, divergence = run_in_lockstep(scenario, live=live, max_steps=40)
    assert divergence is None and steps > 10


HYBRID = {
    "sliding window + full": (
        KVGroup("sliding_window", 16, sliding_window=32),
        KVGroup("full_attention", 16),
    ),
    "MLA": (KVGroup("mla_attention", 16),),
    "Mamba align + full": (
        KVGroup("mamba", 16, mamba_cache_mode="align"),
        KVGroup("full_attention", 16),
    ),
}


@pytest.mark.parametrize("name", sorted(HYBRID))
def test_the_recorder_writes_the_kv_groups_vllm_built(name: str, profile: str) -> None:
    """From a ``KVCacheConfig`` of several groups, as vLLM's scheduler is built on it, the
    recorder writes the same ``config.kv_groups`` and the spec classes, which replay reads
    as one layout it models."""
    from dualbudget.integration.live import LiveScheduler
    from dualbudget.integration.recorder import engine_config_of, kv_groups_of, settings_of

    config = dataclasses.replace(CONFIG, num_gpu_blocks=64, kv_groups=HYBRID[name])
    live = LiveScheduler(config)
    groups = kv_groups_of(live.vllm_config, live.kv_cache_config)
    assert groups == config.kv_groups
    settings = settings_of(live.vllm_config, live.kv_cache_config)
    assert [KV_SPEC_KINDS[spec] for spec in settings["kv_cache_groups"]] == [
        group.kind for group in groups
    ]
    recorded = engine_config_of(live.vllm_config, 64, False, groups)
    assert first_unreplayed(settings, recorded, profile_named(profile)) is None
