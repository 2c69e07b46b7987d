"""The method table of docs/design.md §1.2, pinned row by row with K = 4.

The expected numbers are written out by hand from the design's table, not computed by
the code under test, so a changed row fails here and names itself.
"""

from __future__ import annotations

import pytest

from dualbudget.spec.errors import BadInput
from dualbudget.spec.methods import LAYOUT_NAMES, LAYOUTS, layout_for, layout_named
from dualbudget.spec.releases import VLLM_0_32, VLLM_0_33

K = 4
# layout: (C(1), C(5), slots 0.32, slots 0.33, num_lookahead_tokens in both)
ROWS = {
    "ngram": (0, 0, 0, 0, 0),
    "ngram-parallel": (0, 0, 3, 3, 0),
    "eagle": (1, 5, 0, 0, 4),
    "p-eagle": (4, 8, 3, 3, 4),
    "draft-model": (2, 6, 1, 1, 4),
    "pard": (5, 9, 4, 4, 4),
    "dflash": (5, 5, 4, 0, 5),
    "dspark-anchor": (4, 4, 3, 0, 4),
    "dspark-fill-in": (5, 5, 3, 0, 5),
}


def test_every_row_is_pinned() -> None:
    assert set(ROWS) == set(LAYOUT_NAMES)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_row(name: str) -> None:
    layout = layout_named(name)
    c1, c5, slots_032, slots_033, lookahead = ROWS[name]
    assert layout.draft_rows(1, K) == c1, f"{name}: C(1)"
    assert layout.draft_rows(5, K) == c5, f"{name}: C(5)"
    assert VLLM_0_32.draft_slots(layout, K) == slots_032, f"{name}: slots in 0.32"
    assert VLLM_0_33.draft_slots(layout, K) == slots_033, f"{name}: slots in 0.33"
    for release in (VLLM_0_32, VLLM_0_33):
        assert release.num_lookahead_tokens(layout, K) == lookahead, f"{name}: lookahead"


@pytest.mark.parametrize(
    ("method", "parallel", "dspark_layout", "expected"),
    [
        ("ngram", False, None, "ngram"),
        ("suffix", False, None, "ngram"),
        ("ngram", True, None, "ngram-parallel"),
        ("eagle", False, None, "eagle"),
        ("eagle3", False, None, "eagle"),
        ("mtp", False, None, "eagle"),
        ("eagle3", True, None, "p-eagle"),
        ("draft_model", False, None, "draft-model"),
        ("draft_model", True, None, "pard"),
        ("dflash", False, None, "dflash"),
        ("dflash", True, None, "dflash"),
        ("dspark", True, None, "dspark-anchor"),
        ("dspark", True, "anchor", "dspark-anchor"),
        ("dspark", False, "fill-in", "dspark-fill-in"),
    ],
)
def test_vllm_config_selects_row(
    method: str, parallel: bool, dspark_layout: str | None, expected: str
) -> None:
    assert layout_for(method, parallel, dspark_layout).name == expected


@pytest.mark.parametrize(
    ("method", "parallel", "dspark_layout", "needle"),
    [
        ("medusa", False, None, "unknown speculative method 'medusa'"),
        ("suffix", True, None, "parallel_drafting=True has no row"),
        ("mtp", True, None, "parallel_drafting=True has no row"),
        ("eagle3", False, "anchor", "dspark_layout is only for method 'dspark'"),
        ("dspark", True, "sideways", "unknown dspark_layout 'sideways'"),
    ],
)
def test_combinations_without_a_row_are_refused(
    method: str, parallel: bool, dspark_layout: str | None, needle: str
) -> None:
    with pytest.raises(BadInput, match=needle):
        layout_for(method, parallel, dspark_layout)


def test_only_dflash_and_dspark_draft_in_their_own_pass() -> None:
    own_pass = {layout.name for layout in LAYOUTS if layout.drafts_in_own_pass}
    assert own_pass == {"dflash", "dspark-anchor", "dspark-fill-in"}
