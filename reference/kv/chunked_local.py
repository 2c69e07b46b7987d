"""A chunked-local-attention group's rules: vLLM's ``ChunkedLocalAttentionManager``.

A token attends within its chunk, so every whole chunk before the next token's goes
back to the pool. Its hit counts those chunks as computed (null places, cached or not),
then its run of cached blocks from the left; it never drops (vLLM asserts against a
drafter's drop on it).
"""

from __future__ import annotations

from dataclasses import dataclass

from .blocks import cdiv
from .single_type import HitLookup, Hits, SingleTypeKVCacheManager


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """``ChunkedLocalAttentionManager``: a token attends within its chunk of
    ``attention_chunk_size``, so every whole chunk before the next token's is skipped."""

    attention_chunk_size: int = 1

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def num_processed_to_skip(self, num_blocks: int) -> int:
        chunk = self.attention_chunk_size
        return cdiv(num_blocks * self.block_size, chunk) * chunk

    def find_longest_cache_hit(
        self, lookup: HitLookup, max_length: int, drop: bool, scheduler_block_size: int
    ) -> Hits:
        """``ChunkedLocalAttentionManager.find_longest_cache_hit``: the whole chunks before
        the one holding the hit's end are outside the next token's attention (computed,
        null, whether cached or not), then the run of cached blocks from the left."""
        assert not drop, "vLLM asserts against a chunked-local hit that drops a block"
        chunk = self.attention_chunk_size
        num_skipped = max(max_length, 0) // chunk * chunk // self.block_size
        return self._hit_from_left(lookup, max_length, drop, scheduler_block_size, num_skipped)
