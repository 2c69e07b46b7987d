"""The engine configuration, in vLLM's own parameter names, and the checks vLLM makes.

Only the fields that bear on token budgets are kept. Defaults are vLLM's own defaults and
are named here, never invented: ``enable_chunked_prefill`` True,
``long_prefill_token_threshold`` 0 (off), ``scheduling_policy`` ``fcfs``,
``max_num_scheduled_tokens`` None (vLLM then uses ``max_num_batched_tokens``),
``async_scheduling`` False (vLLM's own default is None, resolved per method and model
runner; the project states it explicitly), ``enable_prefix_caching`` False (vLLM's own
default is True for decoder language models; the project states it explicitly too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .errors import BadInput
from .methods import MethodLayout, layout_for
from .releases import Release

SCHEDULING_POLICIES = ("fcfs", "priority")

KV_GROUP_KINDS = (
    "full_attention",
    "mla_attention",
    "sliding_window",
    "sliding_window_mla",
    "chunked_local_attention",
    "mamba",
)
"""The KV cache spec kinds the reference models, in vLLM's ``KVCacheSpecKind`` names."""
REFUSED_KV_GROUP_KINDS = {
    "sink_full_attention": "SinkFullAttentionSpec",
    "encoder_only_attention": "EncoderOnlyAttentionSpec",
    "cross_attention": "CrossAttentionSpec",
    "rswa": "RSWASpec",
    "circular_buffer": "CircularBufferSpec",
    "hisparse_hot": "HiSparseHotSpec",
    "hisparse_resident": "HiSparseResidentSpec",
    "hidden_state_cache": "HiddenStateCacheSpec",
}
"""Kinds vLLM has whose block rules the reference does not model, by vLLM's class: a
group of one is refused by name, never run as another kind."""
MAMBA_CACHE_MODES = ("none", "align")
"""vLLM's ``CacheConfig.mamba_cache_mode`` (its ``MambaCacheMode``, the same in 0.32 and 0.33)."""


class ConfigError(BadInput):
    """A configuration vLLM (or this spec) refuses; ``field`` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``speculative_config``, reduced to what decides budgets."""

    method: str
    num_speculative_tokens: int
    parallel_drafting: bool = False
    dspark_layout: str | None = None
    """``anchor`` (vLLM's default, ``sample_from_anchor: true``) or ``fill-in``."""

    @property
    def layout(self) -> MethodLayout:
        return layout_for(self.method, self.parallel_drafting, self.dspark_layout)

    @classmethod
    def for_layout(cls, layout: MethodLayout, k: int) -> SpeculativeConfig:
        """The ``speculative_config`` that takes ``layout``'s row of the method table: the
        one home of layout -> config, for the proofs' witnesses, the fuzz and the tests.
        Where the table leaves ``parallel_drafting`` to vLLM (DFlash, DSpark: None), vLLM
        forces it on, so it is given as True."""
        parallel = True if layout.parallel_drafting is None else layout.parallel_drafting
        return cls(layout.speculative_method, k, parallel, layout.dspark_layout)


@dataclass(frozen=True)
class KVGroup:
    """One of vLLM's ``KVCacheGroupSpec``: layers sharing a block table, with the fields of
    its ``kv_cache_spec`` that decide blocks. Every group draws on the one pool."""

    kind: str
    """A kind of ``KV_GROUP_KINDS`` (vLLM's ``KVCacheSpecKind``)."""
    block_size: int
    sliding_window: int | None = None
    """``SlidingWindowSpec.sliding_window``: tokens each token attends to, itself included
    (``sliding_window`` and ``sliding_window_mla`` only)."""
    attention_chunk_size: int | None = None
    """``ChunkedLocalAttentionSpec.attention_chunk_size`` (``chunked_local_attention``
    only)."""
    mamba_cache_mode: str = "none"
    """``CacheConfig.mamba_cache_mode`` (``mamba`` only): ``none`` keeps one state block,
    ``align`` a state per block boundary."""
    is_eagle_group: bool = False
    """``KVCacheGroupSpec.is_eagle_group``: the group holds the drafter's layers and its
    prefix hit drops the last block, where the release drops it."""
    is_draft: bool = False
    """The drafter's own spec (``KVCacheSpec.is_draft``: DFlash and DSpark drafters whose
    spec does not merge into the target's), a group of its own."""
    spec_variant: int = 0
    """Which spec of its kind and fields the group's is: 0 for the first, n for the n-th
    whose vLLM ``KVCacheSpec`` differs from the earlier ones only in fields that decide no
    blocks (a head size, a dtype, DeepSeek V4's tokens per state). vLLM looks up together
    only groups of equal spec, so such groups are looked up apart."""

    @property
    def kv_cache_spec(self) -> KVGroup:
        """The group as its ``kv_cache_spec``: every field but ``is_eagle_group``, which
        vLLM keeps on the ``KVCacheGroupSpec``. vLLM looks up groups of equal specs
        together."""
        return replace(self, is_eagle_group=False)


@dataclass(frozen=True)
class EngineConfig:
    """vLLM's scheduler, cache and speculative settings that bear on budgets."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    max_num_scheduled_tokens: int | None = None
    speculative_config: SpeculativeConfig | None = None
    async_scheduling: bool = False
    """vLLM's ``SchedulerConfig.async_scheduling``: the engine schedules step n+1 before
    step n's output is back (``AsyncScheduler``, a batch queue of depth 2)."""
    enable_prefix_caching: bool = False
    """vLLM's ``CacheConfig.enable_prefix_caching``: full blocks are cached by their hash
    chain and a new request starts at its longest cached prefix (docs/design.md §6)."""
    kv_groups: tuple[KVGroup, ...] = ()
    """vLLM's ``KVCacheConfig.kv_cache_groups``; () is one ``full_attention`` group of
    ``block_size``, the layout of every config before groups were modelled."""
    prefix_cache_retention_interval: int | None = None
    """vLLM's ``KVCacheConfig.prefix_cache_retention_interval``: which full blocks a
    sliding-window group caches. None (``KVCacheConfig``'s default) every block; 0 (the
    engine's, copied from ``CacheConfig``) only those a replay of a prompt or a shared
    prefix resumes at; N > 0 also a tail once per N tokens."""
    mamba_prefill_checkpoint_blocks: int = 0
    """vLLM's ``MambaSpec.num_prefill_checkpoint_blocks`` of the Mamba groups (in
    ``align`` mode): above 0 the Mamba layers save the prompt's reusable state inside a
    prefill chunk, in a block the manager reserves (Qwen's gated delta net under
    FlashInfer's prefill kernel sets 1), instead of the scheduler ending the chunk there.
    Its checkpoint alignment is the Mamba block (no ``prefix_match_unit``)."""
    num_nextn_predict_layers: int | None = None
    """The MTP drafter's modules (its ``hf_config.num_nextn_predict_layers``); None for
    another drafter. With more than one, and K > 1, each module reads one prompt token
    further ahead (``multi_module_mtp``)."""

    @property
    def multi_module_mtp(self) -> bool:
        """vLLM's ``use_multi_module_mtp``: an MTP drafter whose chain of modules reads
        more than one token past a prefill chunk, ``min(modules, K) > 1``."""
        spec = self.speculative_config
        modules = self.num_nextn_predict_layers or 1
        return (
            spec is not None
            and spec.method == "mtp"
            and min(modules, spec.num_speculative_tokens) > 1
        )

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """vLLM's ``num_prefill_lookahead_tokens``: the prompt tokens past a prefill chunk
        the drafter reads, so no chunk ends within them of the prompt's end and the last
        ``- 1`` of them are re-prefilled rather than cached: K for multi-module MTP, 1 for
        a drafter on the target's hidden states, else 0."""
        spec = self.speculative_config
        if spec is None or spec.method not in HIDDEN_STATE_DRAFTERS:
            return 0
        return spec.num_speculative_tokens if self.multi_module_mtp else 1

    @property
    def num_reprefillable_tokens(self) -> int:
        """The last tokens of a chunk the drafter may prefill again (vLLM's coordinator's
        ``num_reprefillable_tokens``, and every ``SlidingWindowSpec.extra_retained_tokens``):
        not cached, and kept below a sliding window, until the next chunk is computed."""
        return max(0, self.num_prefill_lookahead_tokens - 1)

    @property
    def groups(self) -> tuple[KVGroup, ...]:
        """The KV groups, () resolved to its one full-attention group."""
        return self.kv_groups or (KVGroup("full_attention", self.block_size),)

    @property
    def scheduler_block_size(self) -> int:
        """vLLM's scheduler block size (``resolve_kv_cache_block_sizes``): the LCM of the
        groups' block sizes, where prefix-cache hits land and, with caching off, the
        block size vLLM hashes at."""
        return math.lcm(*(group.block_size for group in self.groups))

    @property
    def hash_block_size(self) -> int:
        """vLLM's hash block size with prefix caching on (``resolve_kv_cache_block_sizes``,
        no ``prefix_match_unit``: refused): the GCD of the groups' block sizes, the tokens
        each of a request's block hashes covers."""
        return math.gcd(*(group.block_size for group in self.groups))

    @property
    def num_speculative_tokens(self) -> int:
        """``K``; 0 without speculative decoding."""
        spec = self.speculative_config
        return spec.num_speculative_tokens if spec is not None else 0

    @property
    def layout(self) -> MethodLayout | None:
        spec = self.speculative_config
        return spec.layout if spec is not None else None

    @property
    def scheduled_tokens_cap(self) -> int:
        """vLLM's ``max_num_scheduled_tokens`` after its default is applied."""
        if self.max_num_scheduled_tokens is None:
            return self.max_num_batched_tokens
        return self.max_num_scheduled_tokens


HIDDEN_STATE_DRAFTERS = ("eagle", "eagle3", "mtp", "dflash", "dspark")
"""vLLM's ``SpeculativeConfig.use_eagle`` methods: drafters on the target's hidden
states, which read the prompt token past a prefill chunk."""


def check_engine_config(config: EngineConfig) -> None:
    """Raise ConfigError for what vLLM's ``SchedulerConfig``/``SpeculativeConfig`` refuse.

    Policy-specific admission checks live with each policy (``policies.validate``), and
    so does the release's async check (``check_async_scheduling``).
    """
    _check_numbers(config)
    _check_scheduler_limits(config)
    _check_cache_groups(config)
    _check_drafting(config)


def _check_numbers(config: EngineConfig) -> None:
    """Each number of the config is an integer in its range, the policy a known one."""
    positive = {
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs,
        "max_model_len": config.max_model_len,
        "block_size": config.block_size,
        "num_gpu_blocks": config.num_gpu_blocks,
    }
    for field, value in positive.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(field, f"must be a positive integer, got {value!r}")
    cap = config.max_num_scheduled_tokens
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigError("max_num_scheduled_tokens", f"must be a positive integer, got {cap!r}")
    threshold = config.long_prefill_token_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise ConfigError(
            "long_prefill_token_threshold", f"must be a non-negative integer, got {threshold!r}"
        )
    if config.scheduling_policy not in SCHEDULING_POLICIES:
        raise ConfigError(
            "scheduling_policy",
            f"unknown policy {config.scheduling_policy!r}"
            f" (known: {', '.join(SCHEDULING_POLICIES)})",
        )


def _check_scheduler_limits(config: EngineConfig) -> None:
    """``SchedulerConfig``'s own checks between its numbers, and its flags are bools."""
    # vLLM SchedulerConfig.verify_max_model_len
    if config.max_num_batched_tokens < config.max_model_len and not config.enable_chunked_prefill:
        raise ConfigError(
            "max_num_batched_tokens",
            f"({config.max_num_batched_tokens}) is smaller than max_model_len"
            f" ({config.max_model_len}) with chunked prefill off",
        )
    if config.max_num_batched_tokens < config.max_num_seqs:
        raise ConfigError(
            "max_num_batched_tokens",
            f"({config.max_num_batched_tokens}) must be >= max_num_seqs ({config.max_num_seqs})",
        )
    threshold = config.long_prefill_token_threshold
    if threshold > config.max_model_len:
        raise ConfigError(
            "long_prefill_token_threshold",
            f"({threshold}) cannot be greater than max_model_len ({config.max_model_len})",
        )
    if not isinstance(config.async_scheduling, bool):
        raise ConfigError(
            "async_scheduling", f"must be true or false, got {config.async_scheduling!r}"
        )
    if not isinstance(config.enable_prefix_caching, bool):
        raise ConfigError(
            "enable_prefix_caching",
            f"must be true or false, got {config.enable_prefix_caching!r}",
        )


def _check_cache_groups(config: EngineConfig) -> None:
    """Each KV cache group, the retention interval and the Mamba checkpoints."""
    for index, group in enumerate(config.kv_groups):
        check_kv_group(group, f"kv_groups[{index}]")
    check_retention_interval(config)
    check_mamba_checkpoints(config)
    modes = {group.mamba_cache_mode for group in config.kv_groups if group.kind == "mamba"}
    if len(modes) > 1:
        # One CacheConfig.mamba_cache_mode serves every Mamba group.
        raise ConfigError(
            "kv_groups", f"Mamba groups share one mamba_cache_mode, got {sorted(modes)}"
        )


def _check_drafting(config: EngineConfig) -> None:
    """The speculative config's draft count and method, and MTP's module count."""
    spec = config.speculative_config
    if spec is not None:
        k = spec.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(
                "speculative_config.num_speculative_tokens", f"must be >= 1, got {k!r}"
            )
        try:
            layout_for(spec.method, spec.parallel_drafting, spec.dspark_layout)
        except BadInput as err:
            raise ConfigError("speculative_config.method", str(err)) from None
    modules = config.num_nextn_predict_layers
    if modules is not None:
        if isinstance(modules, bool) or not isinstance(modules, int) or modules < 1:
            raise ConfigError("num_nextn_predict_layers", f"must be >= 1, got {modules!r}")
        if spec is None or spec.method != "mtp":
            raise ConfigError(
                "num_nextn_predict_layers", "is an MTP drafter's: speculative method 'mtp'"
            )


RETENTION_KINDS = ("sliding_window", "sliding_window_mla", "mamba")
"""The kinds whose cached blocks ``prefix_cache_retention_interval`` thins (vLLM's
``SlidingWindowSpec`` and ``MambaSpec`` subclasses); other kinds cache every block."""


def check_mamba_checkpoints(config: EngineConfig) -> None:
    """Refuse a ``mamba_prefill_checkpoint_blocks`` that is not a count, or one above 0
    that would act on nothing: vLLM reserves checkpoint blocks only for Mamba groups in
    ``align`` mode."""
    value = config.mamba_prefill_checkpoint_blocks
    name = "mamba_prefill_checkpoint_blocks"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(name, f"must be an integer >= 0, got {value!r}")
    if value and not any(
        group.kind == "mamba" and group.mamba_cache_mode == "align" for group in config.groups
    ):
        raise ConfigError(
            name, f"is {value}, but no kv_group is Mamba in 'align' mode: set it to 0"
        )


def check_retention_interval(config: EngineConfig) -> None:
    """Raise ConfigError where vLLM's ``_validate_prefix_cache_retention_interval`` raises:
    a positive interval with no sliding-window or Mamba group (it would act on nothing),
    a negative one, or one that is not a multiple of the scheduler's block size (the
    lowest common multiple of the groups' block sizes, where hits land)."""
    value = config.prefix_cache_retention_interval
    if value is None:
        return
    name = "prefix_cache_retention_interval"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"must be null or an integer, got {value!r}")
    if not any(group.kind in RETENTION_KINDS for group in config.groups):
        if value != 0:
            raise ConfigError(
                name, f"is {value}, but no kv_group is sliding-window or Mamba: set it to 0"
            )
        return
    step = config.scheduler_block_size
    if value < 0 or value % step != 0:
        raise ConfigError(
            name, f"({value}) must be >= 0 and a multiple of the scheduler block size ({step})"
        )


def check_kv_group(group: KVGroup, where: str) -> None:
    """Raise ConfigError for a group the reference cannot run: a kind vLLM has but the
    reference does not model is refused by its vLLM class name."""
    if group.kind in REFUSED_KV_GROUP_KINDS:
        raise ConfigError(
            f"{where}.kind",
            f"{REFUSED_KV_GROUP_KINDS[group.kind]} ({group.kind!r}) is not modelled",
        )
    if group.kind not in KV_GROUP_KINDS:
        raise ConfigError(
            f"{where}.kind", f"unknown kind {group.kind!r} (known: {', '.join(KV_GROUP_KINDS)})"
        )
    size = group.block_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"{where}.block_size", f"must be a positive integer, got {size!r}")
    windowed = group.kind in ("sliding_window", "sliding_window_mla")
    _check_length(group.sliding_window, windowed, f"{where}.sliding_window", group.kind)
    chunked = group.kind == "chunked_local_attention"
    _check_length(group.attention_chunk_size, chunked, f"{where}.attention_chunk_size", group.kind)
    if group.mamba_cache_mode not in MAMBA_CACHE_MODES:
        raise ConfigError(
            f"{where}.mamba_cache_mode",
            f"unknown mode {group.mamba_cache_mode!r} (known: {', '.join(MAMBA_CACHE_MODES)})",
        )
    variant = group.spec_variant
    if isinstance(variant, bool) or not isinstance(variant, int) or variant < 0:
        raise ConfigError(
            f"{where}.spec_variant", f"must be a non-negative integer, got {variant!r}"
        )
    if group.mamba_cache_mode != "none" and group.kind != "mamba":
        raise ConfigError(f"{where}.mamba_cache_mode", f"applies to mamba, not {group.kind!r}")


def _check_length(value: int | None, wanted: bool, field: str, kind: str) -> None:
    """A kind's own length (window, chunk): a positive integer where the kind has one,
    absent elsewhere."""
    if not wanted:
        if value is not None:
            raise ConfigError(field, f"applies to no {kind!r} group")
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, f"must be a positive integer for {kind!r}, got {value!r}")


def runs_async(spec: SpeculativeConfig, release: Release) -> bool:
    """Whether ``release`` lets ``spec``'s drafter run with ``async_scheduling``."""
    return release.runs_async(spec.method, spec.parallel_drafting)


def check_parallel_drafting(config: EngineConfig, release: Release) -> None:
    """Raise ConfigError where ``release``'s ``SpeculativeConfig`` refuses the drafter's
    ``parallel_drafting`` (the one home of that rule)."""
    spec = config.speculative_config
    if spec is None or not spec.parallel_drafting:
        return
    if not release.builds_parallel_drafting(spec.method):
        raise ConfigError(
            "speculative_config.parallel_drafting",
            f"vLLM {release.version} supports parallel_drafting only for"
            f" {', '.join(release.parallel_drafting_methods)}, not {spec.method!r}",
        )


def check_async_scheduling(config: EngineConfig, release: Release) -> None:
    """Raise ConfigError where ``release``'s ``VllmConfig`` fails explicit async
    scheduling with the config's drafter (the one home of that rule)."""
    spec = config.speculative_config
    if config.async_scheduling and spec is not None and not runs_async(spec, release):
        drafting = " with parallel_drafting" if spec.parallel_drafting else ""
        raise ConfigError(
            "async_scheduling",
            f"vLLM {release.version} refuses async scheduling with {spec.method!r}{drafting}"
            " speculative decoding",
        )
