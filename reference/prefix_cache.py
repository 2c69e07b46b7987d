"""Prefix caching for the subset: vLLM's block pool for one full-attention group.

A full block is known by its hash, chained over every block before it
(``hash_blocks``); the pool keeps each block's id, reference count and hash, the
hash -> block map and the free queue whose head is evicted first; ``HitRule`` is how
long a hit may be, per release (its record's hit-rule fields) and drafter
(docs/design.md §6).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dualbudget.spec.releases import Release


@dataclass(frozen=True, slots=True)
class HitRule:
    """How vLLM bounds a request's cache hit (``KVCacheManager.get_computed_blocks``)."""

    drop_last_block: bool = False
    """``use_eagle_block_drop``: the last hit block is recomputed."""
    num_hash_lookahead_tokens: int = 0
    """Tokens past each block its hash covers; the hash exists only once they do."""

    @classmethod
    def of(cls, release: Release, method: str | None, prefill_lookahead: int = 1) -> HitRule:
        """The rule of ``method``'s drafter (None: speculative decoding off) in ``release``,
        which reads ``prefill_lookahead`` prompt tokens past a chunk
        (``EngineConfig.num_prefill_lookahead_tokens``)."""
        return cls(
            release.drops_last_hit_block(method),
            release.num_hash_lookahead_tokens(method, prefill_lookahead),
        )

    def num_hashes(self, num_tokens: int, block_size: int) -> int:
        """How many block hashes a request of ``num_tokens`` tokens has."""
        return max(num_tokens - self.num_hash_lookahead_tokens, 0) // block_size


def hash_blocks(
    parent: str | None,
    token_ids: Sequence[int],
    block_size: int,
    *,
    start: int = 0,
    lookahead: int = 0,
) -> list[str]:
    """The hashes of the full blocks of ``token_ids`` from token ``start`` (a block
    boundary, past the blocks already hashed; ``parent`` the last of their hashes).

    With ``lookahead`` L > 0 (vLLM's ``num_hash_lookahead_tokens``) a block's hash
    also covers the L tokens after it, and is made only once they exist. Any chain that
    is injective in practice will do: only the equality of two hashes matters. A hash is
    Python's ``hash`` of its parent's hash and its ids as a tuple, in hex: ints and
    tuples of ints hash alike in every process (no ``PYTHONHASHSEED``), the 64 bits
    make a collision as unlikely as vLLM's own ``builtin`` hash option does, and a
    tuple of a block's ids hashes in a quarter of the time packing them for a digest
    takes, on a path every prompt and every output block passes."""
    end = len(token_ids) - lookahead
    width = block_size + lookahead
    key = 0 if parent is None else int(parent, 16)
    hashes: list[str] = []
    offset = start
    while offset + block_size <= end:
        key = hash((key, tuple(token_ids[offset : offset + width])))
        hashes.append(hex(key))
        offset += block_size
    return hashes


@dataclass(slots=True)
class BlockPool:
    """vLLM's ``BlockPool`` with caching on: block 0 is the null block, never lent."""

    ref_cnt: list[int]
    block_hash: list[str | None]
    free_queue: OrderedDict[int, None] = field(default_factory=OrderedDict)
    """``FreeKVCacheBlockQueue``, head first: the next block handed out (and evicted)."""
    cached: dict[str, list[int]] = field(default_factory=dict)
    """``cached_block_hash_to_block``: per hash, its blocks in insertion order (two
    requests computing the same block at once both cache it; a lookup takes the first)."""

    @classmethod
    def create(cls, num_gpu_blocks: int) -> BlockPool:
        """Every block free, in id order, but the null block."""
        return cls(
            [0] * num_gpu_blocks,
            [None] * num_gpu_blocks,
            OrderedDict.fromkeys(range(1, num_gpu_blocks)),
        )

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_cached_block(self, block_hash: str) -> int | None:
        blocks = self.cached.get(block_hash)
        return blocks[0] if blocks else None

    def num_evictable(self, blocks: Iterable[int]) -> int:
        """Blocks a touch would take off the free queue (``_get_num_evictable_blocks``)."""
        return sum(1 for block in blocks if self.ref_cnt[block] == 0)

    def touch(self, blocks: Iterable[int]) -> int:
        """``touch``: take a reference on each block, off the free queue if it was free.
        Returns how many were held already (a hit on a block a running request holds)."""
        held = 0
        for block in blocks:
            if self.ref_cnt[block] == 0:
                del self.free_queue[block]
            else:
                held += 1
            self.ref_cnt[block] += 1
        return held

    def get_new_blocks(self, num_blocks: int) -> tuple[list[int], int]:
        """``get_new_blocks``: pop the free queue's head, evicting each block's hash.
        Returns the blocks and how many of them were cached."""
        blocks: list[int] = []
        evicted = 0
        popleft = self.free_queue.popitem
        for _ in range(num_blocks):
            block, _none = popleft(last=False)
            if self.block_hash[block] is not None:
                self.uncache(block)
                evicted += 1
            self.ref_cnt[block] = 1
            blocks.append(block)
        return blocks, evicted

    def cache(self, block: int, block_hash: str) -> None:
        """The block joins the cache under ``block_hash`` (after any block of that hash
        cached before it: a lookup takes the first)."""
        self.block_hash[block] = block_hash
        self.cached.setdefault(block_hash, []).append(block)

    def uncache(self, block: int) -> None:
        """``_maybe_evict_cached_block``: the block's hash leaves the cache (if it has one)."""
        block_hash = self.block_hash[block]
        if block_hash is None:
            return
        owners = self.cached[block_hash]
        owners.remove(block)
        if not owners:
            del self.cached[block_hash]
        self.block_hash[block] = None

    def forget_hashes(self) -> None:
        """``reset_prefix_cache`` on a pool with every block free: the hash map and each
        block's hash go; the free queue keeps its order."""
        self.cached.clear()
        self.block_hash[:] = [None] * len(self.block_hash)

    def cache_full_blocks(
        self, blocks: Sequence[int], block_hashes: Sequence[str], start: int, stop: int
    ) -> None:
        """``cache_full_blocks``: blocks ``start..stop-1`` of a request get its hashes."""
        for index in range(start, stop):
            block, block_hash = blocks[index], block_hashes[index]
            if self.block_hash[block] is None:  # else a hit block: cached already
                self.cache(block, block_hash)

    def free_blocks(self, ordered: Iterable[int]) -> None:
        """``free_blocks``, in eviction order: a block whose last reference goes joins
        the free queue, at the head if it has no hash (reused first), else at the tail
        (evicted least recently used first)."""
        first: list[int] = []
        # Every finished or preempted request passes each of its blocks here.
        ref_cnt, block_hash, queue = self.ref_cnt, self.block_hash, self.free_queue
        for block in ordered:
            count = ref_cnt[block] - 1
            ref_cnt[block] = count
            if count == 0:
                if block_hash[block] is None:
                    first.append(block)
                else:
                    queue[block] = None
        for block in reversed(first):
            queue[block] = None
            queue.move_to_end(block, last=False)
