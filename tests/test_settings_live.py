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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dualbudget.reference.replay import check_settings
from dualbudget.reference.scenario import Acceptance, RequestSpec, Scenario, validate
from dualbudget.reference.settings import (
    ENGINE_SETTINGS,
    KV_SPEC_KINDS,
    SETTINGS,
    Setting,
    assumed_request_settings,
    first_unreplayed,
)
from dualbudget.reference.trace import TraceError, read_trace
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.profiles import profile_named
from dualbudget.spec.releases import release_of

pytestmark = pytest.mark.live

CONFIG = EngineConfig(
    max_num_batched_tokens=64,
    max_num_seqs=4,
    max_model_len=64,
    block_size=16,
    num_gpu_blocks=32,
    speculative_config=SpeculativeConfig("ngram", 2),
    enable_prefix_caching=True,
)


def _kv_transfer(vllm_config: Any) -> None:
    from vllm.config import KVTransferConfig

    vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both"
    )


def _lora(vllm_config: Any) -> None:
    from vllm.config import LoRAConfig

    vllm_config.lora_config = LoRAConfig(max_loras=2)


def _mtp_modules(vllm_config: Any) -> None:
    # No MTP model builds on CPU: the EAGLE drafter's config, relabelled as vLLM labels
    # an MTP drafter's, holds the field the recorder reads.
    speculative = vllm_config.speculative_config
    object.__setattr__(speculative, "method", "mtp")
    speculative.draft_model_config.hf_config.num_nextn_predict_layers = 3


def _setter(path: str, value: Any) -> Callable[[Any], None]:
    def set_it(vllm_config: Any) -> None:
        owner, _, name = path.rpartition(".")
        target = vllm_config
        for part in owner.split("."):
            target = getattr(target, part)
        object.__setattr__(target, name, value)

    return set_it


@dataclasses.dataclass(frozen=True)
class EngineChange:
    """How to set an engine-scope row on a ``VllmConfig`` vLLM built from ``config``, and
    the value the header must then hold."""

    change: Callable[[Any], None]
    value: Any
    config: EngineConfig = CONFIG


@dataclasses.dataclass(frozen=True)
class RequestChange:
    """A ``Request`` holding a request-scope row at a value other than vLLM's default."""

    request: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class GroupsChange:
    """A live scheduler built on the KV groups ``config`` names, and the spec classes the
    header must then hold."""

    config: EngineConfig
    value: Any


@dataclasses.dataclass(frozen=True)
class KVCacheChange:
    """The live ``KVCacheConfig`` with a row at ``value``, as vLLM's engine sets it from
    its cache config."""

    value: Any


@dataclasses.dataclass(frozen=True)
class SpecChange:
    """A live scheduler on ``config``'s groups whose first group's spec has ``field`` at
    ``to``, as a model's layers set it (the CPU build's layers set none), and the value
    the header must then hold."""

    config: EngineConfig
    field: str
    to: Any
    value: Any


MAMBA = dataclasses.replace(
    CONFIG,
    num_gpu_blocks=64,
    kv_groups=(KVGroup("mamba", 16, mamba_cache_mode="align"), KVGroup("full_attention", 16)),
)
SLIDING_MLA = dataclasses.replace(
    CONFIG,
    num_gpu_blocks=64,
    kv_groups=(
        KVGroup("sliding_window_mla", 16, sliding_window=32),
        KVGroup("mla_attention", 16),
    ),
)


def _request(**sampling: Any) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(
        request_id="r",
        prompt_token_ids=[1, 2, 3, 4],
        sampling_params=SamplingParams(max_tokens=4, **sampling),
        pooling_params=None,
    )


def _structured() -> Any:
    from vllm.sampling_params import StructuredOutputsParams

    return _request(structured_outputs=StructuredOutputsParams(json={}))


def _repeating() -> Any:
    from vllm.sampling_params import RepetitionDetectionParams

    repeated = RepetitionDetectionParams(max_pattern_size=4, min_pattern_size=1, min_count=3)
    return _request(repetition_detection=repeated)


def _with_image() -> Any:
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    request = _request()
    request.mm_features = [
        MultiModalFeatureSpec(
            data=None, modality="image", identifier="i", mm_position=PlaceholderRange(0, 2)
        )
    ]
    return request


EAGLE = dataclasses.replace(CONFIG, speculative_config=SpeculativeConfig("eagle", 2))

CHANGES: dict[str, EngineChange | RequestChange | GroupsChange | KVCacheChange | SpecChange] = {
    "enable_prefix_caching": EngineChange(
        _setter("cache_config.enable_prefix_caching", False), False
    ),
    "max_num_active_seqs": EngineChange(_setter("scheduler_config.max_num_active_seqs", 3), 3),
    "watermark": EngineChange(_setter("scheduler_config.watermark", 0.01), 0.01),
    "cache_aware_admission_window": EngineChange(
        _setter("scheduler_config.cache_aware_admission_window", 8), 8
    ),
    "scheduler_reserve_full_isl": EngineChange(
        _setter("scheduler_config.scheduler_reserve_full_isl", False), False
    ),
    "long_prefill_token_threshold_adaptive": EngineChange(
        _setter("scheduler_config.long_prefill_token_threshold_adaptive", True), True
    ),
    "prefill_schedule_interval": EngineChange(
        _setter("scheduler_config.prefill_schedule_interval", 2), 2
    ),
    "num_speculative_tokens_per_batch_size": EngineChange(
        _setter("speculative_config.num_speculative_tokens_per_batch_size", [[1, 8, 2]]),
        [[1, 8, 2]],
    ),
    "num_nextn_predict_layers": EngineChange(_mtp_modules, 3, EAGLE),
    "disable_eagle_block_drop": EngineChange(
        _setter("speculative_config.disable_eagle_block_drop", True), True, EAGLE
    ),
    "disable_lookahead_block_hashes": EngineChange(
        _setter("speculative_config.disable_lookahead_block_hashes", True), True, EAGLE
    ),
    "kv_cache_groups": GroupsChange(
        dataclasses.replace(
            CONFIG,
            num_gpu_blocks=64,
            kv_groups=(
                KVGroup("sliding_window", 16, sliding_window=32),
                KVGroup("full_attention", 16),
            ),
        ),
        ["SlidingWindowSpec", "FullAttentionSpec"],
    ),
    "prefix_cache_retention_interval": KVCacheChange(0),
    "mamba_prefill_checkpoint_blocks": SpecChange(MAMBA, "num_prefill_checkpoint_blocks", 1, 1),
    "prefix_replay_tokens": SpecChange(SLIDING_MLA, "bounded_replay", True, 32),
    "prefix_match_unit": EngineChange(_setter("cache_config.prefix_match_unit", 8), 8),
    "enable_mamba_shared_prefix_checkpoint": EngineChange(
        _setter("cache_config.enable_mamba_shared_prefix_checkpoint", True), True
    ),
    "enable_lora": EngineChange(_lora, True),
    "kv_connector": EngineChange(_kv_transfer, "OffloadingConnector"),
    "pipeline_parallel_size": EngineChange(_setter("parallel_config.pipeline_parallel_size", 2), 2),
    "decode_context_parallel_size": EngineChange(
        _setter("parallel_config.decode_context_parallel_size", 2), 2
    ),
    "disable_chunked_mm_input": EngineChange(
        _setter("scheduler_config.disable_chunked_mm_input", True), True
    ),
    "enable_return_routed_experts": EngineChange(
        _setter("aux_output_config.enable_return_routed_experts", True), True
    ),
    "structured_outputs": RequestChange(_structured),
    "skip_reading_prefix_cache": RequestChange(lambda: _request(prompt_logprobs=1)),
    "mm_encoder_inputs": RequestChange(_with_image),
    "repetition_detection": RequestChange(_repeating),
}
"""Per row of the table, how a live vLLM holds it at a value other than its default. A
row missing here fails its test below."""


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
    assert request_settings_of(_request()) == assumed_request_settings()


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
        live.scheduler.add_request(_request(repetition_detection=repeated))
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
