"""Seeded Hypothesis runs whose examples depend on their seed alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def without_source_constants() -> Iterator[None]:
    """Hypothesis draws, one time in twenty, a literal of the *local* modules the process
    has loaded (``hypothesis.internal.conjecture.providers``, Hypothesis 6.148). Left on,
    a seed's examples would depend on which of the project's modules a process imported so
    far and on every literal in them: a worker process, the order of the units, or an
    edit anywhere in the project would change the run (a test session, which has loaded
    most of them, would draw other examples than a fresh worker). Off while a seeded run
    (a fuzz unit, a search unit) draws, so that its examples depend on its seed alone."""
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    saved = providers._get_local_constants
    providers._get_local_constants = Constants  # an empty pool
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = saved
        providers.CONSTANTS_CACHE.cache.clear()
