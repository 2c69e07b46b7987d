"""The progress of a run's units on a well-kept library (tqdm, which vLLM depends on too):
units done (kept ones counted from the start), rate and time left, on stderr.

Shown only when stderr is a terminal: a log or CI keeps the commands' own per-unit lines
(on stdout), and a bar's carriage returns would only clutter it. The same for local
and Ray workers: the driver counts a unit when its result arrives, whatever ran it."""

from __future__ import annotations

import sys
from typing import Protocol


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


def progress_bar(description: str | None, total: int, done: int = 0) -> Progress:
    """A bar of ``total`` units, ``done`` of them already (a resumed campaign's); none
    (a bar that shows nothing) without ``description`` or off a terminal."""
    from tqdm import tqdm

    bar: Progress = tqdm(
        total=total,
        initial=done,
        desc=description,
        unit="unit",
        file=sys.stderr,
        # None: tqdm's own test, on only when ``file`` is a terminal.
        disable=None if description else True,
        dynamic_ncols=True,
        leave=False,
    )
    return bar
