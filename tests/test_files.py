"""The one atomic file write: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cachedoctor.storage.files import atomic_file, replace_with_link, write_atomic


def test_write_replaces_whole_and_sets_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")
    write_atomic(target, b"new", mode=0o644)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    write_atomic(target, b"private")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # mkstemp's default: private
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "index"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(target, temp_prefix=".tmp-") as fh:
        fh.write(b"half of the new")
        assert [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]  # written aside
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["index"]


def test_replace_with_link_publishes_a_copy_under_the_new_name(tmp_path: Path) -> None:
    src, dst = tmp_path / "jit_f-old-cache", tmp_path / "jit_f-new-cache"
    src.write_bytes(b"entry")
    dst.write_bytes(b"stale")
    replace_with_link(src, dst, temp_prefix=".cachedoctor-rekey-")
    assert dst.read_bytes() == b"entry" and src.read_bytes() == b"entry"
    assert sorted(os.listdir(tmp_path)) == ["jit_f-new-cache", "jit_f-old-cache"]
    with pytest.raises(FileNotFoundError):
        replace_with_link(tmp_path / "missing", dst, temp_prefix=".cachedoctor-rekey-")
    assert sorted(os.listdir(tmp_path)) == ["jit_f-new-cache", "jit_f-old-cache"]
