"""A campaign's time budget (``--budget DURATION``): a duration as people write one.

``8h``, ``90m``, ``30s``, ``1h30m`` or a plain number of seconds. A budget is wall time
on the driver's clock: a campaign keeps drawing units until it is spent, then stops
the units still running at their next example (``campaign.unit.cancelled``).
"""

from __future__ import annotations

import math
import re

UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
"""Seconds per unit of a duration."""
PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([dhms])")
EXAMPLES = "8h, 90m, 30s, 1h30m"


def parse_duration(text: str) -> float:
    """Seconds of ``text``; ValueError (its message one line, naming the text) for
    anything else, or for a duration of zero."""
    spoken = text.strip().lower()
    try:
        seconds = float(spoken)
    except ValueError:
        parts = PART.findall(spoken)
        if not parts or "".join(n + u for n, u in parts) != spoken:
            raise ValueError(f"not a duration: {text!r} (e.g. {EXAMPLES})") from None
        seconds = sum(float(n) * UNITS[u] for n, u in parts)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"not a positive duration: {text!r} (e.g. {EXAMPLES})")
    return seconds


def spoken(seconds: float) -> str:
    """``seconds`` as a duration: ``2h05m``, ``90s``."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
