"""Fixtures the core's tests share: the stats records real hooked JAX processes wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachedoctor.cache import index
from tests.support.hookrun import recorded_seed_cache
from tests.support.sessioncache import SharedBuilds


@pytest.fixture(scope="module")
def recorded_cache(shared_builds: SharedBuilds) -> Path:
    """The seed program run three times with stats recording (built once per test run)."""
    return recorded_seed_cache(shared_builds)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files copied a moment ago count as settled (their ctime is the copy's): no racy window."""
    monkeypatch.setattr(index, "RACY_S", 0.0)
