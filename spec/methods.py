"""The method table: what one request costs the drafter, and what vLLM reserves for it.

For a request scheduled with ``q`` target tokens, the drafter's forward reads
``C(q) = carries_target_rows * q + draft_extra(K)`` rows of the model runner's input
buffer, ``K`` being ``num_speculative_tokens``. Beside the true cost, the table keeps two
numbers vLLM derives per method, per release, since the policies of those releases are
written in them:

- ``max_num_new_slots_for_drafting`` (``slots``): the rows vLLM's budget adds per
  scheduled request on top of its target tokens;
- ``num_lookahead_tokens``: KV slots reserved past the scheduled tokens, and in 0.33 the
  per-request divisor of the DFlash/DSpark admission cap.

This table is this project's reading of vLLM 0.32.0 and 0.33.0. It is a parameter of the
spec: when upstream disagrees, one row changes, and ``tests`` re-read it from the
installed vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .arith import Num
from .errors import BadInput

VLLM_VERSIONS = ("0.32", "0.33")
DSPARK_LAYOUTS = ("anchor", "fill-in")


@dataclass(frozen=True)
class PerK:
    """An integer of the form ``per_k * K + const``."""

    per_k: int
    const: int

    def at(self, k: Num) -> Num:
        return self.per_k * k + self.const


@dataclass(frozen=True)
class MethodLayout:
    """One row of the method table (docs/design.md §1.2)."""

    name: str
    """Stable layout name used by proofs, reports and findings."""
    methods: tuple[str, ...]
    """vLLM ``speculative_config.method`` values that take this row."""
    parallel_drafting: bool | None
    """vLLM's ``parallel_drafting``; None where vLLM forces it (DFlash, DSpark)."""
    dspark_layout: str | None
    """``anchor`` or ``fill-in`` for DSpark rows, None elsewhere."""
    carries_target_rows: int
    """``e`` in ``C(q) = e*q + f(K)``: 1 when the draft input repeats the target rows."""
    draft_extra: PerK
    """``f(K)``: draft input rows added on top of the carried target rows."""
    slots: Mapping[str, PerK]
    """vLLM's ``max_num_new_slots_for_drafting``, per vLLM version."""
    lookahead: Mapping[str, PerK]
    """vLLM's ``num_lookahead_tokens``, per vLLM version."""
    why: str
    """Where the draft rows come from."""

    @property
    def speculative_method(self) -> str:
        """The ``speculative_config.method`` the project builds this row with: eagle3 for
        the eagle rows (the drafter vLLM builds from a config-only folder), else the
        row's first method."""
        return "eagle3" if "eagle3" in self.methods else self.methods[0]

    @property
    def drafts_in_own_pass(self) -> bool:
        """DFlash and DSpark: the drafter runs a separate query pass of its own rows."""
        return any(method in ("dflash", "dspark") for method in self.methods)

    def draft_rows(self, q: Num, k: Num) -> Num:
        """``C(q)``: draft input rows of one request scheduled with ``q`` target tokens."""
        return self.carries_target_rows * q + self.draft_extra.at(k)

    def draft_slots(self, version: str, k: Num) -> Num:
        """vLLM's ``max_num_new_slots_for_drafting`` for this row in ``version``."""
        return self.slots[version].at(k)

    def num_lookahead_tokens(self, version: str, k: Num) -> Num:
        """vLLM's ``num_lookahead_tokens`` for this row in ``version``."""
        return self.lookahead[version].at(k)


def _same(value: PerK) -> dict[str, PerK]:
    return {version: value for version in VLLM_VERSIONS}


ZERO = PerK(0, 0)
K = PerK(1, 0)
K_MINUS_1 = PerK(1, -1)
K_PLUS_1 = PerK(1, 1)
ONE = PerK(0, 1)

LAYOUTS: tuple[MethodLayout, ...] = (
    MethodLayout(
        "ngram",
        ("ngram", "suffix"),
        False,
        None,
        0,
        ZERO,
        _same(ZERO),
        _same(ZERO),
        "no draft model, so no draft forward",
    ),
    MethodLayout(
        "ngram-parallel",
        ("ngram",),
        True,
        None,
        0,
        ZERO,
        _same(K_MINUS_1),
        _same(ZERO),
        "no draft model, so no draft forward; vLLM still reserves the parallel-drafting slots",
    ),
    MethodLayout(
        "eagle",
        ("eagle", "eagle3", "mtp"),
        False,
        None,
        1,
        ZERO,
        _same(ZERO),
        _same(K),
        "shifted input: the target rows but the first, plus the bonus token as anchor",
    ),
    MethodLayout(
        "p-eagle",
        ("eagle", "eagle3"),
        True,
        None,
        1,
        K_MINUS_1,
        _same(K_MINUS_1),
        _same(K),
        "shifted input plus K-1 mask rows",
    ),
    MethodLayout(
        "draft-model",
        ("draft_model",),
        False,
        None,
        1,
        ONE,
        _same(ONE),
        _same(K),
        "unshifted input keeps one extra token",
    ),
    MethodLayout(
        "pard",
        ("draft_model",),
        True,
        None,
        1,
        K,
        _same(K),
        _same(K),
        "unshifted input plus K mask rows",
    ),
    MethodLayout(
        "dflash",
        ("dflash",),
        None,
        None,
        0,
        K_PLUS_1,
        {"0.32": K, "0.33": ZERO},
        _same(K_PLUS_1),
        "separate query pass: bonus token plus K masks, no target rows",
    ),
    MethodLayout(
        "dspark-anchor",
        ("dspark",),
        None,
        "anchor",
        0,
        K,
        {"0.32": K_MINUS_1, "0.33": ZERO},
        _same(K),
        "separate query pass whose anchor is the first prediction",
    ),
    MethodLayout(
        "dspark-fill-in",
        ("dspark",),
        None,
        "fill-in",
        0,
        K_PLUS_1,
        {"0.32": K_MINUS_1, "0.33": ZERO},
        _same(K_PLUS_1),
        "separate query pass laid out as DFlash's",
    ),
)

NO_SPECULATION = MethodLayout(
    "none",
    (),
    False,
    None,
    0,
    ZERO,
    _same(ZERO),
    _same(ZERO),
    "speculative decoding off: no draft forward",
)
"""The row a config without ``speculative_config`` takes; not a layout of the table."""

LAYOUT_NAMES = tuple(layout.name for layout in LAYOUTS)
KNOWN_METHODS = tuple(sorted({m for layout in LAYOUTS for m in layout.methods}))


class UnknownLayout(BadInput):
    """A method/parallel_drafting/dspark_layout combination the table has no row for."""


def layout_named(name: str) -> MethodLayout:
    for layout in LAYOUTS:
        if layout.name == name:
            return layout
    raise UnknownLayout(f"unknown layout {name!r} (known: {', '.join(LAYOUT_NAMES)})")


def layout_for(method: str, parallel_drafting: bool, dspark_layout: str | None) -> MethodLayout:
    """The row vLLM would use for a ``speculative_config``."""
    if method not in KNOWN_METHODS:
        raise UnknownLayout(
            f"unknown speculative method {method!r} (known: {', '.join(KNOWN_METHODS)})"
        )
    if method != "dspark" and dspark_layout is not None:
        raise UnknownLayout(f"dspark_layout is only for method 'dspark', not {method!r}")
    if method == "dspark":
        wanted = dspark_layout or "anchor"
        if wanted not in DSPARK_LAYOUTS:
            raise UnknownLayout(
                f"unknown dspark_layout {wanted!r} (known: {', '.join(DSPARK_LAYOUTS)})"
            )
        return layout_named(f"dspark-{wanted}")
    for layout in LAYOUTS:
        if method in layout.methods and layout.parallel_drafting in (None, parallel_drafting):
            return layout
    raise UnknownLayout(
        f"method {method!r} with parallel_drafting={parallel_drafting} has no row in the"
        " method table"
    )
