"""The hook under other JAX versions (interpreters from CACHEDOCTOR_COMPAT_PYTHONS)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.hookrun import compat_params, entries, run_program

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("python", compat_params())
def test_seed_hits_copies_and_migrates(python: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run_program("seed", cache, python=python)
    second = run_program("seed", cache, python=python)
    assert first.stats.get("installed") is True, first.stats
    assert "jit_f" in first.misses and second.misses == []
    assert len(entries(cache, "jit_f")) == 1
    assert second.result == first.result

    moved = tmp_path / "moved"
    shutil.copytree(cache, moved)
    assert run_program("seed", moved, python=python).misses == []

    warm = tmp_path / "warm"
    run_program("plain", warm, python=python, mode="none")
    migrated = run_program("plain", warm, python=python)
    assert migrated.misses == [] and migrated.stats["migrated"] >= 1
