"""Settings read from the environment. Standard library only (build side and run side)."""

from __future__ import annotations

import math
import os

__all__ = ["MAX_SECONDS", "env_seconds"]

# the longest limit any wait of this project accepts from the environment: one day. A limit
# is there to end a hang, so "never" (inf, or a number so large it overflows a timer) is
# refused rather than silently switching the limit off
MAX_SECONDS = 86400.0


def env_seconds(name: str, default: float, maximum: float = MAX_SECONDS) -> float:
    """Seconds from ``$name`` if set, else ``default``. A value that is not a finite number
    of seconds in (0, ``maximum``] (text, 0, a negative number, nan, inf, 1e400) raises a
    one-line ValueError naming the variable and the range."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= maximum):
        raise ValueError(f"{name}={text!r} must be a positive number of seconds, at most "
                         f"{maximum:g}")
    return value
