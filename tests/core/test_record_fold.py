"""The fold of an unchanged records folder (``core/usage/fold.py``, issue 26): a repeated
``stats`` or ``lint`` reads one row of the records index instead of every record, and prints the
same bytes; any change to the folder (a record rewritten in place, removed, added) is seen.

The records are those real hooked JAX processes wrote (``recorded_cache`` of
test_record_index.py: the seed program three times with ``CACHEDOCTOR_HOOK=stats``); hand-made
bytes only for a torn record and a foreign file. The oracle is the same command with
``CACHEDOCTOR_NO_INDEX`` set, which reads and adds up every file as before the index.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.cache import index, index_file, record_index
from cachedoctor.core.usage import fold, records
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.storage.stores import Store
from tests.support.caches import record_files
from tests.support.cli import invoke

COMMANDS = [
    ("stats", "--json"),
    ("lint", "--format", "json"),
    ("stats",),
    ("lint",),
    ("stats", "--json", "--module", "jit_*"),
    ("stats", "--json", "--since", "2000-01-01"),
]


@pytest.fixture
def folded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One item per time the records folder was read and added up (no fold served)."""
    seen: list[int] = []
    real = records.read_listed

    def counting(
        store: Store, listed: list[record_index.Listed], idx: record_index.RecordIndex | None
    ) -> records.FolderRead:
        seen.append(1)
        return real(store, listed, idx)

    monkeypatch.setattr(fold, "read_listed", counting)
    return seen


def run_all(
    cache: Path, monkeypatch: pytest.MonkeyPatch, *, use_index: bool
) -> list[tuple[int, str, str]]:
    if use_index:
        monkeypatch.delenv(index_file.DISABLE_ENV, raising=False)
    else:
        monkeypatch.setenv(index_file.DISABLE_ENV, "1")
    return [invoke(*command, str(cache)) for command in COMMANDS]


def stats_json(cache: Path) -> str:
    code, out, err = invoke("stats", "--json", str(cache))
    assert code == 0, err
    return out


def folds(cache: Path) -> int:
    with sqlite3.connect(index_file.side_path(cache, record_index.PART)) as db:
        return int(db.execute("SELECT count(*) FROM folds").fetchone()[0])


@pytest.mark.slow
def test_a_repeated_stats_and_lint_print_the_same_bytes_from_one_fold(
    recorded_cache: Path,
    copy_of,
    settled: None,
    folded: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = copy_of(recorded_cache)
    (cache / STATS_DIRNAME / "torn.json").write_bytes(b'{"format": "cachedoctor-stats/1", "mo')
    (cache / STATS_DIRNAME / "notes.txt").write_text("not a record")
    truth = run_all(cache, monkeypatch, use_index=False)
    assert len(folded) == len(COMMANDS)
    assert all(code in (0, 1) for code, _, _ in truth)
    assert "torn.json" in truth[0][1] and "notes.txt" in truth[0][1]
    folded.clear()
    assert run_all(cache, monkeypatch, use_index=True) == truth  # first: folds kept
    assert len(folded) == 3  # once per options (none, --module, --since): stats and lint alike
    assert folds(cache) == 3  # one per options: none, --module, --since
    folded.clear()
    assert run_all(cache, monkeypatch, use_index=True) == truth  # repeated: every one served
    assert folded == []


@pytest.mark.slow
def test_a_fold_is_never_served_once_the_folder_changed(
    recorded_cache: Path,
    copy_of,
    settled: None,
    folded: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = copy_of(recorded_cache)
    first, second, third = record_files(cache)
    before = stats_json(cache)
    assert stats_json(cache) == before and len(folded) == 1  # the fold served
    # rewritten in place, same size and mtime (within a timestamp tick): only ctime tells
    data = first.read_bytes()
    host = json.loads(data)["host"]
    other = host[:-1] + ("x" if host[-1] != "x" else "y")
    changed = data.replace(f'"host": "{host}"'.encode(), f'"host": "{other}"'.encode())
    assert len(changed) == len(data) and changed != data
    st = first.stat()
    first.write_bytes(changed)
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert first.stat().st_mtime_ns == st.st_mtime_ns
    steps: list[Callable[[], object]] = [
        lambda: None,  # the rewrite above
        second.unlink,  # removed
        lambda: shutil.copy2(third, third.with_name("added-" + third.name)),  # added
    ]
    seen = [before]
    for step in steps:
        step()
        folded.clear()
        now = stats_json(cache)
        assert folded == [1]  # read again, not served
        monkeypatch.setenv(index_file.DISABLE_ENV, "1")
        assert now == stats_json(cache)  # what reading every record says
        monkeypatch.delenv(index_file.DISABLE_ENV)
        assert now not in seen
        seen.append(now)
    assert other in {h["name"] for h in json.loads(seen[-1])["hosts"]}


@pytest.mark.slow
def test_no_fold_is_kept_while_a_record_may_still_be_written(
    recorded_cache: Path,
    copy_of,
    folded: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every file was copied a moment ago: within ``RACY_S`` of an hour, each may still change
    within one timestamp tick, so the folder's listing names no content and no fold is kept."""
    monkeypatch.setattr(index, "RACY_S", 3600.0)
    cache = copy_of(recorded_cache)
    assert stats_json(cache) == stats_json(cache)
    assert len(folded) == 2
    path = index_file.side_path(cache, record_index.PART)
    assert not path.exists() or folds(cache) == 0
