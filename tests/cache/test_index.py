"""The scan index: unchanged entries come from it, anything changed is decoded again, and an index
that is damaged, forged or from other code is ignored. Caches are real (the seed fixture).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.cache import index, index_file, index_rows, parallel, reader, travel
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.render.jsonout import dumps, iter_scan_json, scan_document
from cachedoctor.storage.location import Location
from tests.support.caches import entries_of
from tests.support.gpu_vectors import plain_gpu_entry

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

OPTIONS = (reader.DEFAULT_MAX_DECOMPRESSED,)
NOW = 2_000_000_000.0  # fixed "now" for findings, so two reports can be compared as text


@pytest.fixture(autouse=True)
def _private_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(index_file.DISABLE_ENV, raising=False)
    monkeypatch.delenv(travel.IN_CACHE_ENV, raising=False)  # each cache here is a copy
    monkeypatch.setattr(index, "RACY_S", 0.0)  # copies were just made: store them anyway


@pytest.fixture
def cache(seed_cache: Path, copy_of: Callable[[Path], Path]) -> Path:
    return copy_of(seed_cache)


def report(d: Path, use_index: bool = True) -> str:
    return dumps(scan_document(scan_directory(Location.parse(d), now=NOW, use_index=use_index)))


def entry_names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith("-cache"))


def test_second_scan_decodes_nothing_and_reports_the_same(cache: Path, decodes: list[str]) -> None:
    plain = report(cache, use_index=False)
    assert report(cache) == plain
    decodes.clear()
    assert report(cache) == plain
    assert decodes == []
    assert index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,)).loaded
    # the index travels with the cache, in a folder of its own that no listing shows
    assert index_file.index_path(cache) == cache.resolve() / "cachedoctor-index" / "index.sqlite"
    assert [p.name for p in cache.iterdir() if p.name.startswith("cachedoctor")] == [
        "cachedoctor-index"
    ]
    assert not (Path(os.environ["XDG_CACHE_HOME"]) / "cachedoctor").exists()


def test_rewritten_entry_is_decoded_again(cache: Path, decodes: list[str]) -> None:
    report(cache)
    victim = cache / entry_names(cache)[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # cut short: must now be reported corrupt
    decodes.clear()
    got = scan_directory(Location.parse(cache), now=NOW)
    assert decodes == [victim.name]
    bad = [e for e in entries_of(got) if e.problems]
    assert [e.path for e in bad] == [str(victim)]
    assert report(cache) == report(cache, use_index=False)


def test_touched_entry_is_decoded_again(cache: Path, decodes: list[str]) -> None:
    report(cache)
    victim = cache / entry_names(cache)[1]
    st = victim.stat()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    decodes.clear()
    assert report(cache) == report(cache, use_index=False)
    assert victim.name in decodes


def test_replaced_entry_with_same_size_and_mtime_is_decoded_again(
    cache: Path, decodes: list[str]
) -> None:
    """A file swapped in under the old name, size and mtime still has a new inode and ctime."""
    report(cache)
    names = entry_names(cache)
    victim = cache / names[0]
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    swap = cache / "swap.tmp"
    swap.write_bytes(bytes(data))
    os.utime(swap, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(swap, victim)
    decodes.clear()
    fresh = reader.decode_entry(victim)
    got = {e.key: e for e in entries_of(scan_directory(Location.parse(cache), now=NOW))}
    assert decodes.count(victim.name) == 2  # once by the test, once by the scan
    assert got[victim.name[: -len("-cache")]] == fresh


def test_a_decode_of_other_bytes_than_listed_is_not_stored(cache: Path) -> None:
    """A row serves its file's size and mtime from the listing: one decoded from a file that
    changed after it was listed (another size or mtime) is not stored under the listed one."""
    from cachedoctor.cache import listdir
    from cachedoctor.cache.model import EntryInfo, updated

    listing = listdir.list_cache(cache)
    first, second = listing.entries[:2]
    decoded: dict[str, EntryInfo] = {}
    for item in (first, second):
        info = reader.decode_entry(str(cache / item.name), key=item.key)
        assert isinstance(info, EntryInfo)
        decoded[item.name] = info
    decoded[first.name] = updated(decoded[first.name], mtime_ns=first.mtime_ns + 1)
    idx = index.load(str(cache), OPTIONS)
    idx.update(listing.entries, decoded, now=NOW)
    idx.save()
    rows = index.load(str(cache), OPTIONS).entries
    assert second.name in rows and first.name not in rows


def test_vanished_entry_leaves_the_index(cache: Path) -> None:
    report(cache)
    gone = entry_names(cache)[0]
    (cache / gone).unlink()
    report(cache)
    loaded = index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,))
    assert loaded.loaded and gone not in loaded.entries


def _index_file(cache: Path) -> Path:
    path = index_file.index_path(cache)
    assert path.is_file()
    return path


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "flip-header"])
def test_damaged_index_is_ignored(cache: Path, decodes: list[str], damage: str) -> None:
    expected = report(cache, use_index=False)
    report(cache)
    path = _index_file(cache)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2 :]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "empty":
        data = bytearray()
    else:  # the database header itself
        data[:16] = b"not an index\0\0\0\0"
    path.write_bytes(bytes(data))
    assert not index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,)).loaded
    decodes.clear()
    assert report(cache) == expected
    assert sorted(decodes) == entry_names(cache)  # everything decoded again
    assert index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,)).loaded  # and rewritten


def _rewrite_rows(cache: Path, sql: str) -> None:
    db = sqlite3.connect(_index_file(cache))
    with db:
        db.execute(sql)
    db.close()


@pytest.mark.parametrize(
    "sql",
    [
        # a value changed in place: the row's checksum no longer matches
        "UPDATE entries SET compression = 'zlib' WHERE rowid = 1",
        # a value of another type with a checksum of its own: decoding it fails
        "UPDATE entries SET compile_time = '[1,2,3]' WHERE rowid = 1",
        # a shared HLO summary changed: every row that uses it is decoded again
        "UPDATE hlo SET body = replace(body, 'jit_', 'jax_')",
        # the shared parts changed: every row that uses them is decoded again
        "UPDATE parts SET body = replace(body, '\"cpu\"', '\"gpu\"')",
    ],
)
def test_damaged_rows_are_decoded_again_alone(cache: Path, decodes: list[str], sql: str) -> None:
    expected = report(cache, use_index=False)
    report(cache)
    _rewrite_rows(cache, sql)
    if "[1,2,3]" in sql:  # give the bad row a valid checksum: only decoding can refuse it
        loaded = index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,))
        db = sqlite3.connect(_index_file(cache))
        with db:
            for name, *row, _ in db.execute("SELECT * FROM entries WHERE rowid = 1"):
                good = index_rows.checksum(os.fsdecode(name), *row[2:])
                db.execute("UPDATE entries SET checksum = ? WHERE rowid = 1", (good,))
        db.close()
        assert loaded.loaded
    decodes.clear()
    assert report(cache) == expected
    if sql.split()[1] in ("hlo", "parts"):
        assert sorted(decodes) == entry_names(cache)  # every seed entry: an HLO module, on CPU
    else:
        assert len(decodes) == 1  # that row alone
    decodes.clear()
    assert report(cache) == expected  # the damaged rows were written again
    assert decodes == []


def test_index_is_plain_rows_never_pickle(cache: Path) -> None:
    """Reading an index can never run code: it is sqlite rows of plain values and JSON text."""
    report(cache)
    db = sqlite3.connect(_index_file(cache))
    bodies = [
        body for table in ("parts", "hlo") for (body,) in db.execute(f"SELECT body FROM {table}")
    ]
    values = list(db.execute("SELECT compile_time, compression FROM entries"))
    db.close()
    assert bodies and all(isinstance(json.loads(text), list) for text in bodies)
    assert values and all(type(v) in (int, str, type(None)) for row in values for v in row)


def test_gpu_entry_keeps_the_rest_of_the_index(
    cache: Path,
    decodes: list[str],
    real_hlo_with_config: bytes,
) -> None:
    """One GPU entry among CPU entries: every entry, the GPU one included, comes from the index."""
    gpu_entry = plain_gpu_entry(cache, real_hlo_with_config)
    expected = report(cache, use_index=False)
    assert any(
        e.gpu is not None for e in entries_of(scan_directory(Location.parse(cache), now=NOW))
    )
    decodes.clear()
    assert report(cache) == expected
    assert decodes == []
    assert gpu_entry.name in entry_names(cache)


def test_symlinked_index_is_not_followed(cache: Path, tmp_path: Path, decodes: list[str]) -> None:
    report(cache)
    path = _index_file(cache)
    elsewhere = tmp_path / "elsewhere.sqlite"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    assert not index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,)).loaded


def test_index_of_other_options_or_code_is_not_used(
    cache: Path, decodes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    report(cache)
    assert not index.load(str(cache), (123,)).loaded  # another max_decompressed
    monkeypatch.setattr(index_file, "_FINGERPRINT", b"another reader")
    assert not index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,)).loaded


def test_entries_written_just_now_are_not_stored(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file changed within the last seconds may still be written: never trust it."""
    monkeypatch.setattr(index, "RACY_S", 3600.0)
    report(cache)
    loaded = index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,))
    assert loaded.entries == {}


def test_same_cache_through_another_path_keeps_paths_right(
    cache: Path, tmp_path: Path, decodes: list[str]
) -> None:
    report(cache)
    link = tmp_path / "link-to-cache"
    link.symlink_to(cache)
    decodes.clear()
    got = scan_directory(Location.parse(link), now=NOW)
    assert decodes == []
    assert all(e.path.startswith(str(link) + os.sep) for e in entries_of(got))


def test_disabled_by_environment(
    cache: Path, decodes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(index_file.DISABLE_ENV, "1")
    report(cache)
    decodes.clear()
    report(cache)
    assert sorted(decodes) == entry_names(cache)


def test_index_folder_is_bounded(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(travel.IN_CACHE_ENV, "0")  # the user cache dir's folder of indexes
    report(cache)
    root = index_file.index_root()
    for n in range(5):
        (root / f"{n:032x}{index_file.SUFFIX}").write_bytes(b"x" * 1000)
        os.utime(root / f"{n:032x}{index_file.SUFFIX}", (n, n))
    first = index_file.index_path(cache).stat().st_size
    monkeypatch.setattr(index_file, "MAX_TOTAL_BYTES", first + 2500)
    other = cache.parent / "other-cache"
    shutil.copytree(cache, other)
    report(other)
    left = sorted(p.name for p in root.glob(f"*{index_file.SUFFIX}"))
    assert index_file.index_path(other).name in left
    assert f"{0:032x}{index_file.SUFFIX}" not in left  # the oldest went first
    assert f"{4:032x}{index_file.SUFFIX}" in left


def test_same_report_with_or_without_index_on_one_or_more_workers(
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    real_hlo_with_config: bytes,
) -> None:
    """The index and the pool are shortcuts: whichever serves an entry, the result is the same."""
    plain_gpu_entry(cache, real_hlo_with_config)
    data = (cache / entry_names(cache)[0]).read_bytes()
    (cache / f"jit_cut-{'c' * 64}-cache").write_bytes(data[: len(data) // 3])
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ENTRIES", 0)  # a handful really uses the pool
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel, "BATCH_ENTRIES", 1)

    def scanned(use_index: bool, workers: int) -> tuple[str, tuple[object, ...]]:
        got = scan_directory(Location.parse(cache), now=NOW, use_index=use_index, workers=workers)
        return dumps(scan_document(got)), entries_of(got)

    baseline = scanned(use_index=False, workers=1)
    assert len(baseline[1]) == len(entry_names(cache))
    assert scanned(use_index=False, workers=2) == baseline
    assert scanned(use_index=True, workers=2) == baseline  # decodes all, writes the index
    assert scanned(use_index=True, workers=1) == baseline  # everything from the index
    victim = cache / entry_names(cache)[2]
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 1))
    touched = scanned(use_index=False, workers=1)
    assert touched != baseline  # the new mtime shows
    assert scanned(use_index=True, workers=2) == touched  # one decoded, the rest from the index


def test_streamed_json_is_byte_equal_with_or_without_index_on_one_or_more_workers(
    evict_cache: Path,
    copy_of: Callable[[Path], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `scan --json` writes (entries, findings and files streamed one at a time) is the same
    text whichever of the index and the pool served each entry, and is the whole document."""
    cache = copy_of(evict_cache)  # written by JAX with LRU eviction on: -atime files, .lockfile
    data = (cache / entry_names(cache)[0]).read_bytes()
    (cache / f"jit_cut-{'c' * 64}-cache").write_bytes(data[: len(data) // 3])  # a finding
    (cache / "notes.txt").write_text("not JAX's")  # another file
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ENTRIES", 0)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel, "BATCH_ENTRIES", 1)

    def streamed(use_index: bool, workers: int) -> str:
        got = scan_directory(Location.parse(cache), now=NOW, use_index=use_index, workers=workers)
        return "".join(iter_scan_json(got))

    plain = scan_directory(Location.parse(cache), now=NOW, use_index=False, workers=1)
    whole = dumps(scan_document(plain))
    doc = json.loads(whole)
    assert doc["findings"] and doc["entries"]  # every streamed array has elements
    assert any(f["kind"] == "atime" for f in doc["files"])
    assert streamed(use_index=False, workers=1) == whole
    assert streamed(use_index=False, workers=2) == whole
    assert streamed(use_index=True, workers=2) == whole  # decodes all, writes the index
    assert streamed(use_index=True, workers=1) == whole  # everything from the index
    assert set(index.load(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,)).entries) == set(
        entry_names(cache)
    )  # so the index served every entry
