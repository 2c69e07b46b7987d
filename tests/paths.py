"""Where the tests find the checkout's own files, from any folder of tests/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The checkout's root: the folder holding pyproject.toml, docs/ and scripts/."""
