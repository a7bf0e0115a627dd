"""``model.updated`` against ``dataclasses.replace``, the oracle it stands in for on a hot path."""

from __future__ import annotations

import dataclasses

import pytest

from cachedoctor.cache.model import EntryInfo, Problem, Section, updated


def test_updated_is_replace() -> None:
    info = EntryInfo(
        key="jit_f-" + "a" * 64,
        module="jit_f",
        path="/c/jit_f-" + "a" * 64 + "-cache",
        size=10,
        mtime_ns=20,
        compression="zstd",
        sections=(Section("object code", 5),),
        problems=(Problem("truncated", "cut"),),
        executable_digest="e" * 64,
    )
    changes = {"key": "k2", "path": "/c/k2-cache", "size": 11, "compile_time_s": 3}
    new = updated(info, **changes)
    assert new == dataclasses.replace(info, **changes)  # type: ignore[arg-type]
    assert new is not info and info.size == 10  # the original is untouched
    assert updated(info) == info
    with pytest.raises(TypeError, match="no field 'sizes'"):
        updated(info, sizes=1)
