"""The directory listing against what ``os.lstat`` says of each name (the independent ground)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from cachedoctor.cache import listdir
from cachedoctor.cache.listdir import DirItem, FileKind

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess


def test_listing_items_are_what_lstat_says(seed_cache: Path, tmp_path: Path) -> None:
    """Every field of every item, for entries, -atime files, a symlink, a folder and a FIFO:
    the listing fills DirItem's slots directly (for speed), so compare with the constructor."""
    cache = tmp_path / "cache"
    shutil.copytree(seed_cache, cache, symlinks=True)
    entry = next(p for p in cache.iterdir() if p.name.endswith("-cache"))
    (cache / ("jit_g-" + "a" * 64 + "-cache")).symlink_to(entry)
    atime = cache / (entry.name[: -len("-cache")] + "-atime")
    if not atime.exists():  # JAX writes these only when its LRU eviction is on
        atime.write_bytes((1).to_bytes(8, "little"))
    (cache / "somedir").mkdir()
    os.mkfifo(cache / "a-fifo")
    items = listdir.list_cache(cache).items
    assert [i.name for i in items] == sorted(os.listdir(cache))
    for item in items:
        st = os.lstat(cache / item.name)
        expected = DirItem(
            name=item.name,
            kind=item.kind,
            key=item.key,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            mode=st.st_mode,
            uid=st.st_uid,
            is_symlink=stat.S_ISLNK(st.st_mode),
            is_dir=stat.S_ISDIR(st.st_mode),
            ino=st.st_ino,
            ctime_ns=st.st_ctime_ns,
        )
        assert item == expected and hash(item) == hash(expected)
        assert item.version is None
    kinds = {i.name: i.kind for i in items}
    assert kinds["a-fifo"] is FileKind.UNKNOWN and kinds["somedir"] is FileKind.UNKNOWN
    assert sum(k is FileKind.ENTRY for k in kinds.values()) >= 3
    assert any(k is FileKind.ATIME for k in kinds.values())
