"""The events a scheduler sees from outside, and the step record it answers with.

The reference scheduler, the live vLLM adapter and the trace replayer consume the very
same events, so a difference in their step records is a difference in scheduling, not in
what they were fed.

One engine step is: ``ScheduleStep`` (the scheduler decides; answer: a ``StepRecord``),
then ``ModelOutput`` (the sampled token counts of that step), then ``DraftProposals``
(the drafts proposed for the next step). ``AddRequest`` and ``Abort`` come between steps,
and so do the engine's own calls on the scheduler: ``ResetPrefixCache`` (between weight
updates of an RL rollout) and ``SetPauseState`` (the engine's pause and resume).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dualbudget.spec.errors import BadInput


class InvalidEvent(BadInput):
    """An event the scheduler cannot take (a duplicate id, more tokens sampled than
    scheduled, ...): the event stream, not the scheduler, is wrong."""


@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: str
    prompt_len: int
    max_tokens: int
    priority: int = 0
    arrival_time: float = 0.0
    """vLLM's ``arrival_time``; priority scheduling breaks ties on it."""
    prompt_token_ids: tuple[int, ...] | None = None
    """The prompt's token ids (``len == prompt_len``), for prefix caching: the reference
    hashes its full blocks itself (``prefix_cache.hash_blocks``)."""
    block_hashes: tuple[str, ...] | None = None
    """Instead of ids (a recorded trace): vLLM's hashes of the prompt's full blocks, as
    opaque strings; only their equality matters. With ``enable_prefix_caching`` every
    request carries exactly one of the two; without it both are ignored."""


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class ResetPrefixCache:
    """vLLM's ``Scheduler.reset_prefix_cache``: with ``reset_running_requests`` every
    running request is preempted first (last first, so that they wait in their running
    order), its output still in flight dropped; then the pool forgets every cached hash,
    which it does only when no block is held."""

    reset_running_requests: bool = False


PAUSE_STATES = ("unpaused", "paused_new", "paused_all")
"""vLLM's ``PauseState`` members, lowercased: ``paused_new`` admits no waiting request
(the running ones go on), ``paused_all`` schedules nothing."""


@dataclass(frozen=True, slots=True)
class SetPauseState:
    """vLLM's ``Scheduler.set_pause_state``: the engine pausing or resuming scheduling."""

    state: str

    def __post_init__(self) -> None:
        if self.state not in PAUSE_STATES:
            raise InvalidEvent(f"pause state {self.state!r}: one of {', '.join(PAUSE_STATES)}")


@dataclass(frozen=True, slots=True)
class ScheduleStep:
    pass


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """Tokens sampled per scheduled request in the step just scheduled.

    ``num_sampled[id]`` is 0 for a prefill chunk that does not reach the end of the
    prompt, else ``1 + accepted drafts``. Requests absent from the map sampled nothing.
    """

    num_sampled: dict[str, int]
    stopped: dict[str, int] = field(default_factory=dict)
    """Natural stops (vLLM's ``check_stop`` on EOS or a stop token): request -> how many of
    its sampled tokens it keeps, the last being the one that stopped it (1..num_sampled).
    The rejected-draft rollback still counts all ``num_sampled`` tokens."""
    step: int | None = None
    """The step this output answers (``StepRecord.step``). Under async scheduling step n+1
    is scheduled before step n's output arrives; None means the last scheduled step."""
    token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Prefix caching, for a request added with ``prompt_token_ids``: the ids of its
    sampled tokens (``len == num_sampled``; a stop token at position ``kept - 1``)."""
    block_hashes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Prefix caching, for a request added with ``block_hashes``: the hashes its
    ``Request.block_hashes`` gained in this update, as vLLM's request holds them."""


@dataclass(frozen=True, slots=True)
class DraftProposals:
    """Draft tokens proposed per request for the next step (vLLM's
    ``update_draft_token_ids``); a request absent from the map proposed none."""

    num_drafts: dict[str, int]


Event = (
    AddRequest
    | Abort
    | ResetPrefixCache
    | SetPauseState
    | ScheduleStep
    | ModelOutput
    | DraftProposals
)


@dataclass(slots=True)
class StepRecord:
    """One scheduling decision (docs/design.md §4.2).

    Not frozen: a frozen dataclass sets each field through ``object.__setattr__``, a cost
    every step of every reference run pays (its maps and lists are mutable anyway, and a
    scheduler hands out copies, never its own state)."""

    step: int
    num_scheduled_tokens: dict[str, int]
    scheduled_spec_tokens: dict[str, int]
    preempted: list[str]
    finished: list[str]
    target_tokens: int
    draft_rows: int
    budgets_left: dict[str, int] = field(default_factory=dict)
    """The policy's ledger at the end of the step (``token_budget``, ``input_budget``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "num_scheduled_tokens": dict(self.num_scheduled_tokens),
            "scheduled_spec_tokens": dict(self.scheduled_spec_tokens),
            "preempted": list(self.preempted),
            "finished": list(self.finished),
            "target_tokens": self.target_tokens,
            "draft_rows": self.draft_rows,
            "budgets_left": dict(self.budgets_left),
        }

    def decision(self) -> dict[str, Any]:
        """The fields a live scheduler must agree on (budgets are the reference's own
        bookkeeping and vLLM does not expose them)."""
        return {
            "num_scheduled_tokens": dict(self.num_scheduled_tokens),
            "scheduled_spec_tokens": dict(self.scheduled_spec_tokens),
            "preempted": sorted(self.preempted),
            "finished": sorted(self.finished),
        }
