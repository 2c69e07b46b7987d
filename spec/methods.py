"""The method table: what one request costs the drafter, and what vLLM reserves for it.

For a request scheduled with ``q`` target tokens, the drafter's forward reads
``C(q) = carries_target_rows * q + draft_extra(K)`` rows of the model runner's input
buffer, ``K`` being ``num_speculative_tokens``. That true cost is the same in every
release. The two numbers vLLM derives per method and release, since the policies of
those releases are written in them, are columns of each release's record
(``spec.releases``): ``max_num_new_slots_for_drafting`` and ``num_lookahead_tokens``.

This table is this project's reading of the vLLM releases it knows. It is a parameter of
the spec: when upstream disagrees, one row changes, and ``tests`` re-read it from the
installed vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arith import Num
from .errors import BadInput

DSPARK_LAYOUTS = ("anchor", "fill-in")


@dataclass(frozen=True)
class PerK:
    """An integer of the form ``per_k * K + const``."""

    per_k: int
    const: int

    def at(self, k: Num) -> Num:
        return self.per_k * k + self.const

    @property
    def label(self) -> str:
        """The value as written in the design's table: ``0``, ``1``, ``K-1``, ``2K+1``."""
        if not self.per_k:
            return str(self.const)
        k = "K" if self.per_k == 1 else f"{self.per_k}K"
        return k + (f"{self.const:+d}" if self.const else "")


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
    why: str
    """Where the draft rows come from."""

    @property
    def speculative_method(self) -> str:
        """The ``speculative_config.method`` the project builds this row with: eagle3 for
        the eagle rows (the drafter vLLM builds from a config-only folder), else the
        row's first method."""
        return "eagle3" if "eagle3" in self.methods else self.methods[0]

    @property
    def takes_mtp(self) -> bool:
        """vLLM's ``mtp`` method takes this row (the EAGLE row: a drafter on the target's
        hidden states, no parallel drafting)."""
        return "mtp" in self.methods

    @property
    def drafts_in_own_pass(self) -> bool:
        """DFlash and DSpark: the drafter runs a separate query pass of its own rows."""
        return any(method in ("dflash", "dspark") for method in self.methods)

    def draft_rows(self, q: Num, k: Num) -> Num:
        """``C(q)``: draft input rows of one request scheduled with ``q`` target tokens."""
        return self.carries_target_rows * q + self.draft_extra.at(k)


ZERO = PerK(0, 0)
K = PerK(1, 0)
K_MINUS_1 = PerK(1, -1)
K_PLUS_1 = PerK(1, 1)
ONE = PerK(0, 1)

LAYOUTS: tuple[MethodLayout, ...] = (
    MethodLayout(
        "ngram",
        ("ngram", "suffix", "ngram_gpu"),
        False,
        None,
        0,
        ZERO,
        "no draft model, so no draft forward",
    ),
    MethodLayout(
        "ngram-parallel",
        ("ngram",),
        True,
        None,
        0,
        ZERO,
        "no draft model, so no draft forward; vLLM still reserves the parallel-drafting slots",
    ),
    MethodLayout(
        "eagle",
        ("eagle", "eagle3", "mtp"),
        False,
        None,
        1,
        ZERO,
        "shifted input: the target rows but the first, plus the bonus token as anchor",
    ),
    MethodLayout(
        "p-eagle",
        ("eagle", "eagle3"),
        True,
        None,
        1,
        K_MINUS_1,
        "shifted input plus K-1 mask rows",
    ),
    MethodLayout(
        "draft-model",
        ("draft_model",),
        False,
        None,
        1,
        ONE,
        "unshifted input keeps one extra token",
    ),
    MethodLayout(
        "pard",
        ("draft_model",),
        True,
        None,
        1,
        K,
        "unshifted input plus K mask rows",
    ),
    MethodLayout(
        "dflash",
        ("dflash",),
        None,
        None,
        0,
        K_PLUS_1,
        "separate query pass: bonus token plus K masks, no target rows",
    ),
    MethodLayout(
        "dspark-anchor",
        ("dspark",),
        None,
        "anchor",
        0,
        K,
        "separate query pass whose anchor is the first prediction",
    ),
    MethodLayout(
        "dspark-fill-in",
        ("dspark",),
        None,
        "fill-in",
        0,
        K_PLUS_1,
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
