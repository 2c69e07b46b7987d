"""Scheduler classes of a user's own, for the ``--scheduler-cls`` tests: vLLM's
``Scheduler`` admitting one running request at a time, a planted bug that the fuzz must
report as a divergence; and one that raises in every step, which checks nothing. The
classes are made on first access (a module ``__getattr__``), so that importing this module
never imports vLLM."""

from __future__ import annotations

from typing import Any

RAISED = "a scheduler that fails every step"
"""What ``AlwaysRaises.schedule`` raises."""


def __getattr__(name: str) -> Any:
    if name not in ("OneAtATime", "AlwaysRaises"):
        raise AttributeError(name)
    from vllm.v1.core.sched.scheduler import Scheduler

    class OneAtATime(Scheduler):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.max_num_active_reqs = 1

    class AlwaysRaises(Scheduler):  # type: ignore[misc]
        def schedule(self) -> Any:
            raise RuntimeError(RAISED)

    globals().update(OneAtATime=OneAtATime, AlwaysRaises=AlwaysRaises)
    return globals()[name]
