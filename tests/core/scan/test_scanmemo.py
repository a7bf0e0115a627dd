"""The scan memo: a repeated scan of an unchanged cache serves the last report, and any change to
what a scan reads (a file's bytes, times, mode, a name added or gone, a key manifest, the code,
the installed JAX, the clock) makes a scan that is the same as one without index or memo.

The oracle is the scan itself with ``use_index=False`` (no index, no memo) on the same state;
caches are real (the seed fixture), changes are made as a user or JAX would make them.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest

from cachedoctor import layout
from cachedoctor.cache import index, index_file, listdir, memostore, parallel, reader
from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.core.findings import FindingKind, Severity
from cachedoctor.core.scan import memo as scanmemo
from cachedoctor.core.scan.report import RECENT_WRITE_S, ScanReport
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.render.formats import render_to_string
from cachedoctor.render.jsonout import dumps, scan_document
from cachedoctor.storage.location import Location
from tests.support.caches import entries_of, write_manifest

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

NOW = 2_000_000_000.0  # every file of the fixture is older than a minute at this "now"
GONE = "jit_gone-" + "a" * 64  # a key manifest without an entry: a not-stored finding


@pytest.fixture(autouse=True)
def _private_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(index_file.DISABLE_ENV, raising=False)
    monkeypatch.setattr(index, "RACY_S", 0.0)  # copies were just made: index them anyway
    monkeypatch.setenv(parallel.WORKERS_ENV, "1")


_SERVED: list[ScanReport] = []  # the reports the memo served in this test


@pytest.fixture(autouse=True)
def _served_reports(memo_served: list[ScanReport]) -> Iterator[None]:
    global _SERVED
    _SERVED = memo_served
    yield
    _SERVED = []


@pytest.fixture
def cache(seed_cache: Path, copy_of: Callable[[Path], Path]) -> Path:
    root = copy_of(seed_cache)
    write_manifest(root, GONE)
    return root


def document(report: ScanReport) -> str:
    return dumps(scan_document(report))


def scanned(root: Path, now: float = NOW, **kwargs: object) -> ScanReport:
    return scan_directory(Location.parse(root), now=now, **kwargs)  # type: ignore[arg-type]


def served(report: ScanReport) -> bool:
    """Whether the memo served ``report`` (the scan returns the memo's report as it is)."""
    return any(report is r for r in _SERVED)


def entry_files(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.endswith(layout.CACHE_SUFFIX))


def test_repeated_scan_is_served_and_is_the_scan(
    cache: Path,
    decodes: list[str],
) -> None:
    plain = scanned(cache, use_index=False)
    assert not served(scanned(cache))  # the first scan keeps it
    decodes.clear()
    again = scanned(cache)
    assert served(again)
    text = scanned(cache, entries=False)  # as the text report asks for it
    assert served(text) and text.entries is None and text.other_files is None
    assert render_to_string(text, "text") == render_to_string(plain, "text")
    assert text.looks_like_cache and text.other_file_count == len(plain.other_files or ())
    assert {f.kind for f in again.findings} >= {FindingKind.NOT_STORED}
    assert document(again) == document(plain)  # entries and files made from the index
    assert decodes == []
    assert again == plain  # the dataclasses too, entries included
    assert again.to_dict() == plain.to_dict()


def _touch(root: Path) -> None:
    victim = entry_files(root)[0]
    st = victim.stat()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 1))


def _chmod(root: Path) -> None:
    os.chmod(entry_files(root)[0], 0o664)


def _same_size_and_mtime(root: Path) -> None:
    victim = entry_files(root)[0]
    st = victim.stat()
    victim.write_bytes(b"\0" * st.st_size)  # damaged in place: only ctime tells
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))


def _new_file(root: Path) -> None:
    (root / "notes.txt").write_text("not JAX's")


def _removed(root: Path) -> None:
    entry_files(root)[0].unlink()


def _renamed_over(root: Path) -> None:
    a, b = entry_files(root)[:2]
    os.replace(a, b)


def _manifest_rewritten(root: Path) -> None:
    path = root / layout.MANIFEST_DIRNAME / f"{GONE}.json"
    folder = path.parent.stat()
    data = json.loads(path.read_text())
    with open(path, "w") as fh:  # in place: the folder's own times do not change
        json.dump({**data, "module_name": "jit_renamed"}, fh)
    assert path.parent.stat().st_mtime_ns == folder.st_mtime_ns


def _autotune_dir(root: Path) -> None:
    (root / layout.AUTOTUNE_DIR).mkdir()


CHANGES = {
    "touch": _touch,
    "chmod": _chmod,
    "same-size-and-mtime": _same_size_and_mtime,
    "new-file": _new_file,
    "removed": _removed,
    "renamed-over": _renamed_over,
    "manifest-rewritten": _manifest_rewritten,
    "xla-subcache": _autotune_dir,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_change_is_seen(cache: Path, change: str) -> None:
    before = document(scanned(cache, use_index=False))
    scanned(cache)
    assert served(scanned(cache))
    CHANGES[change](cache)
    plain = document(scanned(cache, use_index=False))
    assert plain != before  # the change shows in a scan without memo
    assert document(scanned(cache)) == plain
    assert document(scanned(cache)) == plain  # and in the report kept after it


def test_xla_subcaches_are_never_kept(cache: Path) -> None:
    _autotune_dir(cache)
    scanned(cache)
    assert not served(scanned(cache))


def test_other_code_jax_or_limit_is_not_served(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scanned(cache)
    assert served(scanned(cache))
    other_jax = JaxInfo("9.9.9", "9.9.9", True, True, None)
    got = scanned(cache, jax_info=other_jax)
    assert not served(got)
    assert document(got) == document(scanned(cache, jax_info=other_jax, use_index=False))
    assert "9.9.9" in document(got)
    assert not served(scanned(cache, max_decompressed=1 << 30))
    monkeypatch.setattr(index_file, "_PACKAGE_FINGERPRINT", b"other code")
    assert not served(scanned(cache))


def test_the_same_cache_by_another_spelling_is_not_served(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paths in the report are as given: another spelling makes its own report."""
    scanned(cache)
    link = tmp_path / "link-to-cache"
    link.symlink_to(cache)
    got = scanned(link)
    assert not served(got)
    assert all(e.path.startswith(str(link) + os.sep) for e in entries_of(got))
    monkeypatch.chdir(cache.parent)
    relative = scanned(Path(cache.name))
    assert not served(relative)
    assert entries_of(relative)[0].path.startswith(cache.name + os.sep)


def test_recent_changes_and_a_clock_set_back_are_not_served(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index, "RACY_S", 3600.0)  # the copy was made within it: may be in flight
    scanned(cache, now=time.time())
    assert not served(scanned(cache, now=time.time()))
    monkeypatch.setattr(index, "RACY_S", 2.0)
    scanned(cache, now=NOW)
    earlier = scanned(cache, now=NOW - 1000)
    assert not served(earlier) and earlier.scanned_at == NOW - 1000
    later = scanned(cache, now=NOW + 1000)
    assert served(later) and later.scanned_at == NOW + 1000


def test_a_young_truncated_entry_is_judged_again_when_it_comes_of_age(cache: Path) -> None:
    """Under a minute old, a truncated entry may be a write in progress (a warning); then it is
    corrupt (an error): a report kept while it was young is served until then, not after."""
    data = entry_files(cache)[0].read_bytes()
    cut = cache / f"jit_cut-{'c' * 64}{layout.CACHE_SUFFIX}"
    cut.write_bytes(data[: len(data) // 3])
    written = NOW - 10
    os.utime(cut, (written, written))

    def severity(report: ScanReport) -> Severity:
        return next(f.severity for f in report.findings if f.kind is FindingKind.CORRUPT)

    assert severity(scanned(cache)) is Severity.WARNING
    young = scanned(cache, now=written + RECENT_WRITE_S - 1)
    assert served(young) and severity(young) is Severity.WARNING
    grown = scanned(cache, now=written + RECENT_WRITE_S)
    assert not served(grown) and severity(grown) is Severity.ERROR
    plain = scanned(cache, now=written + RECENT_WRITE_S, use_index=False)
    assert document(grown) == document(plain)
    assert served(scanned(cache, now=NOW + 10_000))  # its verdict is final now: kept for good


def _memo_sql(cache: Path, sql: str) -> None:
    with sqlite3.connect(index_file.index_path(cache)) as db:
        assert db.execute(sql).rowcount == 1


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE memo SET body = replace(body, 'jit_gone', 'jit_fake')",  # checksum fails
        "UPDATE memo SET inputs = 'x' || inputs",
        "DELETE FROM memo",
    ],
)
def test_a_damaged_or_missing_memo_is_not_served(cache: Path, sql: str) -> None:
    plain = document(scanned(cache, use_index=False))
    scanned(cache)
    _memo_sql(cache, sql)
    got = scanned(cache)
    assert not served(got) and document(got) == plain


def test_a_memo_of_another_shape_is_not_served(cache: Path) -> None:
    scanned(cache)
    inputs = scanmemo.local_inputs(
        listdir.read_dir(cache),
        installed_jax(),
        reader.DEFAULT_MAX_DECOMPRESSED,
        NOW,
    )
    assert inputs is not None
    for body in ("[]", '{"scanned_at": 0}', '{"scanned_at": 0, "counts": [1, 2]}', "{"):
        memostore.write_memo(str(cache), (reader.DEFAULT_MAX_DECOMPRESSED,), inputs, body)
        assert not served(scanned(cache))  # and the scan keeps a good one again
        assert served(scanned(cache))


def test_disabled_with_the_index(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scanned(cache)
    monkeypatch.setenv(index_file.DISABLE_ENV, "1")
    assert not served(scanned(cache))
    monkeypatch.delenv(index_file.DISABLE_ENV)
    assert not served(scanned(cache, use_index=False))


def test_the_digest_depends_on_values_not_on_which_objects_hold_them(cache: Path) -> None:
    """Equal names and numbers held by other objects (every listing makes new ones) give the
    same digest; marshal's newer formats would write back-references where objects repeat."""
    import hashlib

    name, *facts = listdir.read_dir(cache).members[0]
    big = facts[3] + 10**9  # an mtime: an int no other object shares
    same_again = [(name, *facts[:3], big, *facts[4:])] * 3  # the same objects three times
    separate = [
        (copy, *facts[:3], big + offset - offset, *facts[4:])  # equal values, other objects
        for offset, copy in enumerate(["".join(name), name.encode().decode(), name + ""], 7)
    ]
    assert separate[0][0] is not separate[1][0] and separate[0][4] is not separate[1][4]
    digests = []
    for listing in (same_again, separate):
        h = hashlib.sha256()
        scanmemo._hash_members(h, cast(list[listdir.Member], listing))
        digests.append(h.hexdigest())
    assert digests[0] == digests[1]


def test_a_served_scan_without_entries_reads_only_the_listing_and_the_memo(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text report, lint and stats ask for no entries: a repeated scan then classifies no
    name and opens no index row; asking for them (the default) reads them before it returns."""
    kept = scanned(cache)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("read more than the listing and the memo")

    monkeypatch.setattr(listdir, "listing_of", refuse)
    monkeypatch.setattr(index, "load", refuse)
    text = scanned(cache, entries=False)
    assert served(text) and text.entries is None and text.other_files is None
    assert (text.summary, text.findings, text.modules) == (
        kept.summary,
        kept.findings,
        kept.modules,
    )
    with pytest.raises(AssertionError, match="read more than"):
        scanned(cache)
    with pytest.raises(ValueError, match="without its entries"):
        render_to_string(text, "json")


def test_a_folder_that_is_no_cache_is_told_also_when_served(tmp_path: Path) -> None:
    folder = tmp_path / "checkout"
    folder.mkdir()
    (folder / "README.md").write_text("a git checkout, not a cache")
    first = scanned(folder, entries=False)
    again = scanned(folder, entries=False)
    assert served(again) and not served(first)
    for report in (first, again):
        assert not report.looks_like_cache and report.other_file_count == 1


def test_a_stats_record_rewritten_in_place_is_seen(cache: Path) -> None:
    """not-stored says why from the stats records: a record changed in place (the folder's own
    times unchanged) must not serve the report made before it."""
    counters = dict.fromkeys(("requests", "misses", "refused_host_callbacks"), 1)
    record = {
        "format": "cachedoctor-stats/1",
        **{"host": "vm", "pid": 1, "start": 1.0, "end": 2.0, "jax": "0.10.2", "hook": "stats"},
        "modules": {"jit_gone": {**counters, "refused_host_callbacks": 0}},
    }
    path = cache / layout.STATS_DIRNAME / "20260101T000000-vm-1-abcdef01.json"
    path.parent.mkdir()
    path.write_text(json.dumps(record))
    old = time.time() - 3600
    os.utime(path, (old, old))
    os.utime(path.parent, (old, old))
    before = document(scanned(cache, use_index=False))
    scanned(cache)
    assert served(scanned(cache))
    folder = path.parent.stat()
    with open(path, "w") as fh:
        json.dump({**record, "modules": {"jit_gone": counters}}, fh)
    os.utime(path, (old, old))
    assert path.parent.stat().st_mtime_ns == folder.st_mtime_ns
    plain = document(scanned(cache, use_index=False))
    assert plain != before and "host-callbacks" in plain and "host-callbacks" not in before
    assert document(scanned(cache)) == plain
