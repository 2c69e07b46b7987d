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

from dataclasses import dataclass

from .errors import BadInput
from .methods import MethodLayout, layout_for
from .releases import Release

SCHEDULING_POLICIES = ("fcfs", "priority")


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


def check_engine_config(config: EngineConfig) -> None:
    """Raise ConfigError for what vLLM's ``SchedulerConfig``/``SpeculativeConfig`` refuse.

    Policy-specific admission checks live with each policy (``policies.validate``), and
    so does the release's async check (``check_async_scheduling``).
    """
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


def runs_async(spec: SpeculativeConfig, release: Release) -> bool:
    """Whether ``release`` lets ``spec``'s drafter run with ``async_scheduling``."""
    return release.runs_async(spec.method, spec.parallel_drafting)


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
