"""Settings read from the environment. Standard library only (build side and run side)."""

from __future__ import annotations

import os

__all__ = ["env_seconds"]


def env_seconds(name: str, default: float) -> float:
    """Seconds from ``$name`` if set, else ``default``; a value that is not a positive
    number raises ValueError naming the variable."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{name}={text!r} must be a positive number of seconds")
    return value
