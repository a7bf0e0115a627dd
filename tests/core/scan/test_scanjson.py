"""`scan --json` of an unchanged cache writes the text of its document's long parts (modules,
entries, findings, files) kept beside the scan memo (``cache/memostore.py``), reading no entry:
the document is byte for byte the one a scan without index or memo prints, bar ``scanned_at``
(the time of the scan, docs/json-schema.md).

The oracle is the command itself with ``CACHEDOCTOR_NO_INDEX=1`` (no index, no memo, every entry
decoded and serialised) on the same cache, written by JAX with LRU eviction on (``-atime`` files
and a ``.lockfile`` in ``files``), with a truncated entry (a finding) and a file that is not
JAX's.
"""

from __future__ import annotations

import io
import os
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from cachedoctor import layout
from cachedoctor.cache import index, index_file, listdir, parallel, reader
from cachedoctor.core.scan import run
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.render.formats import render_to_string, renderer, scan_parts
from cachedoctor.render.jsonout import iter_scan_json
from cachedoctor.storage.location import Location
from tests.support.cli import invoke

pytestmark = pytest.mark.slow  # every test here uses a cache JAX wrote

NOW = 2_000_000_000.0  # every file of the fixture is older than a minute at this "now"
PARTS = {"modules", "entries", "findings", "files"}
_SCANNED_AT = re.compile(r'\n  "scanned_at": [0-9.e+]+,\n')


@pytest.fixture(autouse=True)
def _private_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(index_file.DISABLE_ENV, raising=False)
    monkeypatch.setattr(index, "RACY_S", 0.0)  # copies were just made: keep them anyway
    monkeypatch.setenv(parallel.WORKERS_ENV, "1")


@pytest.fixture
def cache(evict_cache: Path, copy_of: Callable[[Path], Path]) -> Path:
    root = copy_of(evict_cache)
    first = sorted(root.glob("*" + layout.CACHE_SUFFIX))[0]
    cut = root / f"jit_cut-{'c' * 64}{layout.CACHE_SUFFIX}"
    cut.write_bytes(first.read_bytes()[: first.stat().st_size // 3])
    os.utime(cut, (1_700_000_000, 1_700_000_000))  # long written: a final verdict (corrupt)
    (root / "notes.txt").write_text("not JAX's")
    return root


def scan_json(root: Path, *args: str) -> str:
    """``scan --json`` of ``root`` as the console script prints it, without ``scanned_at``."""
    code, out, err = invoke("scan", "--json", str(root), *args)
    assert code in (0, 1) and err == "", err
    assert len(_SCANNED_AT.findall(out)) == 1, out[:300]
    return _SCANNED_AT.sub("\n", out)


def without_index(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    with monkeypatch.context() as m:
        m.setenv(index_file.DISABLE_ENV, "1")
        return scan_json(root, *args)


def kept_parts(root: Path) -> set[str]:
    with sqlite3.connect(index_file.index_path(root)) as db:
        return {k for (k,) in db.execute("SELECT k FROM memo_text")}


def refuse_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, a scan that reads an index row, classifies the listing or decodes an
    entry fails."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("read the entries")

    monkeypatch.setattr(index, "load", refuse)
    monkeypatch.setattr(listdir, "listing_of", refuse)
    monkeypatch.setattr(reader, "decode_entry", refuse)


def test_repeated_scan_json_writes_the_kept_text_and_is_the_scan(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = without_index(cache, monkeypatch)
    assert '"kind": "atime"' in plain and '"notes.txt"' in plain and '"jit_cut"' in plain
    assert scan_json(cache) == plain  # decodes everything, keeps the memo and its text
    assert kept_parts(cache) == PARTS
    refuse_entries(monkeypatch)
    assert scan_json(cache) == plain
    assert scan_json(cache) == plain


def test_ignore_drops_the_kept_findings_text_only_when_it_drops_a_finding(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds = re.findall(
        r'\n      "kind": "([a-z-]+)",\n      "severity"', without_index(cache, monkeypatch)
    )
    assert "corrupt" in kinds
    plain = without_index(cache, monkeypatch, "--ignore", "corrupt")
    absent = without_index(cache, monkeypatch, "--ignore", "mixed-platforms")
    assert plain != absent
    scan_json(cache)
    refuse_entries(monkeypatch)
    assert scan_json(cache, "--ignore", "corrupt") == plain
    assert scan_json(cache, "--ignore", "mixed-platforms") == absent


def test_a_text_scan_keeps_no_text_and_the_first_json_scan_keeps_it(
    cache: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[str]
) -> None:
    """The text report reads no entry, so keeps no JSON text; the first `scan --json` served
    that memo reads the entries from the index (decoding none) and keeps the text."""
    plain = without_index(cache, monkeypatch)
    code, _, err = invoke("scan", str(cache))
    assert code in (0, 1) and err == ""
    assert kept_parts(cache) == set()
    decodes.clear()
    assert scan_json(cache) == plain
    assert decodes == [] and kept_parts(cache) == PARTS
    refuse_entries(monkeypatch)
    assert scan_json(cache) == plain


def _flip_a_byte(db: sqlite3.Connection) -> None:
    (body,) = db.execute("SELECT body FROM memo_text WHERE k = 'entries'").fetchone()
    middle = len(body) // 2
    damaged = body[:middle] + bytes([body[middle] ^ 0x55]) + body[middle + 1 :]
    db.execute("UPDATE memo_text SET body = ? WHERE k = 'entries'", (damaged,))


def _sql(statement: str) -> Callable[[sqlite3.Connection], None]:
    def run(db: sqlite3.Connection) -> None:
        assert db.execute(statement).rowcount == 1

    return run


@pytest.mark.parametrize(
    "damage",
    [
        _flip_a_byte,
        _sql("UPDATE memo_text SET checksum = zeroblob(16) WHERE k = 'files'"),
        _sql("UPDATE memo_text SET inputs = 'x' || inputs WHERE k = 'findings'"),
        _sql("DELETE FROM memo_text WHERE k = 'modules'"),
    ],
    ids=["byte-flipped", "checksum", "inputs", "missing"],
)
def test_damaged_or_missing_kept_text_is_never_written(
    cache: Path, monkeypatch: pytest.MonkeyPatch, damage: Callable[[sqlite3.Connection], None]
) -> None:
    plain = without_index(cache, monkeypatch)
    scan_json(cache)
    with sqlite3.connect(index_file.index_path(cache)) as db:
        damage(db)
    assert scan_json(cache) == plain  # from the index rows; the text kept again
    refuse_entries(monkeypatch)
    assert scan_json(cache) == plain


def test_no_text_is_kept_while_the_memo_is_not(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = without_index(cache, monkeypatch)
    monkeypatch.setattr(index, "RACY_S", 1e10)  # every file "just written": no memo is kept
    assert scan_json(cache) == plain
    assert kept_parts(cache) == set()


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_the_kept_text_as_bytes_or_as_text_is_the_document(
    cache: Path, encoding: str, decodes: list[str]
) -> None:
    """The JSON writer writes kept text as bytes under a stream that writes ASCII as it is, and
    as text elsewhere (another encoding, a ``StringIO``): the same document either way."""
    plain = "".join(iter_scan_json(scan_directory(Location.parse(cache), now=NOW, use_index=False)))
    first = run.scan_json(Location.parse(cache), scan_parts(), now=NOW)
    decodes.clear()
    again = run.scan_json(Location.parse(cache), scan_parts(), now=NOW)
    assert first.kept is not None and again.kept is not None and decodes == []
    assert again.report.entries is None and again.report.other_files is None
    assert "".join(iter_scan_json(again)) == plain
    assert render_to_string(again, "json") == plain + "\n"
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding)
    renderer("json").render(again, Console(file=stream))
    stream.flush()
    assert raw.getvalue().decode(encoding) == plain + "\n"
