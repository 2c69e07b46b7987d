"""The fuzz's state machine: one lockstep run per example, one machine per aim.

A Hypothesis ``RuleBasedStateMachine`` starts from a config drawn by its aim's strategy
(``AIMS``), then interleaves rules that add requests, abort them and run engine steps with drawn
acceptance and draft proposals. After every rule the invariant holds or the run stops:
the live decision equals the reference's (``Lockstep`` raises ``DivergenceFound``), and
the reference's C1-C3 hold unless the break is a known finding (``UnitRun.take_findings``).

An *aim* chooses only where to look: its config strategy and its ``LockstepMachine``
subclass (prompt, output and priority draws, the opening crowd, arrivals between steps).
Every aim's examples are checked by the same rules and the same invariant.

The draws are part of the fuzz's result (a seed gives the same examples): a change to a
strategy, to a draw's order or label, or to a rule's name (Hypothesis orders the rules by
name) changes the seed-1 totals; nothing else does (``fuzz.run_unit`` keeps Hypothesis
from drawing the project's own literals).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import hypothesis.strategies as st
from hypothesis import assume, reject
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from dualbudget.reference.kv import cdiv
from dualbudget.spec.config import EngineConfig, SpeculativeConfig, runs_async
from dualbudget.spec.methods import layout_named
from dualbudget.spec.policies import StepParams
from dualbudget.spec.profiles import profile_named

from .lockstep import (
    COVERAGE_EVENTS,
    ConfigRefused,
    Divergence,
    DivergenceFound,
    Lockstep,
    MirroredCrash,
)
from .prompts import draw_prompt_ids

MAX_REQUESTS = 14
"""Requests one example adds at most."""

FindingKey = tuple[str, str, str]
"""(profile, layout, contract id) of a contract break."""


@dataclass
class Finding:
    """A break of C1-C3 the reference recorded in a lockstep run, with its scenario;
    ``known`` when the caller's known findings list it (the run then goes on)."""

    profile: str
    layout: str
    contract: str
    step: int
    message: str
    scenario_path: str
    known: bool

    @property
    def key(self) -> FindingKey:
        return (self.profile, self.layout, self.contract)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def never_cancelled() -> bool:
    return False


class TimeUp(Exception):
    """Raised by a unit's first rule once its time is spent: ends that Hypothesis run."""


@dataclass(kw_only=True)
class Outcome:
    """What a fuzz counted and what stops it, for a unit (``UnitRun``) and a whole run
    (``fuzz.FuzzResult``) alike: it stops at a divergence, or at a C1-C3 break that is
    not a known finding."""

    examples: int = 0
    steps: int = 0
    refused_configs: int = 0
    mirrored_crashes: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    stopped_by_time: bool = False
    seconds: float = 0.0
    """Wall time: of a unit's Hypothesis run; of a whole fuzz, after its warm-up."""

    @property
    def unknown_findings(self) -> list[Finding]:
        return [f for f in self.findings if not f.known]

    @property
    def stopped(self) -> bool:
        """A divergence or an unknown finding: the fuzz stops here."""
        return bool(self.divergences or self.unknown_findings)


@dataclass
class UnitRun(Outcome):
    """What one (layout, aim) unit ran and found: the state its machines share."""

    profile: str
    layout: str
    aim: str
    seed: int
    out_dir: Path
    known_findings: frozenset[FindingKey]
    deadline: float | None = None
    cancelled: Callable[[], bool] = never_cancelled
    """True once the unit's result can no longer be used (an earlier unit stopped)."""
    started: int = 0
    """Examples the unit started (refused configs too): numbers the scenario files."""
    coverage: dict[str, int] | None = None
    """Events counted, once a step ran."""
    constructions: set[str] = field(default_factory=set)
    top_up_round: int = 0
    """0: a planned unit; r >= 1: a rerun in the run's top-up round r (``fuzz.run_fuzz``)."""

    @property
    def round_tag(self) -> str:
        """``-top-up<r>`` for a rerun in top-up round r, else nothing."""
        return f"-top-up{self.top_up_round}" if self.top_up_round else ""

    @property
    def unit_name(self) -> str:
        """``layout/aim`` (its round's tag after a top-up rerun's)."""
        return f"{self.layout}/{self.aim}{self.round_tag}"

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def count_step(self, before: dict[str, int], after: dict[str, int]) -> None:
        self.steps += 1
        if self.coverage is None:
            self.coverage = dict.fromkeys(COVERAGE_EVENTS, 0)
        for event, count in after.items():
            self.coverage[event] += count - before[event]

    def take_findings(self, lock: Lockstep) -> list[Finding]:
        """The C1-C3 breaks ``lock`` recorded since the last call, one per (profile,
        layout, contract) in this unit, each with the scenario that reproduces it."""
        new: list[Finding] = []
        seen = {f.key for f in self.findings}
        for violation in lock.violations:
            key = (self.profile, lock.layout, violation.contract)
            if key in seen:
                continue
            seen.add(key)
            path = lock.write_scenario(violation.step)
            new.append(
                Finding(
                    *key,
                    step=violation.step,
                    message=violation.message,
                    scenario_path=str(path),
                    known=key in self.known_findings,
                )
            )
        lock.violations.clear()
        lock.reference.violations.clear()
        self.findings += new
        return new


# -- config strategies, one per aim -------------------------------------------------------
def _reserve(profile: str, layout: str, k: int) -> tuple[int, int]:
    """(slots the profile's policy charges per request, num_lookahead_tokens) at K.

    The lookahead is at least the slots in every row of both tables, and both releases
    accept ``max_num_batched_tokens > num_lookahead_tokens``: aimed configs stay above it
    so that they are never refused (``mixed`` still draws refused ones)."""
    row = layout_named(layout)
    policy = profile_named(profile).policy
    p = StepParams(1, 1, 1, k, row)
    return int(policy.draft_slots(p)), int(policy.num_lookahead_tokens(p))


def _admitted(profile: str, layout: str, k: int, b: int, seqs: int) -> int:
    """Requests the profile's policy lets run at once (``max_active_requests``) at K, B
    and ``max_num_seqs``."""
    policy = profile_named(profile).policy
    return int(policy.max_active_requests(StepParams(b, b, seqs, k, layout_named(layout))))


def _speculative(layout: str, k: int) -> SpeculativeConfig:
    return SpeculativeConfig.for_layout(layout_named(layout), k)


@st.composite
def mixed_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """Configs over the whole space, refused ones included."""
    k = draw(st.integers(1, 5))
    block_size = draw(st.sampled_from([2, 4, 8, 16]))
    max_model_len = draw(st.sampled_from([24, 32, 48, 64, 96]))
    need = cdiv(max_model_len, block_size) + 1
    # Small pools force preemption; the null block and one full request always fit.
    num_gpu_blocks = draw(st.one_of(st.integers(need, need + 4), st.integers(need, need * 3)))
    chunked = draw(st.booleans() | st.just(True))
    low = 4 if chunked else max_model_len
    max_num_batched_tokens = draw(
        st.one_of(st.integers(low, max(low, 24)), st.integers(low, max(low, 64)))
    )
    max_num_seqs = draw(st.integers(1, min(8, max_num_batched_tokens)))
    # Mostly vLLM's default (None); sometimes below B, sometimes above it (legal in
    # vLLM, and the only way the input budget binds for methods reserving no slots).
    cap = draw(
        st.one_of(
            st.none(),
            st.integers(1, max_num_batched_tokens),
            st.integers(max_num_batched_tokens + 1, max_num_batched_tokens * 2 + 8),
        )
    )
    threshold = draw(st.one_of(st.just(0), st.just(0), st.integers(1, max_model_len)))
    policy = draw(st.sampled_from(["fcfs", "priority"]))
    return EngineConfig(
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        scheduling_policy=policy,
        max_num_scheduled_tokens=cap,
        speculative_config=_speculative(layout, k),
    )


@st.composite
def budget_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """Prompts long against a small buffer, chunked: grants meet the input budget.
    A KV pool of three full requests keeps preemption out of the way."""
    k = draw(st.integers(1, 5))
    slots, lookahead = _reserve(profile, layout, k)
    block_size = draw(st.sampled_from([4, 8, 16]))
    max_model_len = draw(st.sampled_from([48, 64, 96]))
    need = cdiv(max_model_len, block_size) + 1
    low = max(4, lookahead + 2)
    b = draw(st.integers(low, max(low, 24)))
    above = st.integers(b + 1, b * 2 + 8)
    # With 0 slots only a token budget above B lets the input budget bind.
    cap = draw(above if slots == 0 else st.one_of(st.none(), above))
    return EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=draw(st.integers(1, min(8, b))),
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(need * 3, need * 4)),
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
        max_num_scheduled_tokens=cap,
        speculative_config=_speculative(layout, k),
    )


@st.composite
def preempt_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """Priority scheduling, a pool of one to 1.5 full requests, a buffer that fits
    every running request: a running request that outranks one scheduled before it
    and needs a block preempts that one (its charge is refunded)."""
    k = draw(st.integers(1, 5))
    _, lookahead = _reserve(profile, layout, k)
    block_size = draw(st.sampled_from([2, 4]))
    max_model_len = draw(st.sampled_from([32, 48, 64]))
    need = cdiv(max_model_len, block_size) + 1
    low = max(16, lookahead + 2)
    b = draw(st.integers(low, max(low, 64)))
    return EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=draw(st.integers(2, min(8, b))),
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(need, need + need // 2)),
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        scheduling_policy="priority",
        max_num_scheduled_tokens=None,
        speculative_config=_speculative(layout, k),
    )


@st.composite
def padded_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """Room for a decode batch at width 1 + K and an ample pool: one-token prompts
    arriving while the others decode join padded."""
    k = draw(st.integers(1, 5))
    _, lookahead = _reserve(profile, layout, k)
    block_size = draw(st.sampled_from([4, 8, 16]))
    max_model_len = draw(st.sampled_from([48, 64, 96]))
    need = cdiv(max_model_len, block_size) + 1
    seqs = draw(st.integers(2, 8))
    # Each request costs at most 1 + K + slots <= 2K + 2 of the input budget.
    low = max(seqs * (2 * k + 2) + 1, lookahead + 2, 16)
    b = draw(st.integers(low, low + 16))
    return EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=seqs,
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(need * 3, need * 6)),
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        scheduling_policy="fcfs",
        max_num_scheduled_tokens=None,
        speculative_config=_speculative(layout, k),
    )


@st.composite
def refund_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """A budget bound after a refund (``bound_after_refund``). ``RefundMachine`` admits
    decodes one at a time, each outranking those before it: the running order runs from
    the worst priority to the best. Blocks of two and a pool of one to 1.5 full requests
    run out as the decodes grow: a decode short of a block preempts the worst, the first
    in the order, scheduled before it (refunded), and a budget below the batch's need cuts
    a decode after it. The budget that binds is drawn: the token budget
    (``max_num_scheduled_tokens`` a few decode widths, the input budget loose), so that a
    token refund that restores too much or too little shows; or the input budget (vLLM's
    default token budget, ``B`` a few decode widths with their s slots each above the
    lookahead), so that an input refund that does shows. Where the policy caps admission
    by ``B`` (vLLM 0.33's DFlash and DSpark, ``StaticCap.max_active_requests``: at most
    ``B // num_lookahead_tokens`` running) the token budget always binds and ``B`` is
    raised to admit ``max_num_seqs``: the input branch's ``B`` of a few decode widths
    would run only B // K or B // (K + 1) requests at once, too few for a victim, the
    request preempting it and one cut after both (the seed-1 fuzz counted no
    ``bound_after_refund`` for them before)."""
    k = draw(st.integers(1, 5))
    slots, lookahead = _reserve(profile, layout, k)
    max_model_len = draw(st.sampled_from([32, 48, 64]))
    need = cdiv(max_model_len, 2) + 1
    width = 1 + k
    cap: int | None
    capped = _admitted(profile, layout, k, 1, 8) < 8  # admission depends on B
    token_binds = draw(st.booleans(), label="token budget binds")
    if token_binds or capped:
        cap = draw(st.integers(width + 1, 3 * width))
        b = max(lookahead + 2, cap + draw(st.integers(8 * slots, 8 * slots + 16)))
    else:
        cap = None
        b = max(lookahead + 2, draw(st.integers(width + slots + 1, 3 * (width + slots))))
    seqs = draw(st.integers(6, 8))
    if capped:
        b = max(b, seqs * lookahead)  # admits max_num_seqs: B // lookahead >= seqs
    return EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=seqs,
        max_model_len=max_model_len,
        block_size=2,
        num_gpu_blocks=draw(st.integers(need, need + need // 2)),
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        scheduling_policy="priority",
        max_num_scheduled_tokens=cap,
        speculative_config=_speculative(layout, k),
    )


@st.composite
def token_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """A grant cut by the token budget (``token_budget_bound``): it binds only where it
    opens below the input budget, ``max_num_scheduled_tokens < max_num_batched_tokens``,
    here always (half the draws below B / 2, where it binds even for methods reserving
    many slots). Chunked prefill is off now and then, with B >= max_model_len as vLLM
    demands: a prompt over the request's budget then waits whole; the long-prefill
    threshold is on now and then (with one request alone, vLLM applies none)."""
    k = draw(st.integers(1, 5))
    _, lookahead = _reserve(profile, layout, k)
    block_size = draw(st.sampled_from([4, 8, 16]))
    max_model_len = draw(st.sampled_from([32, 48, 64]))
    need = cdiv(max_model_len, block_size) + 1
    chunked = draw(st.booleans() | st.just(True))
    low = max(4, lookahead + 2) if chunked else max(max_model_len, lookahead + 2)
    b = draw(st.integers(low, low + 40))
    return EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=draw(st.integers(1, min(8, b))),
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(need * 3, need * 4)),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.one_of(st.just(0), st.just(0), st.integers(1, 16))),
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
        max_num_scheduled_tokens=draw(
            st.one_of(st.integers(1, max(1, b // 2)), st.integers(1, b - 1))
        ),
        speculative_config=_speculative(layout, k),
    )


@st.composite
def edge_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """The padding rule at max_model_len: vLLM pads a one-token request joining decodes to
    1 + K only when 1 + K + 1 more positions fit below ``max_model_len``; a
    ``max_model_len`` in [K + 1, 2K + 4] puts that test's boundary in reach (every other
    aim draws 24 or more, where it always holds). The buffer is a few decode widths,
    chunked prefill on or off (then B >= max_model_len)."""
    k = draw(st.integers(1, 5))
    _, lookahead = _reserve(profile, layout, k)
    block_size = draw(st.sampled_from([2, 4]))
    max_model_len = draw(st.integers(k + 1, 2 * k + 4))
    need = cdiv(max_model_len, block_size) + 1
    seqs = draw(st.integers(2, 6))
    chunked = draw(st.booleans())
    low = max(lookahead + 2, 4 if chunked else max_model_len)
    return EngineConfig(
        max_num_batched_tokens=draw(st.integers(low, low + 3 * k + 4)),
        max_num_seqs=seqs,
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(need * seqs, need * (seqs + 2))),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.one_of(st.just(0), st.integers(1, max_model_len))),
        scheduling_policy="fcfs",
        max_num_scheduled_tokens=None,
        speculative_config=_speculative(layout, k),
    )


@st.composite
def lone_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """The long-prefill threshold with one request alone: vLLM applies it only when more
    than one request is running or waiting (``num_eligible_reqs > 1``), so that a lone
    prefill is never cut for the sake of others. ``LoneMachine`` opens with one request
    longer than the threshold, under budgets above it, and steps at once: its first grant
    is the whole remaining budget, where a threshold applied alone would cut it to the
    threshold; the requests added later make the threshold bite. Every other aim either
    draws the threshold rarely (``mixed``: a third of its draws, mostly above the
    prompts) or opens with a crowd."""
    k = draw(st.integers(1, 5))
    slots, lookahead = _reserve(profile, layout, k)
    block_size = draw(st.sampled_from([4, 8, 16]))
    max_model_len = draw(st.sampled_from([32, 48, 64]))
    need = cdiv(max_model_len, block_size) + 1
    threshold = draw(st.integers(1, 8))
    # The first grant, min(prompt, B, B - slots), stays above the threshold.
    low = max(4, lookahead + 2, threshold + slots + 2)
    b = draw(st.integers(low, low + 24))
    return EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=draw(st.integers(1, min(8, b))),
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(need * 3, need * 4)),
        enable_chunked_prefill=True,
        long_prefill_token_threshold=threshold,
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
        max_num_scheduled_tokens=None,
        speculative_config=_speculative(layout, k),
    )


@st.composite
def prefix_config(draw: st.DrawFn, profile: str, layout: str) -> EngineConfig:
    """Prefix caching on, aimed at its five events (``PrefixMachine``): blocks of 2 or 4,
    so that prompts span several blocks and a hit keeps one even after 0.32's
    eagle-family drop of the last hit block; a pool of one to 1.5 full requests, so that
    freed cached blocks are handed out again (evicted) and growing decodes preempt
    requests that later resume on their own cached blocks (a pool of two to three full
    requests left some methods without a preemption); a buffer with room for a crowd (a
    repeat admitted while its original runs hits blocks that one holds), the token
    budget at most half of it in half the draws (a hit changes how much of a prompt the
    token budget cuts). Only this aim runs with prefix caching: every other aim's
    examples stay as they were, with it off (drawing it in ``mixed`` or ``preempt`` as
    well cost other events their only examples in the seed-1 run)."""
    k = draw(st.integers(1, 5))
    _, lookahead = _reserve(profile, layout, k)
    block_size = draw(st.sampled_from([2, 4]))
    max_model_len = draw(st.sampled_from([32, 48, 64]))
    need = cdiv(max_model_len, block_size) + 1
    low = max(16, lookahead + 2)
    b = draw(st.integers(low, low + 48))
    return EngineConfig(
        max_num_batched_tokens=b,
        max_num_seqs=draw(st.integers(2, min(8, b))),
        max_model_len=max_model_len,
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(need, need + need // 2)),
        enable_chunked_prefill=True,
        long_prefill_token_threshold=0,
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
        max_num_scheduled_tokens=draw(st.one_of(st.none(), st.integers(4, max(4, b // 2)))),
        speculative_config=_speculative(layout, k),
        enable_prefix_caching=True,
    )


# -- the machine ----------------------------------------------------------------------------
class LockstepMachine(RuleBasedStateMachine):
    """The rules and the invariant every aim shares; the draws are those of ``mixed``.

    A unit's machine is a subclass made by ``machine_for``: it binds the unit's
    ``UnitRun`` and the initial rule that draws the aim's config."""

    run: ClassVar[UnitRun]
    initial_requests_low: ClassVar[int] = 1
    initial_requests_high: ClassVar[int] = 6
    draws_async_and_stops: ClassVar[bool] = True
    """Whether examples draw async scheduling and natural stops."""

    def __init__(self) -> None:
        super().__init__()
        self.lock: Lockstep | None = None

    # -- the aim's draws (overridden per aim) ----------------------------------------------
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # One-token prompts join a decode batch padded to 1 + K; long ones get chunked.
        return st.one_of(st.just(1), st.integers(1, min(8, limit - 1)), st.integers(1, limit - 1))

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Long outputs run into max_model_len.
        return st.one_of(st.integers(1, 12), st.integers(1, limit), st.just(limit))

    def priority_strategy(self, late: bool) -> st.SearchStrategy[int]:
        # Later arrivals may outrank running requests (0 is the highest priority), so
        # that a victim can be one already scheduled in the step.
        return st.integers(0 if late else 2, 3)

    def arrive_between_steps(self, lock: Lockstep, data: st.DataObject) -> None:
        """Arrivals between two steps of one ``run_steps`` rule: none by default."""

    # -- the rules ----------------------------------------------------------------------
    def begin(self, config: EngineConfig, data: st.DataObject) -> None:
        """The initial rule's body: one example's lockstep run and its first steps."""
        run = self.run
        if run.stopped:
            reject()  # the first divergence stopped the run; void the rest
        if run.cancelled():
            raise TimeUp  # an earlier unit stopped the whole run
        if run.out_of_time() and run.started > 0:
            # A unit always gets its first example: vLLM's one-off costs (its import,
            # the first build of each draft architecture) must not starve a unit.
            run.stopped_by_time = True
            raise TimeUp
        run.started += 1
        spec = config.speculative_config
        # Async scheduling (vLLM's default for these drafters) in about half the examples.
        if (
            self.draws_async_and_stops
            and spec is not None
            and runs_async(spec, profile_named(run.profile).policy.tables)
            and data.draw(st.booleans(), label="async_scheduling")
        ):
            config = replace(config, async_scheduling=True)
        try:
            self.lock = Lockstep(
                config,
                run.profile,
                seed=run.seed,
                out_dir=run.out_dir,
                label=f"{run.profile}-{run.layout}-{run.aim}{run.round_tag}-ex{run.started}",
            )
        except ConfigRefused:
            run.refused_configs += 1
            assume(False)
        except DivergenceFound as found:
            run.divergences.append(found.divergence)
            raise
        assert self.lock is not None
        run.examples += 1
        run.constructions.add(self.lock.construction.how)
        for _ in range(
            data.draw(
                st.integers(self.initial_requests_low, self.initial_requests_high),
                label="initial requests",
            )
        ):
            self._add(data)
        # Steps right away: Hypothesis opens every run with its simplest example (one
        # rule, no step), and each (layout, aim) unit is a run of its own.
        self._run_steps(data, data.draw(st.integers(1, 12), label="first steps"))

    def _add(self, data: st.DataObject) -> None:
        assert self.lock is not None
        limit = self.lock.config.max_model_len
        late = self.lock.step > 0
        prompt = data.draw(self.prompt_strategy(limit, late), label="prompt_len")
        ids = None
        if self.lock.config.enable_prefix_caching:
            ids = draw_prompt_ids(data, self.lock.config, self.lock.requests, prompt)
            prompt = len(ids)
        output = data.draw(self.output_strategy(limit), label="max_tokens")
        priority = 0
        if self.lock.config.scheduling_policy == "priority":
            priority = data.draw(self.priority_strategy(late), label="priority")
        self.lock.add(prompt, output, priority, ids)

    @precondition(lambda self: self.lock is not None and len(self.lock.requests) < MAX_REQUESTS)
    @rule(data=st.data())
    def add_request(self, data: st.DataObject) -> None:
        self._add(data)

    @precondition(
        lambda self: self.lock is not None
        and self.lock.config.scheduling_policy == "priority"
        and self.lock.step > 0
        and len(self.lock.requests) < MAX_REQUESTS
    )
    @rule(prompt=st.integers(1, 8), output=st.integers(4, 32))
    def add_urgent(self, prompt: int, output: int) -> None:
        """A late request that outranks the running ones: under KV pressure the
        victim is then a running request already scheduled in the step."""
        assert self.lock is not None
        self.lock.add(prompt, output, 0)

    @precondition(lambda self: self.lock is not None and bool(self.lock.unfinished()))
    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        assert self.lock is not None
        # One rule pick in four aborts: the rules are picked uniformly, and aborting
        # as often as adding would leave few requests to schedule.
        if data.draw(st.integers(0, 3), label="abort?") == 0:
            rid = data.draw(st.sampled_from(self.lock.unfinished()), label="abort")
            self.lock.abort(rid)

    @precondition(lambda self: self.lock is not None)
    @rule(data=st.data(), steps=st.integers(1, 12))
    def run_steps(self, data: st.DataObject, steps: int) -> None:
        self._run_steps(data, steps)

    def _run_steps(self, data: st.DataObject, steps: int) -> None:
        assert self.lock is not None
        lock = self.lock
        k = lock.k
        accept_mode = data.draw(st.sampled_from(["draw", "all", "none"]), label="acceptance")

        def accept(rid: str, drafts: int) -> int:
            if accept_mode == "all":
                return drafts
            if accept_mode == "none":
                return 0
            return int(data.draw(st.integers(0, drafts), label=f"accept {rid}"))

        def propose(rid: str) -> int:
            return int(data.draw(st.sampled_from([k, k, k, 0, 1, max(k - 1, 0)])))

        natural_stops = self.draws_async_and_stops and data.draw(
            st.booleans(), label="natural stops"
        )

        def stop(rid: str, num_sampled: int) -> int:
            # Now and then one of the sampled tokens is EOS or a stop token.
            if not natural_stops or data.draw(st.integers(0, 7), label=f"stop {rid}?"):
                return 0
            return int(data.draw(st.integers(1, num_sampled), label=f"stop {rid} at"))

        for _ in range(steps):
            self.arrive_between_steps(lock, data)
            before = dict(lock.coverage)
            try:
                lock.run_step(accept, propose, stop)
            except DivergenceFound as found:
                self.run.divergences.append(found.divergence)
                raise
            except MirroredCrash:
                self.run.mirrored_crashes += 1
                self.lock = None
                return
            self.run.count_step(before, lock.coverage)

    @rule()
    def idle(self) -> None:
        """Keeps the machine valid after a mirrored crash ended its lockstep run."""

    @invariant()
    def contract_holds(self) -> None:
        """C1-C3 (the reference's per-step check) hold, or the break is a known finding."""
        if self.lock is not None and self.lock.violations:
            self.run.take_findings(self.lock)
        unknown = self.run.unknown_findings
        assert not unknown, f"contract broken: {unknown[0].to_json()}"


class BudgetMachine(LockstepMachine):
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Prompts long against the buffer: their chunks meet the input budget.
        return st.one_of(st.integers(limit // 2, limit - 1), st.integers(1, limit - 1))


class PreemptMachine(LockstepMachine):
    # A crowd from the start, so that the pool fills early.
    initial_requests_low = 3

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        return st.integers(1, min(12, limit - 1))

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Long outputs keep the batch decoding and growing into the pool.
        return st.one_of(st.just(limit), st.integers(limit // 2, limit))

    def priority_strategy(self, late: bool) -> st.SearchStrategy[int]:
        if late:
            # Mostly outranking: a late request admitted behind worse ones is what
            # makes a victim out of a request scheduled before it.
            return st.sampled_from([0, 0, 1, 2, 3])
        return super().priority_strategy(late)

    def arrive_between_steps(self, lock: Lockstep, data: st.DataObject) -> None:
        # Urgent arrivals between steps too, not only between rule picks; each is a
        # chance of a victim already scheduled in its step.
        if (
            len(lock.requests) < MAX_REQUESTS
            and data.draw(st.integers(0, 5), label="urgent arrival?") == 0
        ):
            lock.add(
                data.draw(st.integers(1, 8), label="urgent prompt_len"),
                data.draw(st.integers(4, 32), label="urgent max_tokens"),
                0,
            )


class PaddedMachine(LockstepMachine):
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Short prompts decode soon; one-token late arrivals join them padded.
        if late:
            return st.one_of(st.just(1), st.just(1), st.integers(1, 4))
        return st.integers(1, 8)

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Long outputs keep the batch decoding and growing into the pool.
        return st.one_of(st.just(limit), st.integers(limit // 2, limit))


class RefundMachine(LockstepMachine):
    """``refund_config``'s arrivals: one short prompt at a time, on most steps one more,
    each outranking every request before it (priority ``requests_high`` minus the
    requests so far). Each is admitted behind the running ones, so the running order
    (the order of admission) runs from the worst priority to the best, and the victim
    (vLLM preempts the max (priority, arrival time)) is the first scheduled: a request
    behind it short of a block preempts it with a refund, and the requests behind that
    one meet the budget it restored. A preempted request readmitted runs last, the worst:
    arrivals that outrank it keep it waiting, so they run on for up to ``requests_high``
    requests (the other aims' ``MAX_REQUESTS`` would end them early in the run)."""

    initial_requests_low = initial_requests_high = 1
    requests_high: ClassVar[int] = 120
    # Its arrival order is built for one synchronous refund; stops and steps in flight
    # would break it up (the seed-1 fuzz then missed bound_after_refund for dflash).
    draws_async_and_stops = False

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        return st.integers(1, 6)

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Each lives through a few preemptions of those before it, then makes room.
        return st.integers(limit // 4, limit // 2)

    def priority_strategy(self, late: bool) -> st.SearchStrategy[int]:
        assert self.lock is not None
        return st.just(self.requests_high - len(self.lock.requests))

    def arrive_between_steps(self, lock: Lockstep, data: Any) -> None:
        if len(lock.requests) < self.requests_high and data.draw(
            st.integers(0, 15), label="arrival?"
        ):
            limit = lock.config.max_model_len
            lock.add(
                data.draw(self.prompt_strategy(limit, True), label="late prompt_len"),
                data.draw(self.output_strategy(limit), label="late max_tokens"),
                self.requests_high - len(lock.requests),
            )


class TokenMachine(LockstepMachine):
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Prompts long against the token budget: their chunks meet it.
        return st.one_of(st.integers(limit // 2, limit - 1), st.integers(1, limit - 1))


class EdgeMachine(LockstepMachine):
    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        return st.one_of(st.just(1), st.integers(1, max(1, limit - 1)))

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        return st.one_of(st.just(limit), st.integers(1, limit))

    def arrive_between_steps(self, lock: Lockstep, data: Any) -> None:
        # One-token arrivals every other step: each joins the decodes of that step, padded
        # or not by the rule under test (a decode here lives a step or two).
        if (
            lock.step > 0
            and len(lock.requests) < MAX_REQUESTS
            and data.draw(st.booleans(), label="one-token arrival?")
        ):
            lock.add(1, data.draw(st.integers(1, lock.config.max_model_len), label="max_tokens"))


class LoneMachine(LockstepMachine):
    # One request alone in the first steps: ``lone_config``.
    initial_requests_low = initial_requests_high = 1

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Longer than the threshold (lone_config draws it at most 8, below limit - 1).
        assert self.lock is not None
        return st.integers(self.lock.config.long_prefill_token_threshold + 1, limit - 1)


class PrefixMachine(LockstepMachine):
    """``prefix_config``'s requests: a crowd from the start and, between steps, more
    arrivals whose prompts share prefixes with those before them (``prompts``), so that
    repeats and later turns meet their originals still running, finished (their blocks
    cached and free) or preempted; up to ``requests_high`` of them."""

    initial_requests_low = 2
    requests_high: ClassVar[int] = 24

    def prompt_strategy(self, limit: int, late: bool) -> st.SearchStrategy[int]:
        # Several blocks long, now and then most of max_model_len.
        return st.one_of(st.integers(limit // 4, limit // 2), st.integers(1, limit - 1))

    def output_strategy(self, limit: int) -> st.SearchStrategy[int]:
        # Short ones finish and free their cached blocks; long ones grow into the pool.
        return st.one_of(st.integers(1, 8), st.integers(limit // 2, limit))

    def arrive_between_steps(self, lock: Lockstep, data: st.DataObject) -> None:
        if (
            len(lock.requests) < self.requests_high
            and data.draw(st.integers(0, 2), label="shared arrival?") == 0
        ):
            self._add(data)


ConfigStrategy = Callable[[str, str], st.SearchStrategy[EngineConfig]]


@dataclass(frozen=True)
class Aim:
    """Where a share of the examples looks: its config strategy, its machine, and its
    weight in a layout's share of the examples (``fuzz.shares``)."""

    config: ConfigStrategy
    machine: type[LockstepMachine]
    weight: int


AIMS: dict[str, Aim] = {
    "mixed": Aim(mixed_config, LockstepMachine, 0),
    "budget": Aim(budget_config, BudgetMachine, 1),
    "preempt": Aim(preempt_config, PreemptMachine, 3),
    "padded": Aim(padded_config, PaddedMachine, 1),
    "refund": Aim(refund_config, RefundMachine, 3),
    "token": Aim(token_config, TokenMachine, 1),
    "edge": Aim(edge_config, EdgeMachine, 3),
    "lone": Aim(lone_config, LoneMachine, 1),
    "prefix": Aim(prefix_config, PrefixMachine, 3),
}
"""The aims, in the order of a layout's units; ``mixed`` takes the rest of a share, so its
weight only counts in the total (12: when ``lone`` came and ``edge`` went from 1 to 2,
mixed's 2 went to them and every other aim kept its part; 16 since ``prefix`` came with 3
and ``edge`` went to 3, so that both run four examples per method at 200). A weight of 1
is one example per method at 200 over nine methods: only Hypothesis' first, simplest
example, which for ``edge`` never reaches the padding boundary (``lone``'s does reach
its own); ``edge`` needs three to kill the padding rule's five mutants (docs/mutate.md),
and ``prefix`` at three (weight 2) left a method's token budget or resume re-hit at zero
now and then."""


def machine_for(run: UnitRun) -> type[LockstepMachine]:
    """The machine of one unit: its aim's machine, bound to ``run``, starting from a
    config drawn by its aim's strategy for its profile and layout."""
    aim = AIMS[run.aim]

    @initialize(config=aim.config(run.profile, run.layout), data=st.data())
    def start(self: LockstepMachine, config: EngineConfig, data: st.DataObject) -> None:
        self.begin(config, data)

    name = f"Lockstep_{run.layout}_{run.aim}".replace("-", "_")
    machine = type(name, (aim.machine,), {"run": run, "start": start})
    return machine
