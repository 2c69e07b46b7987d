"""The reference scheduler's state: plain data, copyable, serialisable.

Everything the scheduler knows between two events lives here, so that
``(state, event) -> (state, output)`` is the whole of its behaviour: a copy of the state
replays the same decisions.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from .prefix_cache import BlockPool

# vLLM's RequestStatus values the subset can reach.
WAITING = "waiting"
RUNNING = "running"
PREEMPTED = "preempted"
FINISHED_STOPPED = "finished_stopped"
FINISHED_LENGTH = "finished_length_capped"
FINISHED_ABORTED = "finished_aborted"
FINISHED = (FINISHED_STOPPED, FINISHED_LENGTH, FINISHED_ABORTED)


@dataclass(slots=True)
class GroupBlocks:
    """A request's block table in one KV group (``req_to_blocks[request_id]``): True
    where a place holds a real block, False where a null block stands for one freed."""

    table: list[bool] = field(default_factory=list)
    allocated: bool = False
    """Mamba ``align``: blocks were allocated once (``_allocated_block_reqs``)."""
    last_state_block_idx: int = -1
    """Mamba ``align``: the place of the previous step's state block (-1: none)."""
    num_retired_blocks: int = 0
    """Places before this one were let go already (freed, or null): Mamba ``align``'s
    retired states, and with prefix caching the blocks a window or chunk skipped."""
    block_ids: list[int] = field(default_factory=list)
    """Prefix caching: the pool's block at each place (0, the null block, where one was
    freed or skipped); the hybrid caching coordinator keeps it instead of ``table``."""
    checkpoint_position: int = 0
    """Mamba ``align`` with prefill checkpoint blocks: the tokens whose state this step
    saves inside its chunk (``_checkpoints``; 0: none)."""
    checkpoint_place: int = -1
    """The place of the block reserved for that state."""
    num_cached_blocks: int = -1
    """Prefix caching: ``num_cached_block[request_id]``, how many leading places are
    cached (-1: the request is not in that map, so its allocation counts skipped blocks)."""

    @property
    def num_blocks(self) -> int:
        """Real blocks held (in ``block_ids`` with prefix caching, else ``table``)."""
        return sum(self.table) + len(self.block_ids) - self.block_ids.count(0)


@dataclass(slots=True)
class RequestState:
    """One request, in the counters of vLLM's ``Request`` (prompt and outputs are lengths:
    token ids matter only to prefix caching's block hashes)."""

    request_id: str
    prompt_len: int
    max_tokens: int
    priority: int = 0
    arrival_time: float = 0.0
    status: str = WAITING
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    num_drafts: int = 0
    """``len(spec_token_ids)``: drafts proposed for the next step, not yet scheduled."""
    num_blocks: int = 0
    """KV blocks the request holds."""
    kv_slots_covered: int = 0
    """Kept by ``kv``: while computed plus newly scheduled tokens stay within it, the
    blocks held already cover the step and ``allocate_slots`` has nothing to do (0: ask)."""
    kv_skip_horizon: int = sys.maxsize
    """Kept by ``kv`` beside ``kv_slots_covered``, for attention that skips tokens: while
    the processed tokens (computed, less those in flight) stay below it, no group frees
    a block (the largest int: none ever does)."""
    is_prefill_chunk: bool = False
    """Set when the request was last scheduled: its prompt was not done after that chunk."""
    num_preemptions: int = 0
    num_output_placeholders: int = 0
    """Async scheduling: tokens of steps in flight that ``num_computed_tokens`` already
    counts but whose sampled tokens have not been appended (1 + the spec tokens of each
    such step that samples)."""
    num_in_flight_tokens: int = 0
    """Tokens scheduled in steps whose output has not come yet."""
    num_stale_output_tokens: int = 0
    """In-flight tokens at the last preemption: output still to come for steps scheduled
    before it, delivered but never rolling back the reset counters."""
    drop_stale_output: bool = False
    """``Request.drop_stale_output``: the stale output is dropped when it comes, not
    delivered (a preemption by ``reset_prefix_cache``, whose requests may resume in the
    next step); a later preemption keeps it while a dropped share is still to come."""
    token_ids: list[int] | None = None
    """Prefix caching, a request added with ids: its prompt and output token ids (the
    one place the reference keeps ids: its block hashes are made of them)."""
    block_hashes: list[str] | None = None
    """Prefix caching: vLLM's ``Request.block_hashes``, the hash chain of its full blocks."""
    block_ids: list[int] = field(default_factory=list)
    """Prefix caching: the pool's blocks the request holds, in order."""
    num_cached_blocks: int = 0
    """Prefix caching: how many of its first blocks are cached (``num_cached_block``)."""
    kv_groups: list[GroupBlocks] = field(default_factory=list)
    """The hybrid coordinator (``kv/hybrid.py``): the request's block table in each group."""

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + self.num_drafts

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


@dataclass(slots=True)
class StepInFlight:
    """A scheduled step whose ``ModelOutput`` has not come yet: what it scheduled."""

    scheduled: dict[str, int]
    spec: dict[str, int]
    """Draft tokens scheduled for verification, placeholders included."""


@dataclass(slots=True)
class SchedulerState:
    free_blocks: int
    """Blocks left in the pool (vLLM's ``BlockPool.get_num_free_blocks``)."""
    num_steps: int = 0
    """ScheduleStep events handled so far; the next record's ``step``."""
    requests: dict[str, RequestState] = field(default_factory=dict)
    running: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    """Front first. Under priority scheduling it is kept in arrival order and the head is
    picked by ``(priority, arrival_time, request_id)``, as vLLM's heap orders it."""
    finished_since_step: list[str] = field(default_factory=list)
    """vLLM's ``finished_req_ids``: finished since the last ScheduleStep."""
    preempted_since_step: list[str] = field(default_factory=list)
    """Preempted between steps (``reset_prefix_cache``): vLLM's ``preempted_req_ids``
    reports them with the next step's own victims."""
    last_padded: list[str] = field(default_factory=list)
    """Requests whose last-step spec tokens were padding placeholders, not real drafts."""
    in_flight: dict[int, StepInFlight] = field(default_factory=dict)
    """Steps scheduled and not yet answered, by step index (under synchronous scheduling
    only the last one, until its output comes)."""
    num_arrivals: int = 0
    pause_state: str = "unpaused"
    """vLLM's ``Scheduler._pause_state`` (``events.PAUSE_STATES``)."""
    block_pool: BlockPool | None = None
    """Prefix caching: the pool's blocks by id (None with caching off, where
    ``free_blocks`` is all the pool there is)."""

    def copy(self) -> SchedulerState:
        return copy.deepcopy(self)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
