"""Which strengthening of C6's inductive relation each link of the chain needs, and why.

The proof turns every strengthening on (``dominance.Relation()``), so that one relation
serves every pair. This table says which of them each (link, layout) needs: the plain
relation holds with exactly these on, and with any one of them off it does not
(tests/unit/test_proofs_dominance.py decides both for every row). proofs/README.md renders it
(scripts/render_docs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

SHOWN: dict[str, str] = {
    "count_nonnegative": "`n >= 0`",
    "tokens_cover_count": "`T >= n`",
    "lower_exhausted": "`lo_done` counts an exhausted lane",
}
"""Each field of ``dominance.Relation`` as proofs/README.md writes it."""


@dataclass(frozen=True)
class Needed:
    upper: str
    """The relaxed profile of the link; the other is ``obligations.lower_of(upper)``."""
    layouts: tuple[str, ...]
    strengthenings: tuple[str, ...] | None
    """The ``Relation`` fields the induction needs, each necessary; None where the link
    is no relaxation on these layouts (no relation holds: the manifest's failure)."""
    why: str


NEEDED: tuple[Needed, ...] = (
    Needed(
        "dual",
        ("ngram", "eagle", "dflash", "dspark-anchor", "dspark-fill-in"),
        (),
        "same room from a tied state: a tied step stays tied",
    ),
    Needed(
        "dual",
        ("p-eagle", "draft-model", "pard"),
        ("count_nonnegative",),
        "dual's room `min(S−T, B−T, B−T−(n+1)·C(0))` is 0.33's only for `n + 1 >= 0`",
    ),
    Needed(
        "dual",
        ("ngram-parallel",),
        ("count_nonnegative", "lower_exhausted"),
        "0.33 charges `q + K − 1` slots where dual charges no draft rows (`C(q) = 0`):"
        " dual's room is the larger, so a 0.33 request cut short leaves 0.33 exhausted,"
        " not stopped",
    ),
    Needed(
        "vllm-0.33",
        ("ngram", "ngram-parallel", "eagle", "p-eagle", "draft-model", "pard"),
        (),
        "the same code (0.33 changes only DFlash/DSpark)",
    ),
    Needed(
        "vllm-0.33",
        ("dflash", "dspark-anchor"),
        ("count_nonnegative", "tokens_cover_count", "lower_exhausted"),
        "0.32 not exhausted means `B > T + (n+1)·slots >= n + (n+1)·slots`, so"
        " `(n+1)·lookahead <= B`: 0.33 is under its cap `B // lookahead`; 0.33 grants more"
        " (no slots), so a 0.32 cut short is exhausted, not stopped",
    ),
    Needed(
        "vllm-0.33",
        ("dspark-fill-in",),
        None,
        "not a relaxation (lookahead `K+1` > slots + 1 = `K`): the expected failure",
    ),
    Needed("vllm-0.32", ("ngram", "eagle"), (), "no slots: the same room"),
    Needed(
        "vllm-0.32",
        (
            "ngram-parallel",
            "p-eagle",
            "draft-model",
            "pard",
            "dflash",
            "dspark-anchor",
            "dspark-fill-in",
        ),
        ("lower_exhausted",),
        "0.32's room `B − T − (n+1)·slots` beats the reserve `B − m·slots − T` while"
        " `n < m`: a global-reserve request cut short leaves it exhausted",
    ),
)
"""One row per (link of ``obligations.CHAIN``, layouts): together every link on every
layout, once."""


def needed_for(upper: str, layout: str) -> Needed:
    """The row of the link from ``upper`` on ``layout``."""
    for row in NEEDED:
        if row.upper == upper and layout in row.layouts:
            return row
    raise KeyError(f"no strengthening row for {upper} on {layout}")
