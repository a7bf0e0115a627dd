"""``plaindata.slot_filler``: the generated constructor the scan's hot paths use."""

from __future__ import annotations

import dataclasses

import pytest

from cachedoctor.cache import listdir
from cachedoctor.cache.listdir import DirItem, FileKind
from cachedoctor.cache.model import EntryInfo, Problem
from cachedoctor.plaindata import slot_filler


def test_filled_item_equals_the_one_init_makes() -> None:
    values = ("n-cache", FileKind.ENTRY, "n", 3, 4, 0o100600, 0, False, False, "v", 7, 8)
    made = listdir._dir_item(*values)
    assert made == DirItem(*values)
    assert dataclasses.astuple(made) == values


def test_every_field_is_set_in_order() -> None:
    names = [f.name for f in dataclasses.fields(EntryInfo)]
    fill = slot_filler(EntryInfo, names)
    values: list[object] = list(range(len(names)))
    values[names.index("problems")] = (Problem("x", "y"),)
    info = fill(*values)
    assert [getattr(info, n) for n in names] == values
    with pytest.raises(TypeError):
        fill(*values[:-1])  # a row of another shape is refused, never half made


def test_only_slots_are_filled() -> None:
    with pytest.raises(TypeError, match="not a slot"):
        slot_filler(EntryInfo, ["key", "ok"])  # a property
    with pytest.raises(TypeError, match="not a slot"):
        slot_filler(EntryInfo, ["key", "no_such_field"])
