"""Sizes and durations as users type them (``10GB``, ``2w``): one grammar for every command."""

from __future__ import annotations

import math

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` -> seconds. Raises ValueError."""
    t = text.strip().lower()
    unit = t[-1:] if t[-1:] in _DURATION_UNITS else "s"
    number = t[:-1] if t[-1:] in _DURATION_UNITS else t
    value = float(number)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m)")
    return value * _DURATION_UNITS[unit]


def parse_size(text: str) -> int:
    """``50GB`` (10^9), ``50GiB`` (2^30), ``800M``, ``1024`` -> bytes. Raises ValueError."""
    t = text.strip().lower().replace(" ", "")
    i = len(t)
    while i and not (t[i - 1].isdigit() or t[i - 1] == "."):
        i -= 1
    number, unit = t[:i], t[i:]
    if unit not in _SIZE_UNITS or not number:
        raise ValueError(f"not a size: {text!r} (use e.g. 50GB, 800MiB, 1000000)")
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a size: {text!r} (use e.g. 50GB, 800MiB, 1000000)")
    return int(value)
