"""What every KV manager shares: the block arithmetic, the empty hit, the null block and
the keys a group's cached blocks take in the one pool."""

from __future__ import annotations

import sys
from typing import Final, TypeVar

from dualbudget.spec.config import EngineConfig

from ..prefix_cache import BlockPool
from ..state import SchedulerState

T = TypeVar("T")
"""A block table's entry: a bool (real or null) or a pool block id (0: the null block)."""

NO_HIT: tuple[int, ...] = ()
"""The blocks of no cache hit."""

UNBOUNDED: Final = sys.maxsize
"""A promise or horizon nothing reaches."""

NULL_BLOCK = 0
"""``BlockPool.null_block``'s id: the place of a freed or skipped block."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def usable_blocks(num_gpu_blocks: int) -> int:
    """Blocks the pool can lend: vLLM's ``BlockPool.__init__`` takes one as the null block."""
    return num_gpu_blocks - 1


def group_key(block_hash: str, group: int) -> str:
    """``make_block_hash_with_group_id``: one pool keeps every group's cached blocks."""
    return f"{block_hash}@{group}"


TAIL = "/tail"
"""What ends a prompt tail's key (``tail_key``), and no full block's."""


def tail_key(block_hash: str, group: int) -> str:
    """``cache_partial_block``'s key of a prompt tail inside a block: never a full block's
    key (a lookup reads only those), but a hash all the same to the free queue."""
    return group_key(block_hash, group) + TAIL


def is_tail_key(key: str) -> bool:
    """Whether ``key`` is a prompt tail's (``tail_key``)."""
    return key.endswith(TAIL)


def initial_state(config: EngineConfig) -> SchedulerState:
    """An empty scheduler state for ``config``: every block free, and with prefix caching
    the pool that knows them by id."""
    pool = BlockPool.create(config.num_gpu_blocks) if config.enable_prefix_caching else None
    return SchedulerState(free_blocks=usable_blocks(config.num_gpu_blocks), block_pool=pool)
