"""The one seam between this project and vLLM's constructors and calls.

Every object the project builds from vLLM (its configs, ``KVCacheConfig`` and its groups
and specs, ``Request`` and ``SamplingParams``, ``ModelRunnerOutput``, ``DraftTokenIds``,
the ``Scheduler`` itself) is built by ``construct``, from the installed vLLM's own
signature, so that the adapter bends to a vLLM it was not written beside instead of
comparing release strings:

- a field given plainly (``construct(cls, name=value)``) is one the adapter cannot do
  without: a vLLM whose signature lacks it cannot be driven (``AdapterFailure``);
- a field given as ``MayLack(value, absent)`` may be left out where the signature lacks
  it, but only when ``value`` is ``absent``, what a vLLM without the field does anyway
  (a ``KVCacheConfig`` without retention is dense; a ``Request`` without a block hasher
  hashes nothing); with any other value the config asks what this vLLM cannot express
  (``LacksField``, which the live adapter reports as vLLM refusing the config);
- a parameter the signature requires that the adapter does not fill is an
  ``AdapterFailure`` naming it.

``AdapterFailure`` is bad input (exit 2): nothing can be checked against a vLLM the
adapter cannot drive, and it is never counted as vLLM crashing. ``adapter_failure_of``
tells such a failure apart from vLLM's own: an exception whose innermost frame is the
adapter's code (a keyword vLLM no longer takes, an attribute it no longer has) is the
adapter's; one raised inside vLLM is vLLM's.
"""

from __future__ import annotations

import inspect
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualbudget.spec.errors import BadInput

ADAPTER_FILES = frozenset(
    str(Path(__file__).with_name(name).resolve())
    for name in ("vllm_api.py", "live.py", "recorder.py", "monitor.py", "monitor_run.py")
)
"""The modules whose frames are the adapter's own calls into vLLM."""


class AdapterFailure(BadInput):
    """The installed vLLM's API is not the one the adapter drives: one line naming it."""


class LacksField(Exception):
    """The config needs a field of a vLLM class that the installed vLLM does not have."""

    def __init__(self, cls: Any, field: str, value: Any) -> None:
        super().__init__(
            f"vLLM's {_name(cls)} has no field {field!r} (this config sets it to {value!r})"
        )


ANY: Any = type("AnyValue", (), {"__repr__": lambda self: "ANY"})()
"""``MayLack``'s ``absent`` for a field a vLLM without it derives itself, whatever the
value (``ModelRunnerOutput.req_id_to_index``, a function of ``req_ids``)."""


@dataclass(frozen=True)
class MayLack:
    """A field a vLLM may lack: left out there when ``value`` is ``absent`` (or always,
    with ``ANY``)."""

    value: Any
    absent: Any = None

    @property
    def droppable(self) -> bool:
        return self.absent is ANY or self.value == self.absent


def _name(cls: Any) -> str:
    return getattr(cls, "__qualname__", None) or getattr(cls, "__name__", None) or repr(cls)


def fields_of(cls: Any) -> dict[str, inspect.Parameter] | None:
    """The keyword parameters ``cls(...)`` takes; None when it takes any keyword."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return {
        name: p
        for name, p in parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def has_field(cls: Any, name: str) -> bool:
    """Whether the installed vLLM's ``cls`` takes ``name``."""
    fields = fields_of(cls)
    return fields is None or name in fields


def construct(cls: Any, /, **given: Any) -> Any:
    """``cls(**given)`` as the installed vLLM's signature of ``cls`` takes it (the module's
    rules for plain and ``MayLack`` fields)."""
    fields = fields_of(cls)
    kwargs: dict[str, Any] = {}
    for name, value in given.items():
        if isinstance(value, MayLack):
            if fields is not None and name not in fields:
                if not value.droppable:
                    raise LacksField(cls, name, value.value)
                continue
            value = value.value
        elif fields is not None and name not in fields:
            raise AdapterFailure(
                f"the installed vLLM's {_name(cls)} takes no {name!r}, which the adapter"
                f" passes (its fields: {', '.join(fields)})"
            )
        kwargs[name] = value
    if fields is not None:
        unfilled = [
            name
            for name, p in fields.items()
            if p.default is inspect.Parameter.empty and name not in kwargs
        ]
        if unfilled:
            raise AdapterFailure(
                f"the installed vLLM's {_name(cls)} requires {', '.join(map(repr, unfilled))},"
                " which the adapter cannot fill"
            )
    try:
        return cls(**kwargs)
    except TypeError as err:
        failure = adapter_failure_of(err, f"{_name(cls)}(...)")
        if failure is not None:
            raise failure from err
        raise


def adapter_failure_of(err: BaseException, what: str = "") -> AdapterFailure | None:
    """``err`` as an adapter failure when the adapter's own code raised it (its innermost
    frame is one of ``ADAPTER_FILES``, or the call binding a constructor's arguments); None
    when vLLM raised it."""
    if isinstance(err, AdapterFailure):
        return err
    if not isinstance(err, (TypeError, AttributeError, KeyError, IndexError, NameError)):
        return None
    frames = traceback.extract_tb(err.__traceback__)
    if not frames or str(Path(frames[-1].filename).resolve()) not in ADAPTER_FILES:
        return None
    last = frames[-1]
    where = f" (at {Path(last.filename).name}:{last.lineno}{', ' + what if what else ''})"
    return AdapterFailure(
        f"the adapter cannot drive the installed vLLM: {type(err).__name__}: {err}{where}"
    )
