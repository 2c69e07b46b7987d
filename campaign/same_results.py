"""Whether two runs' JSON results are the same apart from timings: the check that an
executor changes nothing (``--jobs 2`` against ``--executor ray``, docs/campaigns.md).

    python -m dualbudget.campaign.same_results A.json B.json

Exit 0 when they are equal once every timing field is left out (``TIMINGS``, at any
depth); 1, naming the first difference (its JSON path and both values), when they are
not; 2, in one line, when a file cannot be read as JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TIMINGS = frozenset({"seconds", "warm_up_seconds"})
"""The fields of a fuzz's, a mutant's or a sweep's JSON that measure time: the only
fields a run on another executor may change."""


def first_difference(a: Any, b: Any, path: str = "$") -> str | None:
    """The first place where ``a`` and ``b`` differ, timings aside, in document order:
    ``path: A != B``; None when they are the same."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted({*a, *b} - TIMINGS):
            if key not in a or key not in b:
                return f"{path}.{key}: only in {'A' if key in a else 'B'}"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{index}]")
            if found is not None:
                return found
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)} items"
        return None
    if type(a) is not type(b) or a != b:
        return f"{path}: {_short(a)} != {_short(b)}"
    return None


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m dualbudget.campaign.same_results A.json B.json", file=sys.stderr)
        return 2
    try:
        a, b = (json.loads(Path(path).read_text()) for path in args)
    except (OSError, ValueError) as err:
        print(f"same_results: error: {err}", file=sys.stderr)
        return 2
    found = first_difference(a, b)
    if found is not None:
        print(f"{args[0]} and {args[1]} differ at {found}")
        return 1
    print(f"{args[0]} and {args[1]}: the same, timings aside")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
