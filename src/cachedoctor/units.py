"""Sizes, durations and moments as users type them (``10GB``, ``2w``, ``2026-01-31``), and byte
counts as every command prints them: one grammar for every command and the Python API.

The parsers take what a user gives (a string from the command line, or a number from Python)
and raise ``ValueError`` with a message that shows the accepted forms; the edge (click's
parameter types in ``cli/params.py``, ``api.py``) turns that into its own error.
"""

from __future__ import annotations

import calendar
import math
import re
import time

DURATION_UNITS = {"s": 1, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_FORMS = "a number with s, min, h, d or w: 30d, 12h, 90min, 2w"
SIZE_FORMS = "50GB, 800MiB or bytes: 1000000"
SINCE_FORMS = "a time ago (7d, 12h, 30min, 2w), a UTC date (YYYY-MM-DD) or a Unix time (1767225600)"
# Spellings that mean two things to two readers, refused rather than guessed: a prune that
# reads "6m" as six minutes where six months was meant removes what the jobs use.
_AMBIGUOUS_DURATION = {"m": "minutes or months: write {n}min for minutes, or the days (d)"}
_AMBIGUOUS_SIZE = {
    u: "10^{p} or 2^{q} bytes: write {n}{U}B or {n}{U}iB" for u in ("k", "m", "g", "t")
}
_POWERS = {"k": (3, 10), "m": (6, 20), "g": (9, 30), "t": (12, 40)}

SIZE_UNITS = {  # the units a size is written in (lower case; any case is read)
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)")
_NUMBER_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def _finite_number(value: object) -> float | None:
    """A real number given as one (not a bool, not nan or inf, not negative), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def parse_duration(text: str | float) -> float:
    """``30d``, ``12h``, ``90min``, ``45s``, ``2w``, a bare number of seconds -> seconds.

    Raises ValueError naming the accepted units (``1y``, ``5x``, ``-3d`` and ``nan`` are not
    durations).
    """
    if not isinstance(text, str):
        seconds = _finite_number(text)
        if seconds is None:
            raise ValueError(f"not a duration: {_shown(text)} (use {DURATION_FORMS})")
        return seconds
    match = _DURATION_RE.fullmatch(text.strip().lower())
    if match and match.group(2) in _AMBIGUOUS_DURATION:
        why = _AMBIGUOUS_DURATION[match.group(2)].format(n=match.group(1))
        raise ValueError(f"ambiguous duration: {_shown(text)} could mean {why}")
    if not match or (match.group(2) or "s") not in DURATION_UNITS:
        raise ValueError(f"not a duration: {_shown(text)} (use {DURATION_FORMS})")
    return float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]


def parse_size(text: str | int) -> int:
    """``50GB`` (10^9), ``50GiB`` (2^30), ``1024`` -> bytes. Raises ValueError, also for a
    bare ``800M`` (decimal or binary?)."""
    if not isinstance(text, str):
        size = _finite_number(text)
        if size is None or size != int(size):
            raise ValueError(f"not a size: {_shown(text)} (use {SIZE_FORMS})")
        return int(size)
    t = text.strip().lower().replace(" ", "")
    i = len(t)
    while i and not (t[i - 1].isdigit() or t[i - 1] == "."):
        i -= 1
    number, unit = t[:i], t[i:]
    if unit in _AMBIGUOUS_SIZE and _NUMBER_RE.fullmatch(number):
        p, q = _POWERS[unit]
        why = _AMBIGUOUS_SIZE[unit].format(p=p, q=q, n=number, U=unit.upper())
        raise ValueError(f"ambiguous size: {_shown(text)} could mean {why}")
    if unit not in SIZE_UNITS or not _NUMBER_RE.fullmatch(number):
        raise ValueError(f"not a size: {_shown(text)} (use {SIZE_FORMS})")
    value = float(number) * SIZE_UNITS[unit]
    if not math.isfinite(value):
        raise ValueError(f"not a size: {_shown(text)} (use {SIZE_FORMS})")
    return int(value)


def parse_since(text: str | float, now: float | None = None) -> float:
    """A moment, as a Unix time: ``7d`` (that long before ``now``), ``2026-01-31`` (UTC
    midnight), or a Unix time (a bare number, or a number from Python). Raises ValueError."""
    if not isinstance(text, str):
        moment = _finite_number(text)
        if moment is None:
            raise ValueError(f"not a time: {_shown(text)} (use {SINCE_FORMS})")
        return moment
    t = text.strip().lower()
    if _NUMBER_RE.fullmatch(t):
        return float(t)
    match = _DURATION_RE.fullmatch(t)
    if match and match.group(2) in _AMBIGUOUS_DURATION:
        why = _AMBIGUOUS_DURATION[match.group(2)].format(n=match.group(1))
        raise ValueError(f"ambiguous time: {_shown(text)} could mean {why}")
    if match and match.group(2) in DURATION_UNITS:
        now = time.time() if now is None else now
        return now - float(match.group(1)) * DURATION_UNITS[match.group(2)]
    try:
        return float(calendar.timegm(time.strptime(t, "%Y-%m-%d")))
    except ValueError:
        raise ValueError(f"not a time: {_shown(text)} (use {SINCE_FORMS})") from None


def format_bytes(n: int | None) -> str:
    """A byte count as every command prints it: ``512 B``, ``18.0 KiB``, ``1.2 GiB`` (powers of
    1024, the units JAX and XLA use); ``?`` when unknown. ``parse_size`` reads it back."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_age(seconds: float) -> str:
    """A span of time as plans and findings print it: ``42 s``, ``5 minutes``, ``3 hours``,
    ``12 days`` (the unit switches at two of the next)."""
    seconds = max(seconds, 0.0)
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} hours"
    if seconds >= 120:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:.0f} s"


def say_duration(seconds: float) -> str:
    """A duration in full words and seconds, as a plan states what it understood:
    ``1 minute (60 s)``, ``30 days (2592000 s)``."""
    for unit, size in (("week", 7 * 86400), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'' if n == 1 else 's'} ({seconds:.0f} s)"
    return f"{seconds:g} s"


def say_size(n: int) -> str:
    """A size in full: ``50 GB = 50,000,000,000 bytes``."""
    return f"{n:,} bytes ({format_bytes(n)})"
