"""Facts about the installed JAX release, checked against caches it writes.

`nox -s compat` runs this file (with test_reader and test_scan) once per supported JAX release.
Expectations come from detection (the installed source, the bytes written), with the release
history in docs/format.md as the reference for what each release should show.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import pytest

from cachedoctor.cache import listdir, reader
from cachedoctor.cache.jaxenv import installed_jax
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.storage.location import Location
from tests.support.caches import make_cache

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess


def _version() -> tuple[int, ...]:
    parts = importlib.metadata.version("jax").split(".")
    return tuple(int(p) for p in parts if p.isdigit())


def test_payload_layout_matches_release(seed_cache: Path) -> None:
    entries = list(reader.iter_entries(listdir.list_cache(seed_cache)))
    assert entries and all(e.ok for e in entries), [e.problems for e in entries]
    labels = {e.format_label for e in entries}
    # The pjrt_ifrt header exists from jax 0.9.1 (docs/format.md).
    expected = "ifrt-v3" if _version() >= (0, 9, 1) else "pjrt"
    assert labels == {expected}
    assert {e.platform for e in entries} == {"cpu"}


def test_atime_files_follow_release(seed_cache: Path) -> None:
    atimes = list(seed_cache.glob("*-atime"))
    if _version() < (0, 5, 1):
        assert len(atimes) == len(list(seed_cache.glob("*-cache")))  # always written
    else:
        assert atimes == []  # only with eviction on


def test_seed_program_is_unstable_on_this_release(seed_cache: Path) -> None:
    (finding,) = [
        f for f in scan_directory(Location.parse(seed_cache)).findings if f.module == "jit_f"
    ]
    assert finding.kind is FindingKind.UNSTABLE_KEY and len(finding.entries) == 3


def test_detected_path_hashing_matches_behaviour(tmp_path: Path) -> None:
    """jaxenv reads the installed source; running JAX at a second path must agree with it."""
    a, b = tmp_path / "a", tmp_path / "b"
    make_cache(a, [("plain", {})])
    shutil.copytree(a, b)
    make_cache(b, [("plain", {})])
    entries_at_b = len(list(b.glob("jit_g-*-cache")))
    hashed = installed_jax().hashes_autotune_dir
    assert hashed is not None, "could not read the installed jax/_src/cache_key.py"
    assert entries_at_b == (2 if hashed else 1)
