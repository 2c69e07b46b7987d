"""The fuzz's aims: where a share of the examples looks, one row each (``AIMS``).

An *aim* chooses only where to look: the bounds its configs are drawn in
(``ConfigBounds``, read by the one builder ``aimed_config``), its machine (a
``machine.LockstepMachine`` subclass drawing its requests) and its weight in a method's
share of the examples (``fuzz.shares``). ``mixed`` draws configs over the whole space,
refused ones included; every other aim draws configs and requests aimed at one coverage
event (``coverage.COVERAGE`` names each event's aim) or one rule's boundary that a
uniform draw reaches rarely. Every aim's examples are checked by the same rules and the
same invariant.

``aimed_config`` draws every field in one order, each within its aim's bounds: K, the
block size, ``max_model_len``, the long-prefill threshold, ``max_num_seqs``, chunked
prefill, the budgets (``Budgets``: how ``max_num_batched_tokens`` B and the token budget
are drawn, one pair of the aim's), then B and ``max_num_scheduled_tokens`` (the one whose
range depends on the other second), the KV pool, the scheduling policy and, on the EAGLE
row, whether its drafter is MTP of K modules. B always
meets vLLM's checks (B >= ``max_num_seqs``, B >= ``max_model_len`` without chunked
prefill) and, but for ``mixed``, stays above the lookahead (``num_lookahead_tokens``),
which both releases demand: aimed configs are never refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TypeVar

import hypothesis.strategies as st
from hypothesis import assume
from hypothesis.stateful import initialize

from dualbudget.reference.kv.blocks import cdiv
from dualbudget.reference.kv.kinds import caching_modelled
from dualbudget.spec.config import (
    RETENTION_KINDS,
    ConfigError,
    EngineConfig,
    KVGroup,
    SpeculativeConfig,
    check_engine_config,
)
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import profile_named

from .machine import (
    BudgetMachine,
    EdgeMachine,
    EngineCallMachine,
    HybridMachine,
    LockstepMachine,
    LoneMachine,
    PaddedMachine,
    PreemptMachine,
    PrefixMachine,
    RefundMachine,
    TokenMachine,
)
from .outcome import UnitRun

T = TypeVar("T")

MAX_K = 5
"""Every aim draws ``num_speculative_tokens`` in [1, MAX_K]."""


def reserve(profile: str, layout: str, k: int) -> tuple[int, int]:
    """(slots the profile's policy charges per request, num_lookahead_tokens) at K."""
    row = layout_named(layout)
    policy = profile_named(profile).policy
    p = StepParams(1, 1, 1, k, row)
    return int(policy.draft_slots(p)), int(policy.num_lookahead_tokens(p))


def admitted(profile: str, layout: str, k: int, b: int, seqs: int) -> int:
    """Requests the profile's policy lets run at once (``max_active_requests``) at K, B
    and ``max_num_seqs``."""
    policy = profile_named(profile).policy
    return int(policy.max_active_requests(StepParams(b, b, seqs, k, layout_named(layout))))


def admission_capped(profile: str, layout: str, k: int) -> bool:
    """Whether the profile's policy caps the running requests by B (vLLM 0.33's DFlash
    and DSpark: at most ``B // num_lookahead_tokens``, ``Additive.max_active_requests``)."""
    return admitted(profile, layout, k, 1, 8) < 8


@dataclass(frozen=True)
class PerDraft:
    """A count linear in K and in the slots a request reserves:
    ``const + per_k * K + per_slot * slots``."""

    const: int = 0
    per_k: int = 0
    per_slot: int = 0

    def at(self, k: int, slots: int) -> int:
        return self.const + self.per_k * k + self.per_slot * slots


class TokenBudget(enum.Enum):
    """How ``max_num_scheduled_tokens`` is drawn against B (``range_at``)."""

    DEFAULT = "vLLM's default (None): the token budget opens at B"
    UP_TO_B = "1 to B"
    BELOW_B = "1 to B - 1: the token budget opens below the input budget"
    HALF_B = "1 to B // 2: below the input budget even for methods reserving many slots"
    ABOVE_B = "B + 1 to 2B + 8: the input budget opens below it (legal in vLLM)"
    DECODE_WIDTHS = "2 (1 + K) + 1 to 3 (1 + K): two decodes and part or all of a third"

    @property
    def scales_with_b(self) -> bool:
        """Whether its range depends on B (it is then drawn after B, else before)."""
        return self not in (TokenBudget.DEFAULT, TokenBudget.DECODE_WIDTHS)

    def range_at(self, b: int, k: int) -> tuple[int, int] | None:
        """The range drawn in; None for vLLM's default."""
        ranges = {
            TokenBudget.DEFAULT: None,
            TokenBudget.UP_TO_B: (1, b),
            TokenBudget.BELOW_B: (1, b - 1),
            TokenBudget.HALF_B: (1, max(1, b // 2)),
            TokenBudget.ABOVE_B: (b + 1, 2 * b + 8),
            TokenBudget.DECODE_WIDTHS: (2 * (k + 1) + 1, 3 * (k + 1)),
        }
        return ranges[self]


@dataclass(frozen=True)
class Span:
    """Where B is drawn: from its floor (the larger of ``ConfigBounds``' lower bounds and
    ``at_least``, counted above the token budget with ``over_token_budget``) up to
    ``up_to`` (or the floor itself, if higher), or, without ``up_to``, up to ``extra``
    above the floor."""

    at_least: PerDraft = PerDraft()
    over_token_budget: bool = False
    up_to: PerDraft | None = None
    extra: PerDraft = PerDraft()


@dataclass(frozen=True)
class Budgets:
    """One way an aim draws its two budgets: B in ``batched``, the token budget as
    ``token``; only where the layout reserves slots (``needs_slots``) or where the policy
    does not cap admission by B (``needs_uncapped_admission``), when the pair serves the
    aim only there."""

    batched: Span
    token: TokenBudget = TokenBudget.DEFAULT
    needs_slots: bool = False
    needs_uncapped_admission: bool = False


def every(spans: tuple[Span, ...], tokens: tuple[TokenBudget, ...]) -> tuple[Budgets, ...]:
    """Each span with each token budget."""
    return tuple(Budgets(span, token) for span in spans for token in tokens)


@dataclass(frozen=True)
class Pool:
    """``num_gpu_blocks`` in full requests (``max_model_len`` in blocks, plus the null
    block): from ``low`` to ``high`` of them, plus ``extra_blocks``; counted beyond
    ``max_num_seqs`` full requests with ``per_seq``."""

    low: float
    high: float
    extra_blocks: int = 0
    per_seq: bool = False

    def range_at(self, need: int, seqs: int) -> tuple[int, int]:
        base = seqs if self.per_seq else 0
        return int(need * (base + self.low)), int(need * (base + self.high)) + self.extra_blocks


@dataclass(frozen=True)
class GroupShape:
    """One KV group of a drawn layout, its lengths in blocks of the config's block size:
    the layout follows the block size drawn."""

    kind: str
    block_scale: int = 1
    """The group's block size in config blocks."""
    window_blocks: int | None = None
    """``sliding_window`` in blocks (the sliding-window kinds)."""
    chunk_blocks: int | None = None
    """``attention_chunk_size`` in blocks (``chunked_local_attention``)."""
    mamba_cache_mode: str = "none"
    is_eagle_group: bool = False
    spec_variant: int = 0

    def at(self, block_size: int) -> KVGroup:
        window = None if self.window_blocks is None else self.window_blocks * block_size
        chunk = None if self.chunk_blocks is None else self.chunk_blocks * block_size
        return KVGroup(
            self.kind,
            self.block_scale * block_size,
            sliding_window=window,
            attention_chunk_size=chunk,
            mamba_cache_mode=self.mamba_cache_mode,
            is_eagle_group=self.is_eagle_group,
            spec_variant=self.spec_variant,
        )


KVLayout = tuple[GroupShape, ...]


@dataclass(frozen=True)
class ConfigBounds:
    """The bounds an aim's configs are drawn in (``aimed_config``); a choice of several
    values or ranges is drawn uniformly (repeat one to weight it)."""

    budgets: tuple[Budgets, ...]
    block_sizes: tuple[int, ...] = (4, 8, 16)
    max_model_lens: tuple[int, ...] = (32, 48, 64)
    max_model_len_in_k: tuple[PerDraft, PerDraft] | None = None
    """A range in K drawn instead of ``max_model_lens``."""
    thresholds: tuple[tuple[int, int | None], ...] = ((0, 0),)
    """``long_prefill_token_threshold`` ranges; None: up to ``max_model_len``."""
    max_num_seqs: tuple[int, int] = (1, 8)
    chunked_prefill: tuple[bool, ...] = (True,)
    pools: tuple[Pool, ...] = (Pool(3, 4),)
    policies: tuple[str, ...] = ("fcfs", "priority")
    floor: int = 4
    """B's least value."""
    refused_too: bool = False
    """B may fall to the lookahead or below it, where vLLM refuses the config."""
    fits_decode_batch: bool = False
    """B fits ``max_num_seqs`` decodes at 1 + K + slots and one more token."""
    first_grant_above_threshold: bool = False
    """B - slots stays above the threshold: a lone request's first grant is more."""
    admits_max_num_seqs: bool = False
    """Where the policy caps admission by B, B is raised to admit ``max_num_seqs``."""
    prefix_caching: bool = False
    kv_layouts: tuple[KVLayout, ...] = ()
    """KV group layouts drawn (``EngineConfig.kv_groups``); none: vLLM's one full-attention
    group, and nothing is drawn for it."""
    layout_caching: bool = False
    """Prefix caching drawn on (mostly) or off for a drawn layout whose every kind the
    reference's coordinator models with caching (``kv.kinds.caching_modelled``); off
    for others."""


def full_request_blocks(max_model_len: int, block_size: int, groups: tuple[KVGroup, ...]) -> int:
    """The blocks a request of ``max_model_len`` tokens holds, plus the null block: a
    block table in every group (one, without ``kv_groups``), of the config's block size
    (a Mamba group holds fewer: the pool errs on the ample side)."""
    return max(1, len(groups)) * cdiv(max_model_len, block_size) + 1


def _ranged(draw: st.DrawFn, low: int, high: int, label: str) -> int:
    """An integer in [low, high], drawn unless the range holds one."""
    return low if low == high else draw(st.integers(low, high), label=label)


def _one_of(draw: st.DrawFn, choices: tuple[T, ...], label: str) -> T:
    return choices[0] if len(choices) == 1 else draw(st.sampled_from(choices), label=label)


def _token_budget(draw: st.DrawFn, token: TokenBudget, b: int, k: int) -> int | None:
    token_range = token.range_at(b, k)
    return None if token_range is None else _ranged(draw, *token_range, "max_num_scheduled_tokens")


@st.composite
def aimed_config(draw: st.DrawFn, bounds: ConfigBounds, profile: str, layout: str) -> EngineConfig:
    """A config within ``bounds`` for ``profile``'s policy on ``layout``'s row."""
    k = draw(st.integers(1, MAX_K), label="K")
    slots, lookahead = reserve(profile, layout, k)
    block_size = _one_of(draw, bounds.block_sizes, "block_size")
    if bounds.max_model_len_in_k is not None:
        shortest, longest = bounds.max_model_len_in_k
        max_model_len = _ranged(draw, shortest.at(k, slots), longest.at(k, slots), "max_model_len")
    else:
        max_model_len = _one_of(draw, bounds.max_model_lens, "max_model_len")
    least, most = _one_of(draw, bounds.thresholds, "threshold range")
    threshold = _ranged(draw, least, max_model_len if most is None else most, "threshold")
    seqs = _ranged(draw, *bounds.max_num_seqs, "max_num_seqs")
    chunked = _one_of(draw, bounds.chunked_prefill, "chunked prefill")
    capped = admission_capped(profile, layout, k)
    budgets = _one_of(
        draw,
        tuple(
            pair
            for pair in bounds.budgets
            if not (pair.needs_slots and slots == 0)
            and not (pair.needs_uncapped_admission and capped)
        ),
        "budgets",
    )
    span, token = budgets.batched, budgets.token
    cap = None
    if not token.scales_with_b:
        cap = _token_budget(draw, token, 0, k)  # its range does not read B
    at_least = span.at_least.at(k, slots)
    if span.over_token_budget:
        assert cap is not None, f"B over the token budget needs one drawn first, not {token}"
        at_least += cap
    floors = [bounds.floor, seqs, at_least]
    if not chunked:
        floors.append(max_model_len)
    if not bounds.refused_too:
        floors.append(lookahead + 2)
    if bounds.fits_decode_batch:
        floors.append(seqs * (1 + k + slots) + 1)
    if bounds.first_grant_above_threshold:
        floors.append(threshold + slots + 2)
    if bounds.admits_max_num_seqs and capped:
        floors.append(seqs * lookahead)
    low = max(floors)
    high = max(low, span.up_to.at(k, slots)) if span.up_to else low + span.extra.at(k, slots)
    b = _ranged(draw, low, high, "max_num_batched_tokens")
    if token.scales_with_b:
        cap = _token_budget(draw, token, b, k)
    groups, caching, retention, checkpoints = _kv_cache(draw, bounds, block_size)
    need = full_request_blocks(max_model_len, block_size, groups)
    pool = _one_of(draw, bounds.pools, "pool")
    num_gpu_blocks = _ranged(draw, *pool.range_at(need, seqs), "num_gpu_blocks")
    speculative, modules = _drafter(draw, layout, k, block_size, caching)
    config = EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=seqs,
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        scheduling_policy=_one_of(draw, bounds.policies, "scheduling_policy"),
        max_num_scheduled_tokens=cap,
        speculative_config=speculative,
        enable_prefix_caching=caching,
        kv_groups=groups,
        prefix_cache_retention_interval=retention,
        mamba_prefill_checkpoint_blocks=checkpoints,
        num_nextn_predict_layers=modules,
    )
    if not bounds.refused_too:
        # An aim that is never refused draws no config vLLM refuses: a rule the floors
        # above leave out (0.32 and 0.33's parallel ngram asks B above its
        # max_num_new_slots_for_drafting, K - 1, beyond num_lookahead_tokens + 1) rejects
        # the draw.
        assume(_accepted(config, profile))
    return config


def _accepted(config: EngineConfig, profile: str) -> bool:
    """Whether vLLM's config checks and ``profile``'s admission rules accept ``config``."""
    try:
        check_engine_config(config)
        profile_named(profile).policy.validate(config)
    except ConfigError:
        return False
    return True


@dataclass(frozen=True)
class Aim:
    """Where a share of the examples looks: its configs' bounds, its machine, and its
    weight in a layout's share of the examples (``fuzz.shares``)."""

    configs: ConfigBounds
    machine: type[LockstepMachine]
    weight: int


LOOSE_OVER_DECODE_WIDTHS = Budgets(
    Span(at_least=PerDraft(per_slot=8), over_token_budget=True, extra=PerDraft(16)),
    TokenBudget.DECODE_WIDTHS,
)
"""The token budget a few decodes wide, B above it by eight requests' slots and up to 16
more: the token budget binds, the input budget never before it."""

TWO_BLOCK_SIZE_LAYOUTS: tuple[KVLayout, ...] = (
    # The drafter's full attention at twice the target's block (vLLM doubles a layer's
    # block to match a larger page): hashes of the smaller block, hits on the larger.
    (
        GroupShape("full_attention"),
        GroupShape("full_attention", block_scale=2, is_eagle_group=True),
    ),
    # Gemma-like: a window beside full attention at twice its block.
    (
        GroupShape("sliding_window", window_blocks=2),
        GroupShape("full_attention", block_scale=2, is_eagle_group=True),
    ),
)
"""The hybrid aim's layouts of two block sizes."""

DEEPSEEK_V4_LAYOUT: KVLayout = (
    # Compressed MLA in two specs vLLM looks up apart (the drafter's layers in the first),
    # beside the sliding-window MLA of its layers and of its compressors' states, at a
    # half and a quarter of MLA's block.
    GroupShape("mla_attention", block_scale=4, is_eagle_group=True),
    GroupShape("mla_attention", block_scale=4, spec_variant=1),
    GroupShape("sliding_window_mla", block_scale=2, window_blocks=4),
    GroupShape("sliding_window_mla", window_blocks=2),
)
"""The hybrid aim's layout shaped like DeepSeek V4's (``reference/formats/deployments.py``)."""

AIMS: dict[str, Aim] = {
    # Configs over the whole space, refused ones included. Small pools force preemption
    # (the null block and one full request always fit); the token budget mostly vLLM's
    # default, sometimes below B, sometimes above it (legal in vLLM, and the only way the
    # input budget binds for methods reserving no slots).
    "mixed": Aim(
        ConfigBounds(
            budgets=every(
                (Span(up_to=PerDraft(24)), Span(up_to=PerDraft(64))),
                (TokenBudget.DEFAULT, TokenBudget.UP_TO_B, TokenBudget.ABOVE_B),
            ),
            block_sizes=(2, 4, 8, 16),
            max_model_lens=(24, 32, 48, 64, 96),
            thresholds=((0, 0), (0, 0), (1, None)),
            chunked_prefill=(True, True, True, False),
            pools=(Pool(1, 1, extra_blocks=4), Pool(1, 3)),
            refused_too=True,
        ),
        LockstepMachine,
        0,
    ),
    # Prompts long against a small buffer, chunked: grants meet the input budget. With 0
    # slots only a token budget above B lets the input budget bind. A KV pool of three
    # full requests keeps preemption out of the way.
    "budget": Aim(
        ConfigBounds(
            budgets=(
                Budgets(Span(up_to=PerDraft(24)), TokenBudget.ABOVE_B),
                Budgets(Span(up_to=PerDraft(24)), needs_slots=True),
            ),
            max_model_lens=(48, 64, 96),
        ),
        BudgetMachine,
        1,
    ),
    # Priority scheduling, a pool of one to 1.5 full requests, a buffer that fits every
    # running request: a running request that outranks one scheduled before it and needs
    # a block preempts that one (its charge is refunded).
    "preempt": Aim(
        ConfigBounds(
            budgets=(Budgets(Span(up_to=PerDraft(64))),),
            block_sizes=(2, 4),
            max_num_seqs=(2, 8),
            pools=(Pool(1, 1.5),),
            policies=("priority",),
            floor=16,
        ),
        PreemptMachine,
        3,
    ),
    # Room for a decode batch at width 1 + K and an ample pool: one-token prompts arriving
    # while the others decode join padded.
    "padded": Aim(
        ConfigBounds(
            budgets=(Budgets(Span(extra=PerDraft(16))),),
            max_model_lens=(48, 64, 96),
            max_num_seqs=(2, 8),
            pools=(Pool(3, 6),),
            policies=("fcfs",),
            floor=16,
            fits_decode_batch=True,
        ),
        PaddedMachine,
        1,
    ),
    # A budget bound after a refund (bound_after_refund). RefundMachine admits decodes one
    # at a time, each outranking those before it: the running order runs from the worst
    # priority to the best. Blocks of two and a pool of one to 1.5 full requests run out
    # as the decodes grow: a decode short of a block preempts the worst, the first in the
    # order, scheduled before it (refunded), and a budget below the batch's need cuts a
    # decode after it. The budget that binds is drawn: the token budget in half the draws,
    # with room for the victim's decode, the decode of the request preempting it and part
    # or all of a third, which the refund's error then changes (with room for less than
    # two, the request after the refund fits what was refunded exactly), and B loose above
    # it by eight requests' slots, so that a token refund that restores too much or too
    # little shows; or the input budget (vLLM's default token budget, B one to three
    # decode widths with their slots), so that an input refund that does shows. Where the
    # policy caps admission by B the token budget always binds and B is raised to admit
    # max_num_seqs: B of a few decode widths would run only B // K or B // (K + 1)
    # requests at once, too few for a victim, the request preempting it and one cut after
    # both. A max_model_len of 48 or 64 lets each decode live through more preemptions
    # than 32 (which reached the event half as often).
    "refund": Aim(
        ConfigBounds(
            budgets=(
                LOOSE_OVER_DECODE_WIDTHS,
                Budgets(
                    Span(at_least=PerDraft(2, 1, 1), up_to=PerDraft(3, 3, 3)),
                    needs_uncapped_admission=True,
                ),
            ),
            block_sizes=(2,),
            max_model_lens=(48, 64),
            max_num_seqs=(6, 8),
            pools=(Pool(1, 1.5),),
            policies=("priority",),
            admits_max_num_seqs=True,
        ),
        RefundMachine,
        3,
    ),
    # A grant cut by the token budget (token_budget_bound): it binds only where it opens
    # below the input budget, here always (half the draws below B / 2, where it binds
    # even for methods reserving many slots). Chunked prefill is off now and then (B >=
    # max_model_len, as vLLM demands): a prompt over the request's budget then waits
    # whole; the long-prefill threshold is on now and then (with one request alone, vLLM
    # applies none).
    "token": Aim(
        ConfigBounds(
            budgets=every((Span(extra=PerDraft(40)),), (TokenBudget.HALF_B, TokenBudget.BELOW_B)),
            thresholds=((0, 0), (0, 0), (1, 16)),
            chunked_prefill=(True, True, True, False),
        ),
        TokenMachine,
        1,
    ),
    # The padding rule at max_model_len: vLLM pads a one-token request joining decodes to
    # 1 + K only when 1 + K + 1 more positions fit below max_model_len; max_model_len in
    # [K + 1, 2K + 4] puts that test's boundary in reach (every other aim draws 24 or
    # more, where it always holds). The buffer is a few decode widths, chunked prefill on
    # or off, a pool of every running request and up to two more.
    "edge": Aim(
        ConfigBounds(
            budgets=(Budgets(Span(extra=PerDraft(4, 3))),),
            block_sizes=(2, 4),
            max_model_len_in_k=(PerDraft(1, 1), PerDraft(4, 2)),
            thresholds=((0, 0), (1, None)),
            max_num_seqs=(2, 6),
            chunked_prefill=(True, False),
            pools=(Pool(0, 2, per_seq=True),),
            policies=("fcfs",),
        ),
        EdgeMachine,
        3,
    ),
    # The long-prefill threshold with one request alone: vLLM applies it only when more
    # than one request is running or waiting (num_eligible_reqs > 1), so that a lone
    # prefill is never cut for the sake of others. LoneMachine opens with one request
    # longer than the threshold, under budgets above it, and steps at once: its first
    # grant is the whole remaining budget, where a threshold applied alone would cut it
    # to the threshold; the requests added later make the threshold bite. Every other aim
    # either draws the threshold rarely (mixed: a third of its draws, mostly above the
    # prompts) or opens with a crowd.
    "lone": Aim(
        ConfigBounds(
            budgets=(Budgets(Span(extra=PerDraft(24))),),
            thresholds=((1, 8),),
            first_grant_above_threshold=True,
        ),
        LoneMachine,
        1,
    ),
    # Prefix caching on, aimed at its five events (PrefixMachine): blocks of 2 or 4, so
    # that prompts span several blocks and a hit keeps one even where the release drops
    # the last hit block; a pool of one to 1.5 full requests, so that freed cached blocks
    # are handed out again (evicted) and growing decodes preempt requests that later
    # resume on their own cached blocks (a pool of two to three full requests left some
    # methods without a preemption); a buffer with room for a crowd (a repeat admitted
    # while its original runs hits blocks that one holds), the token budget at most half
    # of it in half the draws (a hit changes how much of a prompt the token budget cuts).
    # Only this aim runs with prefix caching: drawing it in mixed or preempt as well cost
    # other events their only examples in the seed-1 run.
    "prefix": Aim(
        ConfigBounds(
            budgets=every((Span(extra=PerDraft(48)),), (TokenBudget.DEFAULT, TokenBudget.HALF_B)),
            block_sizes=(2, 4),
            max_num_seqs=(2, 8),
            pools=(Pool(1, 1.5),),
            floor=16,
            prefix_caching=True,
        ),
        PrefixMachine,
        3,
    ),
    # KV group layouts shaped like the served families (gpt-oss + EAGLE3: a sliding
    # window beside full attention holding the drafter; Llama 4: chunks of two blocks
    # beside full attention holding the drafter; DeepSeek: MLA, and sliding-window
    # MLA beside it, and V4's four groups of three block sizes, two MLA specs looked up
    # apart; Qwen3-Next: Mamba beside full attention, align mode most often),
    # aimed at the hybrid coordinator's events: windows of one or two blocks, so that
    # decodes soon free the blocks behind them; a pool of one to 1.5 full requests (in
    # every group), so that growing decodes preempt under the shared pool; budgets below
    # the prompts now and then, so that a prefill chunk ends off a block boundary and
    # Mamba's align mode moves it back. Prefix caching is on in most draws of the
    # layouts whose caching the reference models (all but Mamba in mode none), with
    # arrivals sharing prefixes, so that one group's hit is cut by another's and a Mamba
    # state hit waits for the step that cached it; their sliding-window and Mamba
    # groups mostly at vLLM's engine retention 0.
    "hybrid": Aim(
        ConfigBounds(
            budgets=every(
                (Span(up_to=PerDraft(24)), Span(up_to=PerDraft(64))), (TokenBudget.DEFAULT,)
            ),
            block_sizes=(2, 4),
            max_num_seqs=(2, 8),
            pools=(Pool(1, 1.5),),
            kv_layouts=(
                # The first, Hypothesis' simplest draw: Mamba align, the event rarest.
                (GroupShape("mamba", mamba_cache_mode="align"), GroupShape("full_attention")),
                (
                    GroupShape("sliding_window", window_blocks=1),
                    GroupShape("full_attention", is_eagle_group=True),
                ),
                (
                    GroupShape("sliding_window", window_blocks=2),
                    GroupShape("full_attention", is_eagle_group=True),
                ),
                (GroupShape("mla_attention"),),
                (GroupShape("sliding_window_mla", window_blocks=1), GroupShape("mla_attention")),
                (GroupShape("mamba", mamba_cache_mode="align"), GroupShape("full_attention")),
                (GroupShape("mamba"), GroupShape("full_attention")),
                # Last, so that the draws of the layouts above keep their indices.
                (
                    GroupShape("chunked_local_attention", chunk_blocks=2),
                    GroupShape("full_attention", is_eagle_group=True),
                ),
                # Several groups of one spec, as vLLM splits a model's layers into groups
                # of equal size (Qwen3-Next: three Mamba groups per full-attention one;
                # Llama 4: three chunked-local ones), looked up together; and MLA twice,
                # one of them the drafter's.
                (
                    GroupShape("mamba", mamba_cache_mode="align"),
                    GroupShape("mamba", mamba_cache_mode="align"),
                    GroupShape("full_attention"),
                ),
                (
                    GroupShape("chunked_local_attention", chunk_blocks=2),
                    GroupShape("chunked_local_attention", chunk_blocks=2),
                    GroupShape("full_attention", is_eagle_group=True),
                ),
                (
                    GroupShape("sliding_window", window_blocks=1),
                    GroupShape("sliding_window", window_blocks=1),
                    GroupShape("full_attention", is_eagle_group=True),
                ),
                (GroupShape("mla_attention"), GroupShape("mla_attention", is_eagle_group=True)),
                # Twice: a hit across two block sizes needs one of these drawn with
                # caching on and a prefix asked twice, for every method.
                *TWO_BLOCK_SIZE_LAYOUTS,
                *TWO_BLOCK_SIZE_LAYOUTS,
                DEEPSEEK_V4_LAYOUT,
            ),
            layout_caching=True,
        ),
        HybridMachine,
        3,
    ),
    # The engine's own calls on the scheduler (EngineCallMachine): a prefix-cache reset
    # that preempts the running requests (their output in flight dropped under async
    # scheduling, which half the examples draw, the first one included), a pause and a
    # resume. Prefix caching on, so that a reset takes hits away, in a pool of two to
    # three full requests (the reset, not KV pressure, is what preempts). One example per
    # method at 200, Hypothesis' simplest, reaches all three of its events: its first
    # steps, then the reset, then a pause are not drawn but made.
    "engine_calls": Aim(
        ConfigBounds(
            budgets=(Budgets(Span(extra=PerDraft(48))),),
            block_sizes=(2, 4),
            max_num_seqs=(2, 8),
            pools=(Pool(2, 3),),
            floor=16,
            prefix_caching=True,
        ),
        EngineCallMachine,
        1,
    ),
}
"""The aims, in the order of a layout's units; ``mixed`` takes the rest of a share, so its
weight only counts in the total (20). A weight of 1 is one example per method at 200 over
nine methods: only Hypothesis' first, simplest example, which for ``edge`` never reaches
the padding boundary (``lone``'s does reach its own); ``edge`` needs three to kill the
padding rule's five mutants (docs/mutate.md), and ``prefix`` at two left a method's
token budget or resume re-hit at zero now and then."""


def _kv_cache(
    draw: st.DrawFn, bounds: ConfigBounds, block_size: int
) -> tuple[tuple[KVGroup, ...], bool, int | None, int]:
    """The KV cache groups, prefix caching, its retention interval and the Mamba prefill
    checkpoint blocks of ``aimed_config``, drawn in that order."""
    groups: tuple[KVGroup, ...] = ()
    if bounds.kv_layouts:
        layout_shape = _one_of(draw, bounds.kv_layouts, "kv_groups")
        groups = tuple(shape.at(block_size) for shape in layout_shape)
    caching = bounds.prefix_caching
    retention: int | None = None
    if bounds.layout_caching and all(caching_modelled(group) for group in groups):
        # On in three draws of four: hit cuts need a cached prefix asked again after
        # the pool evicted one group's blocks of it, which few examples reach.
        caching = draw(st.sampled_from((True, True, True, False)), label="enable_prefix_caching")
        if caching and any(group.kind in RETENTION_KINDS for group in groups):
            # vLLM's engine runs 0 (sparse: a window group caches only the blocks a replay
            # or a shared-prefix junction resumes at); KVCacheConfig's own None (dense) in
            # one draw of four.
            retention = draw(
                st.sampled_from((0, 0, 0, None)), label="prefix_cache_retention_interval"
            )
    checkpoints = 0
    if any(group.mamba_cache_mode == "align" for group in groups):
        # Mamba layers that save the prompt's state inside a chunk (FlashInfer's gated
        # delta net prefill, Hopper's default) or not (Triton's); with caching off too,
        # where vLLM's scheduler still reserves and splits for them.
        checkpoints = draw(st.sampled_from((1, 0)), label="mamba_prefill_checkpoint_blocks")
    return groups, caching, retention, checkpoints


def _drafter(
    draw: st.DrawFn, layout: str, k: int, block_size: int, caching: bool
) -> tuple[SpeculativeConfig, int | None]:
    """The speculative config of ``layout``'s row with ``k`` drafts, and the number of
    MTP modules where the draw makes its drafter multi-module MTP (else None)."""
    row = layout_named(layout)
    speculative = SpeculativeConfig.for_layout(row, k)
    modules = None
    # In one draw of two the row's drafter is MTP of K modules: no prefill chunk ends
    # within K of the prompt's end and a chunk's last K - 1 tokens wait for the next to
    # be cached. vLLM refuses it with prefix caching on a scheduler block shorter than K,
    # which the draw never asks for.
    if (
        row.takes_mtp
        and k > 1
        and (k <= block_size or not caching)
        and draw(st.booleans(), label="multi-module MTP")
    ):
        speculative = replace(speculative, method="mtp")
        modules = k
    return speculative, modules


def machine_for(run: UnitRun) -> type[LockstepMachine]:
    """The machine of one unit: its aim's machine, bound to ``run``, starting from a
    config drawn within its aim's bounds for its profile and layout."""
    aim = AIMS[run.aim]

    @initialize(config=aimed_config(aim.configs, run.profile, run.layout), data=st.data())
    def start(self: LockstepMachine, config: EngineConfig, data: st.DataObject) -> None:
        self.begin(config, data)

    name = f"Lockstep_{run.layout}_{run.aim}".replace("-", "_")
    machine = type(name, (aim.machine,), {"run": run, "start": start})
    return machine
