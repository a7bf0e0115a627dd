"""Two differing values never read alike in ``why``'s words (``core/why.py``): values cut to a
width are shown from where they differ, pieces that join alike are shown apart. Real runs show
the cut case (tests/core/test_why.py, 8 devices then 4: the device assignment); the values here
are shapes the components' pieces can take, given as they are."""

from __future__ import annotations

import pytest

from cachedoctor.core.why import shown_pair, value_words


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("x" * 100 + "A", "x" * 100 + "B"),  # differ after the cut
        ("[" + "item, " * 30 + "item]", "[" + "item, " * 20 + "item]"),  # one a prefix
        ("same start " * 10, "same start " * 10 + "and more"),
    ],
)
def test_values_cut_to_a_width_are_shown_where_they_differ(a: str, b: str) -> None:
    sa, sb = shown_pair(a, b)
    assert sa != sb
    assert len(sa) <= 62 and len(sb) <= 62


def test_short_values_are_shown_as_they_are() -> None:
    assert shown_pair("8", "4") == ("8", "4")
    assert shown_pair(None, "x") == ("(unset)", "x")


def test_pieces_that_join_alike_are_shown_apart() -> None:
    words = value_words("backend version", ["cpu 1", "2"], ["cpu", "1 2"])
    assert words is not None
    before, after = words.removeprefix("backend ").split(" → ")
    assert before != after, words
