"""units.py: the one grammar for sizes, durations and moments, and the one byte formatter."""

from __future__ import annotations

import datetime as dt
import math
import re

import pytest

from cachedoctor.units import (
    DURATION_UNITS,
    SIZE_UNITS,
    format_bytes,
    parse_duration,
    parse_since,
    parse_size,
)
from tests.support.caches import REPO

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90min", 5400), ("45s", 45), ("45", 45), ("2w", 1209600),
     (" 1.5H ", 5400), (".5d", 43200), (0, 0), (2.5, 2.5)],
)  # fmt: skip
def test_durations(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert dt.timedelta(seconds=parse_duration(text)).total_seconds() == seconds


@pytest.mark.parametrize(
    "text", ["1y", "5x", "-3d", "nan", "inf", "", "d", "1d2h", True, -1, math.inf]
)
def test_what_is_not_a_duration_says_which_units_are(text: object) -> None:
    with pytest.raises(ValueError) as err:
        parse_duration(text)  # type: ignore[arg-type]
    assert "not a duration" in str(err.value)
    assert "s, min, h, d or w" in str(err.value)
    assert "could not convert" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "size"),
    [("50GB", 50 * 10**9), ("800MiB", 800 * 2**20), ("1024", 1024), ("1.5 GiB", 3 * 2**29),
     ("10kB", 10_000), ("2 TiB", 2 * 2**40), (4096, 4096)],
)  # fmt: skip
def test_sizes(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "1y", "-1GB", "GB", "1.2.3MB", True, 1.5, -1, "nan"])
def test_what_is_not_a_size(text: object) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)  # type: ignore[arg-type]


def test_moments_ago_dates_and_unix_times() -> None:
    assert parse_since("2w", now=NOW) == NOW - 14 * 86400
    assert parse_since("7d", now=NOW) == NOW - 7 * 86400
    assert parse_since("30min", now=NOW) == NOW - 1800
    midnight = dt.datetime(2026, 1, 31, tzinfo=dt.UTC).timestamp()
    assert parse_since("2026-01-31") == midnight
    assert parse_since("1796075058") == 1796075058.0  # a Unix time, as api.md says
    assert parse_since(1796075058.5) == 1796075058.5
    for bad in ("soon", "2026-13-01", "7y", "-5", True, math.nan):
        with pytest.raises(ValueError, match="not a time"):
            parse_since(bad)


@pytest.mark.parametrize(
    ("parse", "text", "meanings"),
    [(parse_duration, "6m", "minutes or months"), (parse_since, "6m", "minutes or months"),
     (parse_size, "800M", "10^6 or 2^20 bytes: write 800MB or 800MiB"),
     (parse_size, "2k", "10^3 or 2^10"), (parse_size, "1.5g", "10^9 or 2^30"),
     (parse_size, "3T", "10^12 or 2^40")],
)  # fmt: skip
def test_a_spelling_that_could_mean_two_things_is_refused(
    parse: object, text: str, meanings: str
) -> None:
    """Issue 39: "6m" read as six minutes where six months was meant prunes what jobs use."""
    with pytest.raises(ValueError, match="ambiguous") as err:
        parse(text)  # type: ignore[operator]
    assert meanings in str(err.value)


def test_a_plan_states_durations_and_sizes_in_full() -> None:
    from cachedoctor.units import say_duration, say_size

    assert say_duration(60) == "1 minute (60 s)"
    assert say_duration(90 * 60) == "90 minutes (5400 s)"
    assert say_duration(14 * 86400) == "2 weeks (1209600 s)"
    assert say_duration(5) == "5 s"
    assert say_size(50 * 10**9) == "50,000,000,000 bytes (46.6 GiB)"


@pytest.mark.parametrize(
    ("n", "shown"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (18_432, "18.0 KiB"),
     (5 * 2**20, "5.0 MiB"), (3 * 2**30, "3.0 GiB"), (2**50, "1024.0 TiB"), (None, "?")],
)  # fmt: skip
def test_one_byte_formatter(n: int | None, shown: str) -> None:
    assert format_bytes(n) == shown


def test_what_is_printed_parses_back() -> None:
    for n in (1, 1000, 1536, 10**6, 123_456_789, 7 * 2**30):
        back = parse_size(format_bytes(n))
        assert abs(back - n) <= 0.05 * n + 1, (n, format_bytes(n), back)


# --- docs/commands.md says exactly what is read -----------------------------------------------

COMMANDS_DOC = REPO / "docs" / "commands.md"


def doc_bullet(term: str) -> tuple[list[str], list[str]]:
    """The backticked spellings of the docs' bullet defining ``term`` (SIZE, AGE, WHEN): those
    it gives as read, and those after "refused:"."""
    bullet = rf"^- (?:an? )?{term} is (.*?)(?=^- |^$)"  # to the next bullet or blank line
    found = re.search(bullet, COMMANDS_DOC.read_text(), re.M | re.S)
    assert found, f"docs/commands.md defines no {term}"
    read, _, refused = " ".join(found.group(1).split()).partition("refused:")
    return re.findall(r"`([^`]+)`", read), re.findall(r"`([^`]+)`", refused)


def values_and_units(spellings: list[str]) -> tuple[list[str], set[str]]:
    values = [s for s in spellings if any(c.isdigit() for c in s)]
    return values, {s.lower() for s in spellings if s not in values}


def test_the_docs_name_every_duration_unit_and_each_example_reads_as_said() -> None:
    read, refused = doc_bullet("AGE")
    values, named = values_and_units(read)
    assert named == set(DURATION_UNITS)  # every unit read, and no other
    assert parse_duration("45") == 45  # "a number of seconds"
    for text in values:
        assert parse_duration(text) > 0, text
    bad, bad_units = values_and_units(refused)
    for text in [*bad, *(f"6{unit}" for unit in bad_units)]:
        with pytest.raises(ValueError):
            parse_duration(text)


def test_the_docs_name_every_size_unit_and_each_example_reads_as_said() -> None:
    read, refused = doc_bullet("SIZE")
    values, named = values_and_units(read)
    assert named == set(SIZE_UNITS) - {""}
    for text in values:
        assert parse_size(text) > 0, text
    bad, bad_units = values_and_units(refused)
    for text in [*bad, *(f"6{unit}" for unit in bad_units)]:
        with pytest.raises(ValueError):
            parse_size(text)


def test_the_docs_times_read_as_said() -> None:
    read, refused = doc_bullet("WHEN")
    values, _ = values_and_units(read)
    for text in values:
        parse_since(text, now=NOW)
    assert parse_since("1767225600", now=NOW) == 1767225600  # a Unix time, not seconds ago
    for text in refused:
        with pytest.raises(ValueError):
            parse_since(text, now=NOW)
