"""The DebugOptions field numbers an entry sets, as ranges, and back (``debug_fields``)."""

from __future__ import annotations

import random

from cachedoctor.xla.compile_options import number_ranges, parse_ranges


def test_ranges_round_trip() -> None:
    assert number_ranges([5, 1, 2, 3, 9, 7, 8, 3]) == "1-3,5,7-9"
    assert number_ranges([]) == "" and parse_ranges("") == frozenset()
    rng = random.Random(7)
    for _ in range(200):
        numbers = {rng.randrange(1, 600) for _ in range(rng.randrange(0, 300))}
        text = number_ranges(numbers)
        assert parse_ranges(text) == numbers, text
        assert all(p for p in text.split(",")) or not numbers
