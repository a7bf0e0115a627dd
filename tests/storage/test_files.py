"""The one atomic file write: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from cachedoctor.storage.files import atomic_file, replacing, write_atomic
from cachedoctor.storage.fsops import CacheDir


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


def test_replacing_renames_the_path_over_or_removes_it(tmp_path: Path) -> None:
    """For writers that need a path (sqlite): the target is the old file until the block ends,
    then the new one; a failure leaves the old file and no temp."""
    import sqlite3

    target = tmp_path / "index.sqlite"
    target.write_bytes(b"old")
    with replacing(target, temp_prefix=".tmp-", suffix=".sqlite") as tmp:
        db = sqlite3.connect(tmp)
        with db:
            db.execute("CREATE TABLE t (v)")
        db.close()
        assert target.read_bytes() == b"old" and os.path.dirname(tmp) == str(tmp_path)
    db = sqlite3.connect(target)
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)
    db.close()
    with pytest.raises(RuntimeError), replacing(target, temp_prefix=".tmp-") as tmp:
        Path(tmp).write_bytes(b"half")
        raise RuntimeError("disk full")
    assert sorted(os.listdir(tmp_path)) == ["index.sqlite"]
    assert target.read_bytes().startswith(b"SQLite format 3")


@pytest.mark.parametrize("hard_links", [True, False], ids=["links", "no-links"])
def test_link_replacing_publishes_the_file_under_the_new_name_never_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hard_links: bool
) -> None:
    """The hook's re-keying: the same bytes under a second name, replacing what stood there;
    a name that is a symbolic link is refused, and its target is neither read nor changed."""
    if not hard_links:

        def no_link(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EPERM, "no hard links here")

        monkeypatch.setattr(os, "link", no_link)
    src, dst = tmp_path / "jit_f-old-cache", tmp_path / "jit_f-new-cache"
    src.write_bytes(b"entry")
    dst.write_bytes(b"stale")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_bytes(b"secret")
    (tmp_path / "jit_f-link-cache").symlink_to(outside)
    with CacheDir.open(tmp_path) as cd:
        cd.link_replacing(src.name, dst.name)
        for missing in ("missing", "jit_f-link-cache"):
            with pytest.raises(OSError):
                cd.link_replacing(missing, "jit_f-other-cache")
    assert dst.read_bytes() == b"entry" and src.read_bytes() == b"entry"
    names = ["jit_f-link-cache", "jit_f-new-cache", "jit_f-old-cache"]
    assert sorted(os.listdir(tmp_path)) == names
    assert outside.read_bytes() == b"secret"
