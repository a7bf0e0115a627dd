"""``storage/location.Location``: one parser for what the user typed, and what each place can do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cachedoctor.errors import CachedoctorError
from cachedoctor.storage.location import Location


@pytest.mark.parametrize(
    ("typed", "spelling", "is_local"),
    [
        ("caches/sp", "caches/sp", True),  # relative: kept as typed (JAX hashes the spelling)
        ("caches/sp/", "caches/sp/", True),  # a trailing slash too: reports show what was typed
        ("./c", "./c", True),
        ("~/cache", "~/cache", True),  # not expanded: the shell does that, and JAX does not
        ("C:\\jax\\cache", "C:\\jax\\cache", True),  # a Windows-looking path is a path
        ("/abs/c", "/abs/c", True),
        ("gs://b", "gs://b", False),
        ("gs://b/", "gs://b", False),
        ("s3://b/p/", "s3://b/p", False),
        ("s3://b/p/q", "s3://b/p/q", False),
        (Path("rel/c"), "rel/c", True),  # os.PathLike
    ],
)
def test_parse_spellings(typed: str | Path, spelling: str, is_local: bool) -> None:
    loc = Location.parse(typed)
    assert (loc.spelling, loc.is_local) == (spelling, is_local)
    assert loc.display == str(loc) == spelling
    assert loc.local_path == (spelling if is_local else None)
    assert loc.url == (None if is_local else spelling)
    assert Location.parse(loc) is loc  # parsed once: a Location passes through


@pytest.mark.parametrize("typed", ["file:///tmp/c", "http://host/c", "ftp://x/y", "", "gs://"])
def test_parse_refuses_what_is_neither_folder_nor_bucket(typed: str) -> None:
    with pytest.raises(CachedoctorError) as info:
        Location.parse(typed)
    assert info.value.slug == "bad-url"
    assert "\n" not in str(info.value)


def test_capability_table() -> None:
    rows = {
        where: tuple(
            getattr(Location.parse(where), c)
            for c in ("can_rename", "has_locks", "has_modes", "has_atime")
        )
        for where in ("/c", "gs://b/p", "s3://b/p")
    }
    assert rows == {
        "/c": (True, True, True, True),
        "gs://b/p": (False, False, False, False),
        "s3://b/p": (False, False, False, False),
    }


def test_jax_spelling_children_and_parents() -> None:
    bucket = Location.parse("s3://b/p/")
    assert bucket.jax_spelling == "s3://b/p"
    assert bucket.subpath("xla_gpu_per_fusion_autotune_cache_dir") == (
        "s3://b/p/xla_gpu_per_fusion_autotune_cache_dir"
    )
    entry = bucket.child("jit_f-abc-cache")
    assert (entry.spelling, entry.name, entry.is_local) == (
        "s3://b/p/jit_f-abc-cache",
        "jit_f-abc-cache",
        False,
    )
    assert entry.parent == bucket
    assert Location.parse("gs://b").parent is None  # a bucket's root has no folder above it
    local = Location.parse("caches//sp/./")
    assert local.jax_spelling == "caches/sp"  # lexical, as JAX's Path spells it
    assert local.subpath("x") == "caches/sp/x"
    assert Location.parse("c/jit_f-1-cache").parent == Location.parse("c")
    assert Location.parse("jit_f-1-cache").parent == Location.parse(".")
    assert bucket.subcache_dir is not None and local.subcache_dir is None


def test_store_is_opened_once_and_only_on_demand(tmp_path: Path) -> None:
    loc = Location.parse(str(tmp_path))
    assert loc.store() is loc.store()
    assert loc.store().is_local
    assert Location.parse(str(tmp_path)) == loc  # the opened store is not part of equality


@pytest.mark.slow
def test_parse_imports_no_bucket_client() -> None:
    """The hook parses JAX's cache dir at start-up: a bucket URL must not import fsspec there."""
    code = (
        "import sys; from cachedoctor.storage.location import Location; "
        "l = Location.parse('gs://b/p'); l.jax_spelling; l.subcache_dir; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fsspec', 's3fs', 'gcsfs', 'concurrent') or m in "
        "('cachedoctor.storage.stores', 'cachedoctor.storage.fsops')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
