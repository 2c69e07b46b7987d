"""The step book's transitions on one config, as Python functions of ints.

The reference asks the book about every request of every step: is the step exhausted,
how many tokens does this request get, what does scheduling it leave in the ledger. Run
through the generic code (ledger and charge objects, method chains, ``arith`` dispatch),
those three questions cost more than everything else the reference does for a request.

So the reference runs their formulas instead. ``StepBook``'s own ``exhausted``,
``grant``, ``schedule`` and ``preempt`` (and through them the policy's methods, ``room``
among them), run on z3 symbols as the proofs run them, are translated ahead of time into
Python templates, one per policy, method layout and the release's columns there (the
only numbers of a release the book's formulas read), the config numbers left as slots
(``proofs/compile_book.py``); they are stored in the generated module ``compiled_book``,
so no reference run imports z3. ``compile_kernel`` fills in one config's numbers and
compiles the template (under a millisecond). Nothing is restated by hand, and that each
stored template is the spec's formula is an obligation of ``dualbudget prove`` (check
``compiled``): a change to a policy or to the book that is not recompiled fails it.

The kernel's functions take and return plain ints (the ledger as ``token_budget,
input_budget``); the caller keeps the book's record (which request was scheduled with how
many tokens) and must, as ``StepBook.schedule`` demands, only take ``q >= 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .compiled_book import TEMPLATES
from .methods import MethodLayout
from .policies import POLICY_TYPES, Policy, StepParams

# The symbols the kernel's functions take, in the book's vocabulary.
TOKEN_BUDGET, INPUT_BUDGET, NEED, Q = "token_budget", "input_budget", "need", "q"
_MAX_CACHED = 4096
"""Kernels kept; a fuzz run meets a few hundred configs."""

# The config numbers a formula may read; the template leaves a ``{name}`` slot for each.
PARAMS = (
    "max_num_batched_tokens",
    "max_num_scheduled_tokens",
    "max_num_seqs",
    "num_speculative_tokens",
)


class KernelFunction(NamedTuple):
    """One function of a template: its name, its arguments (all ints) and the type of
    what it returns, as an annotation."""

    name: str
    args: tuple[str, ...]
    returns: str


KERNEL_FUNCTIONS: tuple[KernelFunction, ...] = (
    KernelFunction("exhausted", (TOKEN_BUDGET, INPUT_BUDGET), "bool"),
    KernelFunction("room", (TOKEN_BUDGET, INPUT_BUDGET), "int"),
    KernelFunction("grant", (TOKEN_BUDGET, INPUT_BUDGET, NEED), "int"),
    KernelFunction("take", (TOKEN_BUDGET, INPUT_BUDGET, Q), "tuple[int, int, bool]"),
    KernelFunction("give_back", (TOKEN_BUDGET, INPUT_BUDGET, Q), "tuple[int, int]"),
)
"""The interface of a template: each compiled function, its arguments and its result."""


@dataclass(frozen=True)
class BudgetKernel:
    """A profile's budget rules on one config, as functions of ints."""

    opened: tuple[int, int]
    """The ledger of an empty step: ``(token_budget, input_budget)``."""
    max_active_requests: int
    exhausted: Callable[[int, int], bool]
    """``(token_budget, input_budget) -> StepBook.exhausted()``."""
    room: Callable[[int, int], int]
    """``(token_budget, input_budget) -> policy.room``."""
    grant: Callable[[int, int, int], int]
    """``(token_budget, input_budget, need) -> StepBook.grant(need)``."""
    take: Callable[[int, int, int], tuple[int, int, bool]]
    """``(token_budget, input_budget, q) ->`` the ledger after ``StepBook.schedule(_, q)``,
    and whether the book is then exhausted (the scheduler's next question, in one call)."""
    give_back: Callable[[int, int, int], tuple[int, int]]
    """``(token_budget, input_budget, q) ->`` the ledger after preempting a request the
    book charged for ``q`` tokens (``StepBook.preempt``)."""
    source: str
    """The generated Python, for whoever wants to read what runs."""


def compile_kernel(policy: Policy, p: StepParams) -> BudgetKernel:
    """The kernel of ``policy`` on the concrete ``p`` (cached per policy and config)."""
    values = concrete_params(p)
    key = (policy, p.layout.name, *values.values())
    kernel = _KERNELS.get(key)
    if kernel is None:
        if len(_KERNELS) >= _MAX_CACHED:
            _KERNELS.clear()
        source = _template(policy, p).format_map(
            {name: repr(value) if value >= 0 else f"({value})" for name, value in values.items()}
        )
        namespace: dict[str, Any] = {}
        exec(compile(source, f"<budget kernel: {policy.name}>", "exec"), namespace)
        opened = policy.open(p)
        kernel = _KERNELS[key] = BudgetKernel(
            opened=(int(opened.token_budget), int(opened.input_budget)),
            max_active_requests=int(policy.max_active_requests(p)),
            exhausted=namespace["exhausted"],
            room=namespace["room"],
            grant=namespace["grant"],
            take=namespace["take"],
            give_back=namespace["give_back"],
            source=source,
        )
    return kernel


_KERNELS: dict[tuple[Any, ...], BudgetKernel] = {}


def concrete_params(p: StepParams) -> dict[str, int]:
    """The config numbers a template's slots read (``PARAMS``), of a concrete config: a
    kernel is made for one config, never for symbols."""
    values = {name: getattr(p, name) for name in PARAMS}
    if not all(type(value) is int for value in values.values()):
        raise TypeError(f"a budget kernel needs a concrete config, got {values}")
    return values


class NoCompiledBook(ValueError):
    """A policy the generated module holds no template for (only the spec's own)."""


TemplateKey = tuple[str, str, str, str]
"""(policy name, layout name, the release's slots there, its lookahead there)."""


def template_key(policy: Policy, layout: MethodLayout) -> TemplateKey:
    """The key of ``policy``'s template on ``layout``: a release enters the book's
    formulas only through its two columns, so releases that agree there share one."""
    release = policy.release
    slots, lookahead = release.slots[layout.name], release.lookahead[layout.name]
    return (policy.name, layout.name, slots.label, lookahead.label)


def _template(policy: Policy, p: StepParams) -> str:
    """The stored template of the spec's ``policy`` on ``p``'s layout."""
    return TEMPLATES[stored_template_key(policy, p)]


def stored_template_key(policy: Policy, p: StepParams) -> TemplateKey:
    """The key of the stored template of the spec's ``policy`` on ``p``'s layout; refuses a
    policy that is not the spec's, or a layout the generated module holds none for."""
    key = template_key(policy, p.layout)
    if key not in TEMPLATES or POLICY_TYPES.get(policy.name) is not type(policy):
        raise NoCompiledBook(
            f"no compiled book for policy {policy!r} on layout {p.layout.name!r}: only the"
            " spec's policies on its profiles' release columns are compiled"
            " (proofs/compile_book.py)"
        )
    return key
