"""A sliding-window group's rules: vLLM's ``SlidingWindowManager``.

The next token attends to the last ``sliding_window`` tokens, so the blocks before them
go back to the pool as the request runs. Its hit is searched from the right: the
``cdiv(sliding_window - 1, block_size)`` contiguous blocks its window reads ending at the
hit (one more where it drops the last; a run starts only where the hit would end on a
scheduler block, a shorter run is cut back to one), the places before them null. It
caches only the full blocks ``prefix_cache_retention_interval`` retains
(``reachable_block_mask``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..state import RequestState
from .blocks import NULL_BLOCK, cdiv
from .single_type import CachingCoordinator, HitLookup, Hits, SingleTypeKVCacheManager


@dataclass(frozen=True, slots=True)
class SlidingWindowManager(SingleTypeKVCacheManager):
    """``SlidingWindowManager`` (``SlidingWindowMLASpec`` too): the next token attends to
    the last ``sliding_window`` tokens, itself included, so the ones before are skipped."""

    sliding_window: int = 1
    extra_retained_tokens: int = 0
    """``SlidingWindowSpec.extra_retained_tokens``: tokens kept below the window, never
    attended, that a multi-module MTP drafter may prefill again (vLLM sets the
    coordinator's ``num_reprefillable_tokens`` on every sliding-window spec)."""

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        retained = self.sliding_window - 1 + self.extra_retained_tokens
        return max(0, num_computed_tokens - retained)

    def num_processed_to_skip(self, num_blocks: int) -> int:
        return num_blocks * self.block_size + self.sliding_window - 1 + self.extra_retained_tokens

    def find_longest_cache_hit(
        self, lookup: HitLookup, max_length: int, drop: bool, scheduler_block_size: int
    ) -> Hits:
        """``SlidingWindowManager.find_longest_cache_hit``, from the right: the window's
        contiguous blocks (one more where the last is dropped) ending at the hit; those
        before it are never read, so their places are null."""
        self._check_hashes_reach(lookup, max_length)
        block_size = self.block_size
        max_blocks = max_length // block_size
        need = cdiv(self.sliding_window - 1, block_size) + (1 if drop else 0)
        # Where the group's block is finer than the scheduler block, a run starts only
        # where the hit (after the drop) would end on a scheduler block.
        per_hit = scheduler_block_size // block_size
        hits = [[NULL_BLOCK] * max_blocks for _ in lookup.group_ids]
        run = 0
        end = None
        for place in range(max_blocks - 1, -1, -1):
            found = lookup.cached_at(place)
            if found is None:
                run = 0
                continue
            if run == 0 and (place if drop else place + 1) % per_hit:
                continue
            for hit, block in zip(hits, found, strict=True):
                hit[place] = block
            run += 1
            if run >= need:
                end = place + run
                break
        # A run short of the window counts from the first place on, back to a scheduler
        # block; the drop, again back to one.
        kept = run if end is None else end
        if end is None:
            kept -= kept % per_hit
        if drop and kept:
            kept -= 1
            kept -= kept % per_hit
        for hit in hits:
            del hit[kept:]
        return hits, kept * block_size

    def reachable_block_mask(
        self,
        coordinator: CachingCoordinator,
        request: RequestState,
        index: int,
        start: int,
        end: int,
        reachable: bool = True,
    ) -> list[bool] | None:
        """``SlidingWindowManager.reachable_block_mask`` for blocks ``start:end`` of group
        ``index`` (None: every block). A hit needs the window's contiguous blocks (one
        more where the group drops its last) ending at a hit boundary, so only those
        tails are worth caching: at ``retention_interval`` None one at every scheduler
        block, at N > 0 one per N-token segment, and from 0 on also the ones ending at
        the scheduler block at or below each place a later request resumes
        (``replay_boundaries``, the junction)."""
        block_size, interval = self.block_size, coordinator.retention_interval
        scheduler_block_size = coordinator.scheduler_block_size
        eagle = coordinator.drop_groups[index]
        need = cdiv(self.sliding_window - 1, block_size) + int(eagle)
        # A dropping group's run ends one block past the boundary it lands back on.
        shift = int(eagle)
        mask = [False] * (end - start)
        segment = scheduler_block_size if interval is None else interval
        if segment:
            per_segment = segment // block_size
            if need >= per_segment:
                return None
            for place in range(max(start, shift), end):
                if (place - shift) % per_segment >= per_segment - need:
                    mask[place - start] = True
        if interval is None:
            return mask
        for boundary in coordinator.reachable_boundaries(request, index):
            aligned = boundary // scheduler_block_size * scheduler_block_size
            tail_end = aligned // block_size + shift
            for place in range(max(start, tail_end - need), min(end, tail_end)):
                mask[place - start] = True
        return mask
