"""The stats records are checked, not trusted as written (issue 29, item 8): a record whose
counters break how the recorder counts, and a file that is no record, are `stats-record`
findings naming the file and the rule, left out of the totals.

The records here are hand-made (adversarial input); tests/core/test_stats.py checks the same
rules against records written by real JAX processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.core.findings import FindingKind
from cachedoctor.core.stats import summarise
from cachedoctor.core.usage.records import read_records
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.stablekeys.stats import RECORD_FORMAT
from cachedoctor.storage.stores import open_store

GOOD = {"requests": 3, "hits": 2, "misses": 1, "writes": 1, "compile_secs": 0.25}


def record(**modules: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": RECORD_FORMAT,
        "host": "vm",
        "pid": 7,
        "start": 1_800_000_000.0,
        "end": 1_800_000_001.0,
        "jax": "0.10.2",
        "hook": "stats",
        "modules": modules,
    }


def write(cache: Path, name: str, doc: dict[str, Any] | str) -> None:
    folder = cache / STATS_DIRNAME
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))


def problems(cache: Path) -> dict[str, str]:
    """File name -> the finding's message, for each stats-record finding."""
    _, findings = read_records(open_store(cache))
    assert all(f.kind is FindingKind.STATS_RECORD for f in findings)
    return {f.entries[0].removeprefix(f"{STATS_DIRNAME}/"): f.message for f in findings}


@pytest.mark.parametrize(
    ("counters", "rule"),
    [
        ({"requests": 10, "hits": 20}, "hits 20 > requests 10"),
        ({"requests": 1, "misses": 2}, "misses 2 > requests 1"),
        ({"requests": 3, "hits": 2, "misses": 2}, "hits + misses 4 > requests 3"),
        ({"requests": -1}, "requests -1 is negative"),
        ({"writes": -2}, "writes -2 is negative"),
        ({"compile_secs": -1.5}, "compile_secs -1.5 is negative"),
        ({"retrieval_secs": -0.1}, "retrieval_secs -0.1 is negative"),
        ({"requests": 1.5}, "requests 1.5 is not a whole number"),
        ({"compile_secs": float("nan")}, "compile_secs NaN is not a finite number"),
        ({"saved_secs": float("inf")}, "saved_secs Infinity is not a finite number"),
        ({"hits": True}, "counter 'hits' is not a number"),
    ],
)
def test_a_record_that_breaks_a_rule_is_a_finding_and_left_out(
    tmp_path: Path, counters: dict[str, Any], rule: str
) -> None:
    write(tmp_path, "good.json", record(jit_g=GOOD))
    write(tmp_path, "bad.json", record(jit_g=GOOD, jit_bad=counters))
    found = problems(tmp_path)
    assert list(found) == ["bad.json"]
    assert "jit_bad" in found["bad.json"] and rule in found["bad.json"], found
    records, findings = read_records(open_store(tmp_path))
    report = summarise(str(tmp_path), records, findings, None)
    assert report.processes == 1
    assert (report.totals.requests, report.totals.hits) == (3, 2)
    assert report.totals.hit_rate is not None and report.totals.hit_rate <= 1


def test_what_the_recorder_writes_passes(tmp_path: Path) -> None:
    """Negative saved time is JAX's own (a module that loads slower than it compiles); a
    request still in flight at exit has neither hit nor miss yet."""
    write(tmp_path, "a.json", record(jit_g={**GOOD, "saved_secs": -0.02}))
    write(tmp_path, "b.json", record(jit_g={"requests": 2, "hits": 1, "misses": 0}))
    write(tmp_path, "c.json", record(jit_g={"requests": 1.0, "misses": 1}))  # integral float
    write(tmp_path, "archive-20260101T000000Z.jsonl", "{}\n")
    write(tmp_path, ".cachedoctor-tmp-123", "{")  # a record being written
    assert problems(tmp_path) == {}
    records, _ = read_records(open_store(tmp_path))
    assert len(records) == 3


def test_foreign_files_are_findings(tmp_path: Path) -> None:
    """docs/stats.md: a foreign file in cachedoctor-stats/ is a stats-record finding."""
    write(tmp_path, "good.json", record(jit_g=GOOD))
    write(tmp_path, "notes.txt", "my notes")
    write(tmp_path, "copy.json.bak", json.dumps(record(jit_g=GOOD)))
    (tmp_path / STATS_DIRNAME / "old").mkdir()
    found = problems(tmp_path)
    assert set(found) == {"notes.txt", "copy.json.bak", "old"}
    assert all("not a stats record" in m for m in found.values()), found
    assert "folder" in found["old"]
    records, _ = read_records(open_store(tmp_path))
    assert [r.file for r in records] == ["good.json"]


def test_a_module_whose_entries_do_not_decode_is_not_said_to_be_there(tmp_path: Path) -> None:
    """stats agrees with scan: a module whose only entry is undecodable never hit because JAX
    cannot load it, not for want of evidence while "the entry is there"."""
    from cachedoctor.cache import listdir
    from cachedoctor.cache.jaxenv import installed_jax
    from cachedoctor.cache.model import EntryInfo, Problem
    from cachedoctor.core.scan.build import build_report

    bad = EntryInfo(
        key="jit_bad-" + "1" * 64,
        module="jit_bad",
        path="/x/jit_bad-" + "1" * 64 + "-cache",
        size=0,
        mtime_ns=0,
        problems=(Problem("truncated", "empty file"),),
    )
    scan = build_report(listdir.list_cache(tmp_path), [bad], installed_jax(), now=1e9)
    assert [(m.module, m.entries, m.programs, m.undecodable) for m in scan.modules] == [
        ("jit_bad", 1, 0, 1)
    ]
    counters = {"requests": 1, "misses": 1, "writes": 1, "compile_secs": 0.1}
    for n in range(2):
        write(tmp_path, f"{n}.json", record(jit_bad=counters))
    records, findings = read_records(open_store(tmp_path))
    (row,) = summarise(str(tmp_path), records, findings, scan).modules
    assert row.never_hit and row.reason is not None
    assert row.reason.startswith("undecodable (the cache holds 1 entry of it"), row.reason


# --- per-key counts (issue 29: "stats records per key") -------------------------------------

KEYED = {**GOOD, "keys": {"jit_g-aa": {"lookups": 2, "hits": 1, "writes": 0}}}


@pytest.mark.parametrize(
    ("keys", "rule"),
    [
        ({"jit_g-aa": {"lookups": 1, "hits": -1}}, "hits -1 is negative (key jit_g-aa)"),
        ({"jit_g-aa": {"lookups": 1.5}}, "lookups 1.5 is not a whole number (key jit_g-aa)"),
        ({"jit_g-aa": {"lookups": 1, "hits": 2}}, "key jit_g-aa: hits 2 > lookups 1"),
        ({"jit_g-aa": {"lookups": 3, "hits": 2, "writes": 2}}, "hits + writes 4 > requests 3"),
        ({"jit_g-aa": {"lookups": 4}}, "keys' lookups 4 > requests 3"),
        ({"a": {"lookups": 2, "hits": 2}, "b": {"lookups": 1, "hits": 1}}, "keys' hits 3 > hits 2"),
        ({"a": {"lookups": 1, "writes": 1}, "b": {"lookups": 1, "writes": 1}}, "writes 2 > writes"),
        ({"jit_g-aa": {"hits": "1"}}, "counter 'hits' is not a number (key jit_g-aa)"),
        ({"jit_g-aa": 3}, "key 'jit_g-aa': counts are not an object"),
        (["jit_g-aa"], "keys are not an object"),
    ],
)
def test_per_key_counts_that_break_a_rule_are_a_finding(
    tmp_path: Path, keys: Any, rule: str
) -> None:
    write(tmp_path, "good.json", record(jit_g=KEYED))
    write(tmp_path, "bad.json", record(jit_g={**GOOD, "keys": keys}))
    found = problems(tmp_path)
    assert list(found) == ["bad.json"], found
    assert rule in found["bad.json"], found


def test_per_key_counts_sum_over_records_that_ended_after_a_write(tmp_path: Path) -> None:
    """Older records have no ``keys``; a key's hits count only in records that ended after
    the given time (the entry's write)."""
    from cachedoctor.core.usage.records import index_keys, key_use

    write(tmp_path, "old.json", record(jit_g=GOOD))
    write(tmp_path, "a.json", record(jit_g=KEYED))
    later = {**record(jit_g=KEYED), "start": 1_800_000_100.0, "end": 1_800_000_101.0}
    write(tmp_path, "b.json", later)
    records, findings = read_records(open_store(tmp_path))
    assert findings == [] and len(records) == 3
    index = index_keys(records)
    use = key_use(index, "jit_g-aa")
    assert use is not None and (use.lookups, use.hits, use.processes) == (4, 2, 2)
    assert use.last_hit_end == 1_800_000_101.0
    assert "2 hits by 2 processes, last at 2027-01-15 08:01:41 UTC" in use.evidence
    since = key_use(index, "jit_g-aa", ended_after=1_800_000_050.0)
    assert since is not None and (since.hits, since.processes) == (1, 1)
    assert key_use(index, "jit_g-aa", ended_after=1_800_000_200.0) is None
    assert key_use(index, "jit_g-bb") is None
