"""The reference scheduler: vLLM v1's ``Scheduler`` for a declared subset, every budget
decision delegated to a ``spec`` policy.

The subset: text-only requests, no LoRA, encoder, KV connector, structured output or
pipeline parallelism; one full-attention KV group (prefix caching on or off: see
``kv/`` and docs/design.md §6) or several groups of the kinds ``kv/kinds.py``
maps (prefix caching on as ``kv/hybrid_caching.py`` models it, or off), no
multi-module MTP (its prefill lookahead is then a
no-op). Within it, one ``handle(event)`` call is
one of vLLM's ``add_request``, ``schedule`` (with ``_update_after_schedule``),
``update_from_output``, ``update_draft_token_ids`` or ``finish_requests``. With
``config.async_scheduling`` the scheduler is ``AsyncScheduler`` (``async_scheduler.py``),
as in vLLM a subclass that overrides the hooks of output placeholders and steps in flight;
``make_scheduler`` picks the class for a config. Blocks are the KV manager's (``kv/``).

Where vLLM's releases differ inside the subset, the branch reads a field of the
profile's release record (``spec.releases``), never a version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from typing import Any, ClassVar

from dualbudget.spec.books import block_held
from dualbudget.spec.config import EngineConfig, check_engine_config
from dualbudget.spec.invariants import StepTotals, step_totals, step_violations
from dualbudget.spec.policies import Ledger, StepParams
from dualbudget.spec.profiles import Profile

from . import books
from .budget_rules import BudgetRules
from .events import (
    Abort,
    AddRequest,
    DraftProposals,
    Event,
    InvalidEvent,
    ModelOutput,
    ResetPrefixCache,
    ScheduleStep,
    SetPauseState,
    StepRecord,
)
from .kv.blocks import initial_state
from .kv.coordinator import manager_for
from .kv.kinds import kind_of
from .state import (
    FINISHED,
    FINISHED_ABORTED,
    FINISHED_LENGTH,
    FINISHED_STOPPED,
    PREEMPTED,
    RUNNING,
    RequestState,
    SchedulerState,
    StepInFlight,
)
from .violations import CHECK_MODES, CheckMode, ContractViolation, StepViolation

# Re-exported: the crash is raised below the scheduler too (``kv/hybrid.py``).
from .violations import UnmirroredVllmCrash as UnmirroredVllmCrash

# vLLM's ``num_sampled_tokens_per_step`` for a generative model: each scheduled step that
# reaches the end of the prompt samples one token past the verified drafts.
NUM_SAMPLED_PER_STEP = 1

PREFIX_OBSERVED = (
    "prefix_hit",
    "full_prefix_hit",
    "cached_block_evicted",
    "hit_on_running_block",
    "resume_rehit",
)
"""The counters of prefix caching (counted only with it on; docs/design.md §6): a
request admitted from waiting with a cache hit, one whose hit is all its tokens but the
last, a cached free block handed out (its hash evicted), a hit block some running
request holds (per block), a preempted request resuming with a hit."""
KV_GROUP_OBSERVED = (
    "window_blocks_freed",
    "mamba_aligned_split",
    "hybrid_preempt",
    "hybrid_hit_cut",
    "hit_across_block_sizes",
)
"""The counters of the hybrid coordinator (``kv/hybrid.py``): blocks a sliding-window or
chunked-local group freed as they fell out of its window, a chunk Mamba's ``align`` mode
cut to a block boundary, a preemption under a pool of several groups, a request
admitted with a prefix hit that another group cut short of one group's own hit, and one
admitted with a prefix hit on groups of different block sizes."""
OBSERVED = (
    "async_in_flight",
    "stale_output",
    "in_flight_max_tokens_skip",
    "natural_stop",
    "prefill_lookahead_reserved",
    "reset_preempted",
    "stale_output_dropped",
    "paused_with_work",
    *PREFIX_OBSERVED,
    *KV_GROUP_OBSERVED,
)
"""What the scheduler counts as it goes (``Scheduler.observed``), for the fuzz's coverage:
a step scheduled while an earlier one's output is outstanding, an output arriving for a
request preempted after its step was scheduled, a running request skipped because its
in-flight output already reaches max_tokens, a request finished by EOS or a stop token,
a prefill chunk cut back so as not to end within multi-module MTP's lookahead of the
prompt's end, a prefix-cache reset that preempted running requests, an in-flight output
dropped because such a reset preempted its request, a step scheduled under a pause that
held back a running or waiting request, ``PREFIX_OBSERVED`` and ``KV_GROUP_OBSERVED``."""


_NONE_STALE: Set[str] = frozenset()


@dataclass(slots=True)
class OpenStep:
    """The step one ``schedule`` call builds; it dies with the call."""

    index: int
    token_budget: int
    input_budget: int
    """The step's ledger, moved only by the step book's rules (``BudgetRules``)."""
    scheduled: dict[str, int]
    """The book's entries: the tokens each request was charged for. The charge itself is
    the policy's charge of that many tokens, a function of them alone. Until the
    waiting loop starts, these are vLLM's ``scheduled_running_reqs``."""
    spec: dict[str, int]
    padded: list[str]
    preempted: list[str]
    prefill_scheduled: bool = False
    refunded: bool = False
    """Whether a request scheduled earlier in the step was preempted and refunded."""


@dataclass(slots=True)
class GrantCounts:
    """What the budget rules answered, counted as the loop asks them, so that the fuzz's
    budget coverage events (``integration/lockstep.py``) need not wrap the rules."""

    cut_by_input_budget: int = 0
    """Grants below ``min(need, token_budget)``: what cut them is the input budget."""
    cut_to_token_budget: int = 0
    """Grants below ``need`` that are exactly the token budget."""
    cut_after_refund: int = 0
    """Grants below ``need`` after a refund earlier in the same step."""
    refunds: int = 0
    """Refunds of a request preempted after it was scheduled in the same step."""


class Scheduler:
    """``(state, event) -> (state, output)``: ``handle`` returns the StepRecord for a
    ScheduleStep and None for every other event; ``state`` is the whole memory.

    One step at a time: every output answers the step just scheduled."""

    schedules_ahead: ClassVar[bool] = False
    """Whether step n+1 is scheduled before step n's output is back: the class of
    ``config.async_scheduling`` (``make_scheduler``)."""

    def __init__(
        self,
        config: EngineConfig,
        profile: Profile,
        *,
        check: CheckMode = "raise",
        scenario: Mapping[str, Any] | None = None,
        state: SchedulerState | None = None,
        judge_books: bool = False,
    ) -> None:
        if check not in CHECK_MODES:
            raise ValueError(f"check must be one of {', '.join(CHECK_MODES)}, not {check!r}")
        if config.async_scheduling != self.schedules_ahead:
            raise ValueError(
                f"{type(self).__name__} cannot run a config with async_scheduling ="
                f" {config.async_scheduling}: make_scheduler picks the class"
            )
        check_engine_config(config)
        profile.policy.validate(config)
        self.config = config
        self.profile = profile
        self.policy = profile.policy
        self.params = StepParams.of(config)
        # The book's transitions (and the policy's rules under them) on this config: the
        # spec's code the proofs run, on ints.
        self.rules = BudgetRules(self.policy, self.params)
        self.grants = GrantCounts()
        # The spec's charge and C(q) per q, for the contract check of every step.
        self._per_q: dict[int, tuple[int, int, int]] = {}
        self.check: CheckMode = check
        self.scenario = scenario
        self.release = profile.release
        """Every behaviour around the budget that differs between vLLM releases."""
        # The release's answers that every output of every request asks, read once.
        self._resolves_placeholders_of_sampled = self.release.resolves_placeholders_of_sampled
        self._release_caches_verified_output = self.release.caches_verified_output
        self.observed: dict[str, int] = dict.fromkeys(OBSERVED, 0)
        self.num_spec_tokens = config.num_speculative_tokens
        self.num_prefill_lookahead_tokens = config.num_prefill_lookahead_tokens
        self.num_lookahead_tokens = int(self.policy.num_lookahead_tokens(self.params))
        self.priority = config.scheduling_policy == "priority"
        self.kv = manager_for(config, self.release, self.num_lookahead_tokens, self.observed)
        # The Mamba align split of a chunk is the KV layout's, fixed for the run: asked once,
        # not per request of every step.
        self._block_aligned_split = self.kv.block_aligned_split()
        self._caches_verified_output = self._caches_output_as_it_comes(config)
        # Scheduler.schedule: a release may apply the threshold only to chunked prefill.
        self._threshold = (
            0
            if self.release.threshold_needs_chunked_prefill and not config.enable_chunked_prefill
            else config.long_prefill_token_threshold
        )
        self.violations: list[StepViolation] = []
        # The books (C7-C11, and C13 on its pool) judged on every step of the reference's
        # own: where it mirrors a vLLM behaviour that breaks one, the lockstep agreeing with
        # vLLM still names it.
        self._book_judges = (
            books.judges(
                async_scheduling=config.async_scheduling,
                num_speculative_tokens=self.num_spec_tokens,
                num_lookahead_tokens=self.num_lookahead_tokens,
                max_model_len=config.max_model_len,
            )
            if judge_books
            else ()
        )
        self._handlers: dict[type, Callable[[Any], StepRecord | None]] = {
            ScheduleStep: self._schedule,
            ModelOutput: self._update_from_output,
            DraftProposals: self._update_draft_token_ids,
            AddRequest: self._add_request,
            Abort: self._abort,
            ResetPrefixCache: self._reset_prefix_cache,
            SetPauseState: self._set_pause_state,
        }
        self.state = state.copy() if state is not None else self.initial_state(config)

    def _caches_output_as_it_comes(self, config: EngineConfig) -> bool:
        """Whether the release caches a running request's verified blocks as its output
        comes: when the step had spec tokens or output placeholders to verify, and from
        0.34 on a Mamba group's finalised states, spec tokens or not (a synchronous step
        holds no placeholders)."""
        beside_mamba = self.release.caches_output_beside_mamba and any(
            kind_of(group).holds_recurrent_state for group in config.groups
        )
        return (
            self.kv.enable_caching
            and self._release_caches_verified_output
            and (self.num_spec_tokens > 0 or self.schedules_ahead or beside_mamba)
        )

    @staticmethod
    def initial_state(config: EngineConfig) -> SchedulerState:
        return initial_state(config)

    def fork(self) -> Scheduler:
        """An independent scheduler at the same state (violations collected so far kept)."""
        twin = type(self)(
            self.config,
            self.profile,
            check=self.check,
            scenario=self.scenario,
            state=self.state,
            judge_books=bool(self._book_judges),
        )
        twin.violations = list(self.violations)
        return twin

    # -- events ----------------------------------------------------------------------
    def handle(self, event: Event) -> StepRecord | None:
        # The event classes are final: one lookup by type dispatches every event.
        handler = self._handlers.get(type(event))
        if handler is None:
            raise InvalidEvent(f"unknown event {event!r}")
        return handler(event)

    def _abort(self, event: Abort) -> None:
        self._finish(event.request_id, FINISHED_ABORTED)

    def _reset_prefix_cache(self, event: ResetPrefixCache) -> None:
        """``Scheduler.reset_prefix_cache``: the running requests are preempted from the
        last, so that each goes to the waiting queue's front and they wait in their
        running order; their output in flight is dropped, as they may resume at once."""
        state = self.state
        if event.reset_running_requests:
            if state.running:
                self.observed["reset_preempted"] += 1
            while state.running:
                victim = state.running.pop()
                self._preempt(state.requests[victim], drop_stale_output=True)
                state.preempted_since_step.append(victim)
        reset = self.kv.reset_prefix_cache(state, self.config.num_gpu_blocks)
        if event.reset_running_requests and not reset:
            # vLLM raises here too: only blocks of requests waiting for remote KV (a
            # connector, outside the subset) can outlive preempting every running one.
            raise InvalidEvent("reset_prefix_cache: blocks still held with nothing running")

    def _set_pause_state(self, event: SetPauseState) -> None:
        self.state.pause_state = event.state

    def _add_request(self, event: AddRequest) -> None:
        if event.request_id in self.state.requests:
            raise InvalidEvent(f"duplicate request id {event.request_id!r}")
        # vLLM's InputProcessor refuses prompt_len >= max_model_len for generative models.
        if not 1 <= event.prompt_len < self.config.max_model_len:
            raise InvalidEvent(
                f"request {event.request_id!r}: prompt_len {event.prompt_len} must be in"
                f" [1, max_model_len={self.config.max_model_len})"
            )
        if event.max_tokens < 1:
            raise InvalidEvent(f"request {event.request_id!r}: max_tokens must be >= 1")
        request = RequestState(
            event.request_id,
            event.prompt_len,
            event.max_tokens,
            event.priority,
            event.arrival_time,
        )
        self.kv.add_request(request, event)
        self.state.requests[event.request_id] = request
        self.state.waiting.append(event.request_id)
        self.state.num_arrivals += 1

    # -- schedule --------------------------------------------------------------------
    def _schedule(self, _: ScheduleStep) -> StepRecord:
        state = self.state
        step_index = state.num_steps
        state.num_steps += 1
        p, policy = self.params, self.policy
        step = OpenStep(step_index, *self.rules.opened, {}, {}, [], [])
        placeholders_before = (
            {
                rid: request.num_output_placeholders
                for rid, request in state.requests.items()
                if not request.finished
            }
            if self._book_judges
            else None
        )

        # Scheduler.schedule: the threshold only bites when someone could be starved.
        threshold = self._threshold
        if len(state.running) + len(state.waiting) <= 1:
            threshold = 0

        # Scheduler.schedule under a pause: paused_all opens the token budget at 0, so
        # neither loop schedules; paused_new admits only requests holding KV blocks while
        # they wait, which needs a KV connector (outside the subset): none.
        pause = state.pause_state
        if pause == "unpaused":
            self._schedule_running(step, threshold)
            # Scheduler.schedule: no admissions in a step that had to preempt.
            if not step.preempted:
                self._schedule_waiting(step, threshold)
        else:
            if state.waiting or (state.running and pause == "paused_all"):
                self.observed["paused_with_work"] += 1
            if pause == "paused_new":
                self._schedule_running(step, threshold)

        scheduled = step.scheduled
        self._update_after_schedule(step)
        self._put_in_flight(step)
        totals = step_totals(policy, p, scheduled, self._per_q)

        finished = state.finished_since_step
        state.finished_since_step = []
        preempted = step.preempted
        if state.preempted_since_step:
            preempted = state.preempted_since_step + preempted
            state.preempted_since_step = []
        # The step's own dicts and lists die with the call: the state keeps them, the
        # record gets copies (so that no consumer of the record can reach the state).
        state.last_padded = step.padded
        record = StepRecord(
            step=step_index,
            num_scheduled_tokens=dict(scheduled),
            scheduled_spec_tokens=dict(step.spec),
            preempted=list(preempted),
            finished=finished,
            target_tokens=totals.target_rows,
            draft_rows=totals.draft_rows,
            budgets_left={"token_budget": step.token_budget, "input_budget": step.input_budget},
        )
        self._check_contract(step_index, step, record, totals)
        if placeholders_before is not None:
            self._check_books(step, record, placeholders_before)
        return record

    def _update_after_schedule(self, step: OpenStep) -> None:
        """``Scheduler._update_after_schedule``: each scheduled request's tokens count as
        computed; a request is mid-prefill while they stop short of its tokens (and of
        its output placeholders, which one step at a time never holds)."""
        requests = self.state.requests
        for rid, q in step.scheduled.items():
            request = requests[rid]
            computed = request.num_computed_tokens + q
            request.num_computed_tokens = computed
            # request.num_tokens, inlined
            request.is_prefill_chunk = computed < request.prompt_len + request.num_output_tokens

    def _put_in_flight(self, step: OpenStep) -> None:
        """The step goes in flight alone: the output of the one before has come."""
        self.state.in_flight = {step.index: StepInFlight(step.scheduled, step.spec)}

    def _schedule_running(self, step: OpenStep, threshold: int) -> None:
        """The RUNNING loop of ``Scheduler.schedule``.

        It runs for every running request of every step, the reference's hottest loop:
        the budget rules are looked up once, and the ledger lives in locals while the loop
        runs (``step`` holds it across calls)."""
        state, rules, kv = self.state, self.rules, self.kv
        running, requests = state.running, state.requests
        scheduled = step.scheduled
        token_budget, input_budget = step.token_budget, step.input_budget
        done = rules.exhausted(token_budget, input_budget)
        index = 0
        while not done and index < len(running):
            rid = running[index]
            request = requests[rid]
            computed = request.num_computed_tokens
            q = self._running_tokens(step, request, token_budget, input_budget, threshold)
            if q <= 0:
                # vLLM skips (not stops at) a request that gets no tokens.
                index += 1
                continue
            # kv's promise (RequestState.kv_slots_covered, kv_skip_horizon): within it
            # the allocation is a no-op, so allocate_slots is asked only past it.
            if (
                computed + q > request.kv_slots_covered
                or computed - request.num_in_flight_tokens >= request.kv_skip_horizon
            ) and not kv.allocate_slots(state, request, q):
                # Preempting a request scheduled earlier in this step refunds its charge.
                step.token_budget, step.input_budget = token_budget, input_budget
                allocated, index = self._allocate_or_preempt(step, request, q, index)
                token_budget, input_budget = step.token_budget, step.input_budget
                if not allocated:
                    if (
                        self.priority
                        and request.status == PREEMPTED
                        and self.release.continues_after_priority_self_preemption
                    ):
                        # Scheduler.schedule: a priority request that preempted itself
                        # freed its blocks; the higher-priority ones after it may still
                        # fit, and ``index`` already points at the next one.
                        done = rules.exhausted(token_budget, input_budget)
                        continue
                    break
            # The policy's charge for q tokens, and the book's entry of it.
            token_budget, input_budget, done = rules.take(token_budget, input_budget, q)
            scheduled[rid] = q
            if request.is_prefill_chunk:
                step.prefill_scheduled = True
            index += 1
            if request.num_drafts:
                self._verify_drafts(step, rid, request, q, computed)
        step.token_budget, step.input_budget = token_budget, input_budget

    def _running_tokens(
        self,
        step: OpenStep,
        request: RequestState,
        token_budget: int,
        input_budget: int,
        threshold: int,
    ) -> int:
        """The tokens a running request gets this step before its KV allocation (0 or
        less: it is skipped). ``num_tokens`` is read off its fields rather than through
        the property: this runs for every running request of every step."""
        computed = request.num_computed_tokens
        num_tokens = request.prompt_len + request.num_output_tokens
        placeholders = request.num_output_placeholders
        if placeholders and computed + 2 - placeholders >= request.prompt_len + request.max_tokens:
            # Async scheduling: the output in flight reaches max_tokens even if every
            # draft in it is rejected; no further step is needed.
            self.observed["in_flight_max_tokens_skip"] += 1
            return 0
        # request.num_tokens_with_spec + num_output_placeholders - computed
        need = num_tokens + request.num_drafts + placeholders - computed
        if 0 < threshold < need:
            need = threshold
        q = self.rules.grant(token_budget, input_budget, need)
        if q < need:
            self._count_cut(step, token_budget, q)
        # The position cap vLLM applies for spec decoding: keep one slot for the sampled
        # token below max_model_len.
        cap = self.config.max_model_len - NUM_SAMPLED_PER_STEP - computed
        if cap < q:
            q = cap
        split = self._block_aligned_split
        if split is not None:
            # Mamba align: the chunk ends where a state is cached, before its charge.
            q = split(request, computed, q)
        if self.num_prefill_lookahead_tokens > 1:
            q = self._reserve_prefill_lookahead(num_tokens - computed, q)
        return q

    @staticmethod
    def _verify_drafts(
        step: OpenStep, rid: str, request: RequestState, q: int, computed: int
    ) -> None:
        """Drafts past the verified tokens are what this step verifies; the rest are
        dropped (vLLM clears ``spec_token_ids`` once the request is scheduled)."""
        drafts = request.num_drafts
        num_tokens = request.prompt_len + request.num_output_tokens
        num_spec = q + computed - num_tokens - request.num_output_placeholders
        if num_spec > 0:
            step.spec[rid] = drafts if drafts < num_spec else num_spec
        request.num_drafts = 0

    def _allocate_or_preempt(
        self, step: OpenStep, request: RequestState, q: int, index: int
    ) -> tuple[bool, int]:
        """The ``allocate_slots`` retry loop of the RUNNING loop, once the pool is short:
        preempt until ``request`` fits or it preempted itself. Returns (allocated, the
        index of ``request``)."""
        state = self.state
        while True:
            victim = self._pick_victim()
            victim_index = state.running.index(victim.request_id)
            del state.running[victim_index]
            if self.priority and victim_index < index:
                index -= 1
            charged_for = step.scheduled.pop(victim.request_id, None)
            if charged_for is not None:
                # Only priority scheduling can pick a victim already scheduled this step
                # (FCFS takes the last running request, never one before ``request``).
                # The book refunds exactly what it charged, once: the entry is gone.
                step.token_budget, step.input_budget = self.rules.give_back(
                    step.token_budget, step.input_budget, charged_for
                )
                step.refunded = True
                self.grants.refunds += 1
                step.spec.pop(victim.request_id, None)
            self._preempt(victim)
            step.preempted.append(victim.request_id)
            if victim is request:
                return False, index
            if self.kv.allocate_slots(state, request, q):
                return True, index

    def _pick_victim(self) -> RequestState:
        running = [self.state.requests[rid] for rid in self.state.running]
        if not self.priority:
            return running[-1]
        # Scheduler.schedule: max by (priority, arrival_time); ties keep the first found.
        victim = running[0]
        for candidate in running[1:]:
            if (candidate.priority, candidate.arrival_time) > (
                victim.priority,
                victim.arrival_time,
            ):
                victim = candidate
        return victim

    def _preempt(self, request: RequestState, drop_stale_output: bool = False) -> None:
        """``Scheduler._preempt_request``: free the blocks, forget the computed tokens and
        the drafts, go back to the front of the waiting queue. Output still in flight
        turns stale (only under async scheduling is any): dropped when it comes if
        ``drop_stale_output``, or if an earlier drop is still to come, else delivered."""
        self.kv.preempt(self.state, request)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        request.num_drafts = 0
        request.num_preemptions += 1
        request.drop_stale_output = drop_stale_output or (
            request.drop_stale_output and request.num_stale_output_tokens > 0
        )
        self.state.waiting.insert(0, request.request_id)

    def _schedule_waiting(self, step: OpenStep, threshold: int) -> None:
        """The WAITING loop of ``Scheduler.schedule``."""
        state, rules, kv = self.state, self.rules, self.kv
        # Only running requests are scheduled so far: vLLM's ``scheduled_running_reqs``.
        running_scheduled = bool(step.scheduled)
        skipped: list[str] = []
        while state.waiting and not rules.exhausted(step.token_budget, step.input_budget):
            if len(state.running) >= rules.max_active_requests:
                break
            request = state.requests[self._peek_waiting()]
            if request.num_stale_output_tokens and not request.drop_stale_output:
                # Resuming now could resample a position its stale output will still
                # deliver: skip it until that output has come (a dropped one delivers
                # nothing).
                skipped.append(self._pop_waiting(request.request_id))
                continue
            # A request starts at its cache hit (none without prefix caching): a full hit
            # leaves it one token, padded as any one-token decode.
            hit, computed = kv.get_computed_blocks(state, request)
            granted = self._waiting_tokens(step, request, computed, threshold, running_scheduled)
            if granted is None:
                break
            q, padded = granted
            if q <= 0:
                # Unreachable in the subset before the lookahead (the loop guard leaves
                # room >= 1); mirrored for the branch's sake.
                if self.release.requeues_unscheduled_waiting:
                    # So that it does not stall the ones behind it.
                    skipped.append(self._pop_waiting(request.request_id))
                    continue
                break
            # allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl), vLLM's default
            if not kv.full_sequence_fits(state, request, hit) or not kv.allocate_slots(
                state, request, q, hit
            ):
                break
            self._admit(step, request, computed, q, padded)
        # Requests skipped this step go back to the front, in their order.
        state.waiting[:0] = skipped

    def _waiting_tokens(
        self,
        step: OpenStep,
        request: RequestState,
        computed: int,
        threshold: int,
        running_scheduled: bool,
    ) -> tuple[int, bool] | None:
        """The tokens a waiting request gets this step before its KV allocation, and
        whether they are a padded decode (None: the waiting loop stops here)."""
        rules, k = self.rules, self.num_spec_tokens
        room = rules.room(step.token_budget, step.input_budget)
        need = request.num_tokens - computed
        padded = False
        # Scheduler.schedule's pad_spec_decode: a new one-token decode joins a decode
        # batch at the uniform width 1 + K (real drafts or placeholders).
        if (
            k > 0
            and need == 1
            and not step.prefill_scheduled
            and (running_scheduled or computed > 0)
            and computed + 1 + k + NUM_SAMPLED_PER_STEP <= self.config.max_model_len
        ):
            if 1 + k > room:
                return None  # vLLM prefers not scheduling it to scheduling it unpadded
            need, padded = 1 + k, True
        if 0 < threshold < need:
            need = threshold
        if not self.config.enable_chunked_prefill and need > room:
            return None
        q = rules.grant(step.token_budget, step.input_budget, need)
        if q < need:
            self._count_cut(step, step.token_budget, q)
        if q <= 0:
            return q, padded
        split = self._block_aligned_split
        if split is not None:
            # Mamba align: the chunk ends where a state is cached, before its charge
            # (a cache hit's end is where the chunk starts).
            q = split(request, computed, q)
            if q == 0:
                return None
            if padded and q != 1 + k:
                # vLLM drops the padding rather than shorten it.
                q, padded = 1, False
        # Left no tokens by the lookahead: handled as a request granted none.
        return self._reserve_prefill_lookahead(request.num_tokens - computed, q), padded

    def _admit(
        self, step: OpenStep, request: RequestState, computed: int, q: int, padded: bool
    ) -> None:
        """A waiting request scheduled ``q`` tokens from its ``computed`` ones, its KV
        slots allocated: it runs, and the policy charges it."""
        k = self.num_spec_tokens
        # vLLM asserts it only once allocate_slots has succeeded: with a pool too short for
        # the cut request it just stops the waiting loop.
        if padded and q != 1 + k:
            raise UnmirroredVllmCrash(
                "padded-decode-cut-by-long-prefill-threshold",
                "vLLM's Scheduler.schedule asserts a padded spec-decode request keeps"
                f" 1 + K = {1 + k} tokens, but long_prefill_token_threshold cut request"
                f" {request.request_id!r} to {q}",
            )
        self._pop_waiting(request.request_id)
        self.state.running.append(request.request_id)
        if computed:
            self._count_hit(request, computed)
        request.status = RUNNING
        request.num_computed_tokens = computed
        # The policy's charge for q tokens, and the book's entry of it.
        step.token_budget, step.input_budget, _ = self.rules.take(
            step.token_budget, step.input_budget, q
        )
        step.scheduled[request.request_id] = q
        if padded:
            step.spec[request.request_id] = k
            step.padded.append(request.request_id)

    def _reserve_prefill_lookahead(self, num_left: int, q: int) -> int:
        """vLLM's ``_reserve_prefill_lookahead``, for both scheduling loops: of ``num_left``
        tokens to compute, ``q`` less what keeps the chunk from ending within the config's
        prefill lookahead of the end (multi-module MTP's drafter reads that many past it;
        a no-op for a lookahead of one token or none), each chunk it cuts back counted
        (``prefill_lookahead_reserved``)."""
        lookahead = self.num_prefill_lookahead_tokens
        remaining = num_left - q
        if 0 < remaining < lookahead:
            self.observed["prefill_lookahead_reserved"] += 1
            return q - (lookahead - remaining)
        return q

    def _count_cut(self, step: OpenStep, token_budget: int, q: int) -> None:
        """A grant of ``q`` tokens short of the need, in ``GrantCounts``."""
        grants = self.grants
        if q < token_budget:
            grants.cut_by_input_budget += 1
        elif q == token_budget:
            grants.cut_to_token_budget += 1
        if step.refunded:
            grants.cut_after_refund += 1

    def _count_hit(self, request: RequestState, computed: int) -> None:
        """An admission with a cache hit, in ``OBSERVED``'s prefix-caching counters."""
        observed = self.observed
        observed["prefix_hit"] += 1
        if computed == request.num_tokens - 1:
            observed["full_prefix_hit"] += 1
        if request.status == PREEMPTED:
            observed["resume_rehit"] += 1

    def _peek_waiting(self) -> str:
        waiting = self.state.waiting
        if not self.priority:
            return waiting[0]
        requests = self.state.requests
        # vLLM's priority queue is a heap over Request.__lt__.
        return min(
            waiting,
            key=lambda rid: (requests[rid].priority, requests[rid].arrival_time, rid),
        )

    def _pop_waiting(self, request_id: str) -> str:
        self.state.waiting.remove(request_id)
        return request_id

    # -- after the forward -----------------------------------------------------------
    def _update_from_output(self, event: ModelOutput) -> None:
        """``Scheduler.update_from_output`` for the step ``event`` answers: roll back
        rejected drafts, append the sampled tokens one by one, stop on a stop token, at
        max_tokens or at max_model_len. The step's tokens leave flight first
        (``_leave_flight``); the output of a request preempted since is stale: delivered,
        but rolling nothing back."""
        state, requests = self.state, self.state.requests
        last = state.num_steps - 1
        step = last if event.step is None else event.step
        scheduled, spec = self._answered(event, step)
        stale = self._leave_flight(scheduled)
        for rid, num_sampled in event.num_sampled.items():
            num_spec = spec.get(rid, 0)
            if not 0 <= num_sampled <= 1 + num_spec:
                raise InvalidEvent(
                    f"request {rid!r} sampled {num_sampled} tokens; at most 1 + {num_spec}"
                )
            if not num_sampled:
                continue
            request = requests[rid]
            if request.status in FINISHED:
                continue
            is_stale = rid in stale if stale else False
            if is_stale and request.drop_stale_output:
                # Its positions may be scheduled again already: the output is dropped.
                self.observed["stale_output_dropped"] += 1
                continue
            self._apply_output(event, request, num_sampled, num_spec, is_stale)
        if step == last:
            state.last_padded = []

    def _answered(
        self, event: ModelOutput, step: int
    ) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """The tokens and drafts scheduled in the step ``event`` answers, once the event
        is checked against them. One output per step: a second one for the same step
        finds nothing in flight."""
        answered = self.state.in_flight.pop(step, None)
        scheduled, spec = (answered.scheduled, answered.spec) if answered else ({}, {})
        sampled = event.num_sampled
        if not sampled.keys() <= scheduled.keys():
            stray = next(rid for rid in sampled if rid not in scheduled)
            which = "the last step" if event.step is None else f"step {step}"
            raise InvalidEvent(f"model output for {stray!r}, not scheduled in {which}")
        if self.kv.enable_caching:
            self.kv.check_output(self.state, event)
        for rid, kept in event.stopped.items() if event.stopped else ():
            if not 1 <= kept <= sampled.get(rid, 0):
                raise InvalidEvent(
                    f"request {rid!r} stopped at token {kept} of {sampled.get(rid, 0)} sampled"
                )
        return scheduled, spec

    def _apply_output(
        self,
        event: ModelOutput,
        request: RequestState,
        num_sampled: int,
        num_spec: int,
        is_stale: bool,
    ) -> None:
        """One request's ``num_sampled`` tokens of ``event`` applied: its rejected drafts
        rolled back, the tokens appended up to a stop, its blocks cached as they come."""
        kv_manager, rid = self.kv, request.request_id
        if num_spec and not is_stale:
            # A stale rejection count predates the preemption's reset: not applied.
            rejected = num_spec - (num_sampled - NUM_SAMPLED_PER_STEP)
            if request.num_computed_tokens > 0:
                request.num_computed_tokens -= rejected
            if request.num_output_placeholders > 0:
                request.num_output_placeholders -= rejected
        # The tokens are appended one by one, each followed by
        # vllm.v1.core.sched.utils.check_stop: a stop token first, then the length rule,
        # stop after the first i >= 1 appended tokens with
        # prompt_len + output + i >= max_model_len or output + i >= max_tokens.
        output = request.num_output_tokens
        stop_after = request.max_tokens - output
        to_max_model_len = self.config.max_model_len - request.prompt_len - output
        if to_max_model_len < stop_after:
            stop_after = to_max_model_len
        if stop_after < 1:
            stop_after = 1
        status = None
        appended = num_sampled
        stopped = event.stopped
        if stopped and 0 < (natural := stopped.get(rid, 0)) <= stop_after:
            appended, status = natural, FINISHED_STOPPED
            self.observed["natural_stop"] += 1
        elif stop_after <= num_sampled:
            appended, status = stop_after, FINISHED_LENGTH
        request.num_output_tokens = output + appended
        if kv_manager.enable_caching:
            kv_manager.append_output(request, event, appended)
        # Only a scheduler that schedules ahead holds output placeholders to resolve: the
        # one-step-at-a-time loop spares the call.
        if self.schedules_ahead:
            self._update_request_with_output(request, appended, num_sampled, is_stale)
        if self._caches_verified_output and not is_stale and request.status == RUNNING:
            # The blocks a running request's verified tokens complete are cached as its
            # output comes (before a stop frees them), not only at its next allocation; a
            # stop first takes the tokens after it out of the computed.
            verified = (
                request.num_computed_tokens
                - request.num_in_flight_tokens
                - (num_sampled - appended)
            )
            # kv's promise (RequestState.kv_slots_covered): no block within it is left to
            # cache, so most outputs skip the call.
            if verified > request.kv_slots_covered:
                kv_manager.cache_blocks(self.state, request, verified)
        if status is not None:
            self._finish(rid, status)

    def _leave_flight(self, scheduled: Mapping[str, int]) -> Set[str]:
        """The answered step's tokens leave flight; returns the requests whose output is
        stale. One step at a time, none is: a preemption waits for no output."""
        return _NONE_STALE

    def _update_request_with_output(
        self, request: RequestState, appended: int, num_sampled: int, is_stale: bool
    ) -> None:
        """``_update_request_with_output`` past appending the tokens: one step at a time
        holds no output placeholders, so nothing is left to do."""

    def _update_draft_token_ids(self, event: DraftProposals) -> None:
        """``Scheduler.update_draft_token_ids``: a request mid-prefill drops its drafts."""
        requests, k = self.state.requests, self.num_spec_tokens
        proposed = event.num_drafts
        if proposed and not 0 <= min(proposed.values()) <= max(proposed.values()) <= k:
            rid = next(rid for rid, n in proposed.items() if not 0 <= n <= k)
            raise InvalidEvent(f"request {rid!r} proposed {proposed[rid]} drafts; K is {k}")
        for rid, num_drafts in proposed.items():
            request = requests.get(rid)
            if request is None or request.status in FINISHED:
                continue
            request.num_drafts = 0 if request.is_prefill_chunk else num_drafts

    def _finish(self, request_id: str, status: str) -> None:
        """``Scheduler.finish_requests`` / ``_free_request``: leave the queues, free blocks."""
        state = self.state
        request = state.requests.get(request_id)
        if request is None or request.finished:
            return
        # A request sits in one queue at most: one found running is not looked for among
        # the (possibly thousands of) waiting ones.
        if request_id in state.running:
            state.running.remove(request_id)
        elif request_id in state.waiting:
            state.waiting.remove(request_id)
        self.kv.free(state, request)
        request.status = status
        state.finished_since_step.append(request_id)

    # -- the contract ----------------------------------------------------------------
    def _check_contract(
        self, step_index: int, step: OpenStep, record: StepRecord, totals: StepTotals
    ) -> None:
        ledger = Ledger(step.token_budget, step.input_budget)
        found = step_violations(self.policy, self.params, ledger, totals)
        for violation in found:
            found_at_step = StepViolation(
                step_index,
                violation.contract,
                violation.message,
                self._step_state(step, record),
            )
            if self.check == "raise":
                raise ContractViolation(found_at_step, self.scenario)
            self.violations.append(found_at_step)

    def _check_books(
        self, step: OpenStep, record: StepRecord, placeholders_before: dict[str, int]
    ) -> None:
        found = books.step_books(
            self.state, self.kv, placeholders_before, step.scheduled, step.spec, step.preempted
        )
        for rid, request_books in found.items():
            for item, holds in self._book_judges:
                if holds(request_books):
                    continue
                violation = StepViolation(
                    step.index,
                    item,
                    f"request {rid}: {request_books}",
                    self._step_state(step, record),
                )
                self._report_book(violation)
        self._check_pool(step, record)

    def _check_pool(self, step: OpenStep, record: StepRecord) -> None:
        """C13 on the reference's own pool, where its blocks have ids (prefix caching)."""
        pool = books.pool_books(self.state)
        if pool is None:
            return
        for block, holders in pool.holders.items():
            if block_held(pool, block):
                continue
            cached = "cached" if block in pool.hashed else "no hash"
            self._report_book(
                StepViolation(
                    step.index,
                    "C13",
                    f"block {block} held by {holders} tables, ref_cnt"
                    f" {pool.ref_counts[block]}, {cached}",
                    self._step_state(step, record),
                )
            )

    def _report_book(self, violation: StepViolation) -> None:
        if self.check == "raise":
            raise ContractViolation(violation, self.scenario)
        self.violations.append(violation)

    def _step_state(self, step: OpenStep, record: StepRecord) -> dict[str, Any]:
        opened = self.policy.open(self.params)
        return {
            "profile": self.profile.name,
            "record": record.to_json(),
            "opened": {"token_budget": opened.token_budget, "input_budget": opened.input_budget},
            "charges": {rid: self._charge_json(q) for rid, q in step.scheduled.items()},
            "state": self.state.to_json(),
        }

    def _charge_json(self, q: int) -> dict[str, Any]:
        charge = self.policy.charge(self.params, q)
        return {"tokens": charge.tokens, "rows": charge.rows}
