"""The fuzz's coverage events: one table (``COVERAGE``) that everything reads.

A coverage event is an abstract thing a lockstep step can do (a grant cut by the input
budget, a preemption, a prefix-cache hit, ...). Each row says how the event is named
(its counter, counted per method by ``lockstep.Lockstep`` or, for the scheduler's own
counts, by ``reference.scheduler.OBSERVED``; its column head in the coverage table),
which aim of the fuzz draws it (``aims.AIMS``: where a top-up round looks again), where
it can happen (which releases and methods can reach it, read from the ``Release``
record's flags) and why the aim reaches it. The coverage gate requires every event
wherever its row says it can happen (``required_events``). Adding an event is one row
here and its count in ``lockstep`` or the reference scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dualbudget.spec.config import SpeculativeConfig, runs_async
from dualbudget.spec.methods import layout_named
from dualbudget.spec.releases import Release

Reach = Callable[[Release, SpeculativeConfig], bool]
"""Whether a release can reach an event with a drafter (its ``speculative_config``)."""


def everywhere(release: Release, spec: SpeculativeConfig) -> bool:
    """Every release, every method of the table: each fuzzed row has K >= 1."""
    return True


def where_async_runs(release: Release, spec: SpeculativeConfig) -> bool:
    """Only under async scheduling: where the release lets the drafter run it."""
    return runs_async(spec, release)


def where_full_hits_happen(release: Release, spec: SpeculativeConfig) -> bool:
    """Not where the release drops a hit's last block for the drafter: its hit is then at
    most ``num_tokens - 1 - block_size``, never a full one."""
    return not release.drops_last_hit_block(spec.method)


def where_mtp_is_drawn(release: Release, spec: SpeculativeConfig) -> bool:
    """The row whose methods include MTP (the EAGLE row): the aims draw its drafter as MTP
    of K modules now and then."""
    return spec.layout.takes_mtp


@dataclass(frozen=True)
class CoverageEvent:
    """One coverage event: its counter, its column head, the aim that draws it, where it
    can happen, and why the aim reaches it there."""

    name: str
    """The counter's name, in ``Lockstep.coverage`` and the fuzz's JSON."""
    short: str
    """The coverage table's column head."""
    aim: str
    """The aim (``aims.AIMS``) that draws it: the unit a top-up round reruns."""
    reason: str
    """Why the aim reaches it wherever ``reached`` says it can happen."""
    reached: Reach = everywhere
    """Where the gate requires it: the releases and methods that can reach it."""
    alone: bool = False
    """Counted from vLLM's own state too, so that a run of the live scheduler alone
    (``monitor_run.LiveAlone``, no reference to count it) is gated on it."""


COVERAGE: tuple[CoverageEvent, ...] = (
    CoverageEvent(
        "input_budget_bound",
        "input-bound",
        "budget",
        "A grant cut by the draft/input budget. With slots > 0 any grant past"
        " B - sum(q + slots) - slots is cut by it. With 0 slots vLLM charges the input"
        " budget exactly what it charges the token budget, so it binds only where the token"
        " budget opens above it (max_num_scheduled_tokens > max_num_batched_tokens, which"
        " vLLM's SchedulerConfig accepts): the budget aim draws that.",
    ),
    CoverageEvent(
        "chunked_prefill",
        "chunked",
        "mixed",
        "A prefill chunk short of the prompt: any prompt longer than what is left of a"
        " budget, with chunked prefill on.",
        alone=True,
    ),
    CoverageEvent(
        "preemption",
        "preempt",
        "preempt",
        "A preemption: a KV pool of one to 1.5 full requests and decodes growing into it.",
        alone=True,
    ),
    CoverageEvent(
        "preempt_scheduled",
        "preempt-sched",
        "preempt",
        "A preemption of a request already scheduled in the same step: only under priority"
        " scheduling (FCFS's victim is the last running request, never one scheduled before"
        " the requester); the preempt aim draws priority, a tight pool and outranking late"
        " arrivals.",
    ),
    CoverageEvent(
        "padded_decode",
        "padded",
        "padded",
        "A new one-token request joining decodes padded to 1 + K: vLLM pads it"
        " (pad_spec_decode) for every method with K >= 1 (no dynamic_sd_lookup here).",
        alone=True,
    ),
    CoverageEvent(
        "rejected_drafts",
        "rejected",
        "mixed",
        "A step output rejecting drafts: acceptance is drawn below the drafts proposed.",
        alone=True,
    ),
    CoverageEvent(
        "max_model_len_cap",
        "len-cap",
        "edge",
        "A grant cut at max_model_len: the edge aim draws max_model_len in [K + 1, 2K + 4],"
        " where a decode's 1 + K tokens run into it.",
    ),
    CoverageEvent(
        "bound_after_refund",
        "after-refund",
        "refund",
        "A grant cut by a budget after a refund earlier in the same step (the only grants"
        " a refund that restores too much or too little changes). A refund needs priority"
        " scheduling, and the grant it can change is one after the preempting request in"
        " the RUNNING loop (vLLM skips the WAITING loop in a step that preempted) asking"
        " more than is left: the refund aim builds that order (arrivals each outranking"
        " those before, so that the victim runs first) and sizes the budget and the pool"
        " for it, the token budget binding in half its draws and the input budget in the"
        " other half; always the token budget, with B raised to admit the batch, where"
        " admission is capped by B (caps_own_pass_admission: DFlash and DSpark run at most"
        " B // num_lookahead_tokens requests).",
    ),
    CoverageEvent(
        "token_budget_bound",
        "token-bound",
        "token",
        "A grant cut by the token budget where it opens below the input budget"
        " (max_num_scheduled_tokens < max_num_batched_tokens; vLLM's default is equal): the"
        " only case where a token-budget bug shows, and the token aim always draws it.",
    ),
    CoverageEvent(
        "async_in_flight",
        "in-flight",
        "mixed",
        "A step scheduled while an earlier one's output is outstanding: every aim draws"
        " async scheduling wherever the release lets the drafter run it (not ngram under"
        " a release that refuses async ngram, nor ngram with parallel drafting, which model"
        " runner V2 refuses).",
        where_async_runs,
        alone=True,
    ),
    CoverageEvent(
        "stale_output",
        "stale",
        "preempt",
        "An output for a request preempted after its step was scheduled: async scheduling"
        " and a preemption of a request with a step in flight.",
        where_async_runs,
    ),
    CoverageEvent(
        "in_flight_max_tokens_skip",
        "max-tok-skip",
        "mixed",
        "A running request skipped because its in-flight output reaches max_tokens: async"
        " scheduling and short outputs.",
        where_async_runs,
    ),
    CoverageEvent(
        "natural_stop",
        "stop",
        "mixed",
        "A request finished by EOS or a stop token: every aim draws stop tokens among the"
        " outputs, sync and async.",
    ),
    CoverageEvent(
        "prefill_lookahead_reserved",
        "mtp-reserve",
        "mixed",
        "A prefill chunk cut back so as not to end within K tokens of the prompt's end"
        " (vLLM's _reserve_prefill_lookahead, multi-module MTP): on the EAGLE row one"
        " config of two with K > 1 draws MTP of K modules, and chunked prompts longer"
        " than what is left of the budget end at any token.",
        where_mtp_is_drawn,
    ),
    CoverageEvent(
        "prefix_hit",
        "hit",
        "prefix",
        "A request admitted with a prefix-cache hit: the prefix aim runs with prefix"
        " caching and prompts that share prefixes (prompts.PROMPT_KINDS); every other aim"
        " runs with it off.",
    ),
    CoverageEvent(
        "full_prefix_hit",
        "full-hit",
        "prefix",
        "A hit of all a request's tokens but the last: half the prefix aim's prompts are"
        " cut to n * block_size + 1 tokens, the length whose hit vLLM caps at"
        " num_tokens - 1.",
        where_full_hits_happen,
    ),
    CoverageEvent(
        "cached_block_evicted",
        "evicted",
        "prefix",
        "A cached free block handed out again (its hash evicted): the prefix aim's pool of"
        " one to 1.5 full requests.",
    ),
    CoverageEvent(
        "hit_on_running_block",
        "hit-running",
        "prefix",
        "A hit block some running request holds: a repeat or a later turn admitted while the"
        " earlier request runs (vLLM caches a block when it allocates it, so the same"
        " step's admissions hit it too).",
    ),
    CoverageEvent(
        "resume_rehit",
        "rehit",
        "prefix",
        "A preempted request resuming with a hit on its own cached blocks: the prefix aim's"
        " small pool preempts growing decodes.",
    ),
    CoverageEvent(
        "window_blocks_freed",
        "window-freed",
        "hybrid",
        "A sliding-window (or chunked-local) group freeing the blocks that fell out of its"
        " window: the hybrid aim draws windows of one or two blocks beside full attention,"
        " and every decode past them frees one. Every method of the table builds the aim's"
        " layouts in both releases (tests/live/test_hybrid_live.py builds each).",
    ),
    CoverageEvent(
        "mamba_aligned_split",
        "mamba-split",
        "hybrid",
        "Mamba's align mode moving a prefill chunk's end back to a block boundary"
        " (vLLM's _mamba_block_aligned_split): the hybrid aim draws Mamba in align mode"
        " in three of its layouts, with budgets that cut prompts off a boundary.",
    ),
    CoverageEvent(
        "hybrid_hit_cut",
        "hit-cut",
        "hybrid",
        "A request admitted with a prefix hit that another group cut short of one group's"
        " own hit (vLLM's num_uncached_common_prefix_tokens > 0): the hybrid aim draws"
        " prefix caching on its layouts without Mamba, with arrivals sharing prefixes, and"
        " windows of one or two blocks whose blocks, freed as the window slides, are"
        " evicted from the pool's head while full attention's are still held.",
    ),
    CoverageEvent(
        "hit_across_block_sizes",
        "hit-sizes",
        "hybrid",
        "A request admitted with a prefix hit on KV groups of different block sizes (hashes"
        " of the sizes' GCD, the hit on their LCM): the hybrid aim draws two layouts of"
        " two block sizes (full attention at twice a window's block, and at twice the"
        " target's for the drafter's) and DeepSeek V4's of three, prefix caching on in"
        " most draws, with arrivals sharing prefixes.",
    ),
    CoverageEvent(
        "hybrid_preempt",
        "hyb-preempt",
        "hybrid",
        "A preemption under a pool shared by several groups: the hybrid aim's pool holds"
        " one to 1.5 full requests in every group, and decodes grow into it.",
    ),
    CoverageEvent(
        "reset_preempted",
        "reset",
        "engine_calls",
        "A prefix-cache reset that preempts running requests (reset_running_requests):"
        " every example of the engine_calls aim resets after its first steps, with its"
        " requests' outputs drawn long enough to be running then.",
    ),
    CoverageEvent(
        "stale_output_dropped",
        "dropped",
        "engine_calls",
        "An output in flight dropped because a reset preempted its request: under async"
        " scheduling the step before the reset is in flight when it comes.",
        reached=where_async_runs,
    ),
    CoverageEvent(
        "paused_with_work",
        "paused",
        "engine_calls",
        "A step scheduled under a pause that holds back a running or waiting request: the"
        " engine_calls aim pauses after the steps that follow its reset.",
    ),
)
"""Every coverage event, in the coverage table's order. Every row of the method table is
fuzzed: vLLM builds each from config-only folders (suffix, which needs arctic-inference,
is not fuzzed; MTP, which needs an MTP target checkpoint, runs as the EAGLE row's drafter
relabelled; see docs/vllm-environments.md)."""

EVENT_NAMES = tuple(event.name for event in COVERAGE)
"""The counters, in the table's order."""

EVENTS = {event.name: event for event in COVERAGE}


def required_events(layout: str, release: Release, alone: bool = False) -> tuple[str, ...]:
    """The gate's events for ``layout`` under ``release``: every event whose row says the
    release can reach it with the layout's drafter; ``alone``: of those, the ones vLLM's
    own state shows (a run of the live scheduler without the reference)."""
    spec = SpeculativeConfig.for_layout(layout_named(layout), 1)
    return tuple(
        event.name
        for event in COVERAGE
        if event.reached(release, spec) and (event.alone or not alone)
    )
