"""The stats records' index (``cache/record_index.py``, issue 26): each record file is parsed
and checked once; later reads take every unchanged file from the index and see every change.

The records are those real hooked JAX processes wrote (the seed program three times with
``CACHEDOCTOR_HOOK=stats``); hand-made bytes only for torn records and a damaged index. The
oracle for "the same" is the same read without the index (``use_index=False``, or
``CACHEDOCTOR_NO_INDEX``), which parses every file as before.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from cachedoctor.cache import index, index_file, record_index
from cachedoctor.core.stats import collect_stats
from cachedoctor.core.usage import records, validate
from cachedoctor.core.usage.model import Record
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.plaindata import plain
from cachedoctor.storage.location import Location
from cachedoctor.storage.stores import open_store
from tests.support.caches import record_files


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the record files parsed (not served from the index)."""
    seen: list[str] = []
    real = validate.parse_record

    def counting(file: str, data: bytes) -> Record:
        seen.append(file)
        return real(file, data)

    monkeypatch.setattr(validate, "parse_record", counting)
    return seen


def read(cache: Path, *, use_index: bool = True) -> tuple[object, object]:
    found, problems = records.read_records(open_store(cache), use_index=use_index)
    return plain(found), plain(problems)


def rows(cache: Path) -> dict[str, str]:
    """Name -> identity of each row of the cache's records index."""
    with sqlite3.connect(index_file.side_path(cache, record_index.PART)) as db:
        return {os.fsdecode(n): i for n, i in db.execute("SELECT name, identity FROM records")}


@pytest.mark.slow
def test_records_served_from_the_index_are_those_read_from_the_files(
    recorded_cache: Path, copy_of, parsed: list[str], settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = copy_of(recorded_cache)
    (cache / STATS_DIRNAME / "torn.json").write_bytes(b'{"format": "cachedoctor-stats/1", "mo')
    without = read(cache, use_index=False)
    assert len(without[0]) == 3 and len(without[1]) == 1  # type: ignore[arg-type]
    parsed.clear()
    assert read(cache) == without  # first: every file read, the index written
    assert len(parsed) == 4 and len(rows(cache)) == 4
    parsed.clear()
    assert read(cache) == without  # repeated: every file from the index
    assert parsed == []
    # the whole report too (what `stats --json` prints)
    served = collect_stats(Location.parse(str(cache)))
    assert parsed == []
    monkeypatch.setenv(index_file.DISABLE_ENV, "1")
    fresh = collect_stats(Location.parse(str(cache)))
    # without the index each file is parsed three times: by the fold, by why's missed keys,
    # and by the scan (its corrupt rule reads JAX's failed loads in them)
    assert len(parsed) == 12
    assert served.to_dict() == fresh.to_dict()


@pytest.mark.slow
def test_a_record_changed_removed_or_added_between_runs_is_seen(
    recorded_cache: Path, copy_of, parsed: list[str], settled: None
) -> None:
    cache = copy_of(recorded_cache)
    first, second, third = record_files(cache)
    read(cache)
    # changed in place, same size and mtime (within a timestamp tick): only ctime tells
    data = first.read_bytes()
    doc = json.loads(data)
    before = first.stat()
    changed = data.replace(b'"pid": %d' % doc["pid"], b'"pid": %d' % (doc["pid"] + 1))
    assert len(changed) == len(data) and changed != data
    first.write_bytes(changed)
    os.utime(first, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert first.stat().st_mtime_ns == before.st_mtime_ns
    second.unlink()  # removed
    added = third.with_name(third.name[: -len("01234567.json")] + "01234567.json")  # another tag
    shutil.copy2(third, added)
    parsed.clear()
    found, _ = records.read_records(open_store(cache))
    assert sorted(parsed) == sorted([first.name, added.name])  # only the changed and the new
    assert {r.file: r.pid for r in found} == {
        first.name: doc["pid"] + 1,
        third.name: json.loads(third.read_bytes())["pid"],
        added.name: json.loads(third.read_bytes())["pid"],
    }
    assert set(rows(cache)) == {first.name, third.name, added.name}  # the removed row is gone
    assert (plain(found), []) == read(cache, use_index=False)


@pytest.mark.slow
def test_a_record_written_in_the_last_seconds_is_never_stored(
    recorded_cache: Path, copy_of, parsed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose mtime or ctime is within ``RACY_S`` may still change in the same tick: it
    is read every time and never kept (every file here was copied a moment ago: within an hour).
    """
    monkeypatch.setattr(index, "RACY_S", 3600.0)
    cache = copy_of(recorded_cache)
    read(cache)
    read(cache)
    assert len(parsed) == 6
    assert not index_file.side_path(cache, record_index.PART).exists() or rows(cache) == {}


@pytest.mark.slow
def test_a_damaged_index_is_read_again_from_the_files(
    recorded_cache: Path, copy_of, parsed: list[str], settled: None
) -> None:
    cache = copy_of(recorded_cache)
    truth = read(cache, use_index=False)
    read(cache)
    path = index_file.side_path(cache, record_index.PART)
    with sqlite3.connect(path) as db:  # a row whose body no longer matches its checksum
        db.execute("UPDATE records SET body = replace(body, '\"stats\"', '\"other\"')")
    parsed.clear()
    assert read(cache) == truth
    assert len(parsed) == 3
    path.write_bytes(b"not a database" * 100)  # the whole file
    parsed.clear()
    assert read(cache) == truth
    assert len(parsed) == 3
    parsed.clear()
    assert read(cache) == truth  # rewritten whole: served again
    assert parsed == []


def test_torn_records_are_findings_served_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parsed: list[str], settled: None
) -> None:
    """Hand-made bytes only as corrupt input: a torn file's finding comes back the same."""
    folder = tmp_path / STATS_DIRNAME
    folder.mkdir()
    (folder / "a.json").write_bytes(b'{"format": "cachedoctor-stats/1", "modu')
    (folder / "b.json").write_bytes(b"\xff\xfe not json")
    (folder / "notes.txt").write_text("foreign")
    truth = read(tmp_path, use_index=False)
    assert read(tmp_path) == truth
    parsed.clear()
    assert read(tmp_path) == truth
    assert parsed == []
    monkeypatch.setenv(index_file.DISABLE_ENV, "1")
    assert read(tmp_path) == truth
    assert parsed == ["a.json", "b.json"]
