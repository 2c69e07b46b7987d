"""The reference scheduler under ``async_scheduling``: vLLM's ``AsyncScheduler``.

The engine schedules step n+1 before step n's output is back (a batch queue of depth 2).
As vLLM's ``AsyncScheduler`` subclasses its ``Scheduler`` and overrides
``_update_after_schedule`` and ``_update_request_with_output``, this class subclasses
the reference's and overrides the same two hooks, plus the reference's own bookkeeping of
the steps in flight, which vLLM leaves to the engine: a scheduled request holds output
placeholders for the tokens its step will sample, the steps in flight are kept by index,
and a request preempted while a step of it is in flight gets that step's output late and
stale (``_preempt``, ``_leave_flight``).

``make_scheduler`` picks the class for a config, as vLLM's ``SchedulerConfig`` picks
``scheduler_cls`` from ``async_scheduling``.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any, ClassVar

from dualbudget.spec.config import EngineConfig
from dualbudget.spec.profiles import Profile

from .events import Event, StepRecord
from .scheduler import NUM_SAMPLED_PER_STEP, OpenStep, Scheduler, UnmirroredVllmCrash
from .state import FINISHED, RUNNING, RequestState, SchedulerState, StepInFlight
from .violations import CheckMode


class AsyncScheduler(Scheduler):
    """``Scheduler`` with the steps it schedules ahead of their outputs."""

    schedules_ahead: ClassVar[bool] = True

    def _update_after_schedule(self, step: OpenStep) -> None:
        """``AsyncScheduler._update_after_schedule``: the base update (a request is
        mid-prefill while its computed tokens stop short of its tokens and its output
        placeholders), with the step's tokens in flight; then each request that samples
        in the step holds output placeholders for its sampled token and its spec tokens,
        and K placeholder drafts for the next step (the engine never calls
        ``update_draft_token_ids`` under async: the worker fills them in). One pass over
        the step does both, as the base's own pass does its part."""
        requests, k, spec = self.state.requests, self.num_spec_tokens, step.spec
        for rid, q in step.scheduled.items():
            request = requests[rid]
            computed = request.num_computed_tokens + q
            request.num_computed_tokens = computed
            request.num_in_flight_tokens += q
            request.is_prefill_chunk = computed < (
                request.prompt_len + request.num_output_tokens + request.num_output_placeholders
            )
            if not request.is_prefill_chunk:
                request.num_output_placeholders += NUM_SAMPLED_PER_STEP + spec.get(rid, 0)
                request.num_drafts = k

    def _put_in_flight(self, step: OpenStep) -> None:
        """The step joins those in flight, whose outputs are still to come."""
        in_flight = self.state.in_flight
        self.observed["async_in_flight"] += bool(in_flight)
        in_flight[step.index] = StepInFlight(step.scheduled, step.spec)

    def _preempt(self, request: RequestState, drop_stale_output: bool = False) -> None:
        """The output of the request's steps in flight still comes; it is stale, and is
        drained as it arrives (``_leave_flight``)."""
        super()._preempt(request, drop_stale_output)
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0

    def _leave_flight(self, scheduled: Mapping[str, int]) -> Set[str]:
        """The answered step's tokens leave flight, and the stale share of a request
        preempted since drains in step with the steps it covers."""
        requests, stale = self.state.requests, set()
        for rid, q in scheduled.items():
            request = requests[rid]
            request.num_in_flight_tokens -= q
            if request.num_stale_output_tokens > 0:
                request.num_stale_output_tokens -= q
                if request.status not in FINISHED:
                    stale.add(rid)
                    self.observed["stale_output"] += 1
        return stale

    def _update_request_with_output(
        self, request: RequestState, appended: int, num_sampled: int, is_stale: bool
    ) -> None:
        """``AsyncScheduler._update_request_with_output``: the placeholders the returned
        tokens stood for are resolved (a stale output's were dropped at the preemption):
        those of every token returned, while some are held, or of the tokens kept after
        a stop trims the output, as the release says. A release that does not cache
        verified output as it comes caches a running request's blocks here, up to its
        placeholders left."""
        if not is_stale:
            if self._resolves_placeholders_of_sampled:
                if request.num_output_placeholders > 0:
                    request.num_output_placeholders -= num_sampled
            else:
                request.num_output_placeholders -= appended
            if request.num_output_placeholders < 0:
                raise UnmirroredVllmCrash(
                    "negative-output-placeholders",
                    f"request {request.request_id!r}: vLLM asserts num_output_placeholders >= 0",
                )
        if not self._release_caches_verified_output and request.status == RUNNING:
            num_tokens = request.num_computed_tokens - request.num_output_placeholders
            self.kv.cache_blocks(self.state, request, num_tokens)


def make_scheduler(
    config: EngineConfig,
    profile: Profile,
    *,
    check: CheckMode = "raise",
    scenario: Mapping[str, Any] | None = None,
    state: SchedulerState | None = None,
    judge_books: bool = False,
) -> Scheduler:
    """The reference scheduler of ``config``: ``AsyncScheduler`` with
    ``async_scheduling``, else ``Scheduler``."""
    cls = AsyncScheduler if config.async_scheduling else Scheduler
    return cls(
        config, profile, check=check, scenario=scenario, state=state, judge_books=judge_books
    )


def transition(
    config: EngineConfig,
    profile: Profile,
    state: SchedulerState,
    event: Event,
    *,
    check: CheckMode = "raise",
) -> tuple[SchedulerState, StepRecord | None]:
    """The scheduler as a pure function: ``state`` is left untouched, the new state and
    the output (a StepRecord for ScheduleStep, else None) are returned."""
    scheduler = make_scheduler(config, profile, check=check, state=state)
    output = scheduler.handle(event)
    return scheduler.state, output
