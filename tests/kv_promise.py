"""Running the reference without the KV managers' allocation promise
(``RequestState.kv_slots_covered`` and ``kv_skip_horizon``), as vLLM runs: every RUNNING
step asks ``allocate_slots`` and every allocation looks for blocks to free. The tests of
the promise compare a run with it to one without it, and count what it spared."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest.mock import patch

from dualbudget.reference.kv.counting import KVCacheManager
from dualbudget.reference.kv.hybrid import HybridKVCacheManager
from dualbudget.reference.state import RequestState, SchedulerState


def _always_ask(self: KVCacheManager, request: RequestState) -> None:
    """No promise: the RUNNING loop asks ``allocate_slots`` (and the output loop
    ``cache_blocks``) every time, as vLLM does."""
    request.kv_slots_covered = 0


@contextmanager
def without_promise(*managers: type[KVCacheManager]) -> Iterator[None]:
    """Within it, ``managers`` make no promise; a hybrid coordinator also keeps no skip
    horizon, so each of its allocations looks for skipped blocks."""
    with ExitStack() as stack:
        for manager in managers:
            stack.enter_context(patch.object(manager, "_promise", _always_ask))
            if issubclass(manager, HybridKVCacheManager):
                remove = manager.remove_skipped_blocks

                def remove_every_time(
                    self: HybridKVCacheManager,
                    state: SchedulerState,
                    request: RequestState,
                    processed: int,
                    remove: Any = remove,
                ) -> None:
                    remove(self, state, request, processed)
                    request.kv_skip_horizon = 0

                stack.enter_context(
                    patch.object(manager, "remove_skipped_blocks", remove_every_time)
                )
        yield


@contextmanager
def counting_allocations(
    manager: type[KVCacheManager], counts: dict[str, int], key: str
) -> Iterator[None]:
    """Within it, each call of ``manager.allocate_slots`` adds one to ``counts[key]``."""
    allocate_slots = manager.allocate_slots

    def allocate(self: KVCacheManager, *args: Any) -> bool:
        counts[key] += 1
        return allocate_slots(self, *args)

    with patch.object(manager, "allocate_slots", allocate):
        yield
