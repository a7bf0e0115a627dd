"""Why a module is not cached (issue 29, items 2-4): JAX's own reason, with its evidence, and the
same one from ``scan`` (not-stored), ``stats`` and ``lint`` (never-hit).

JAX is the oracle: with ``JAX_EXPLAIN_CACHE_MISSES=1`` it logs each refusal ("Not writing
persistent cache entry for 'M' because it uses host callbacks", "... because it took < ...") and
each write ("Writing M to persistent compilation cache"), and warns on each failed put ("Error
writing persistent compilation cache entry for 'M'"; its LRU: "exceeds the maximum cache size").
The records must count exactly those, and every command must name the same reason.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.core.findings import FindingKind
from cachedoctor.core.usage import reasons
from cachedoctor.core.usage.model import Counters
from cachedoctor.core.usage.reasons import ModuleEvidence, ReasonKind
from cachedoctor.core.usage.validate import parse_record
from cachedoctor.layout import STATS_DIRNAME
from tests.support.cli import invoke
from tests.support.hookrun import base_env, compat_params, entries

PROGRAM = Path(__file__).resolve().parents[1] / "support" / "callbacks_program.py"
CALLBACKS_RE = re.compile(
    r"Not writing persistent cache entry for '([^']+)' because it uses host callbacks"
)
TOO_FAST_RE = re.compile(r"Not writing persistent cache entry for '([^']+)' because it took <")
WRITING_RE = re.compile(r"Writing (\S+) to persistent compilation cache with key")
WRITTEN_KEY_RE = re.compile(r"Writing \S+ to persistent compilation cache with key '([^']+)'")
ERROR_RE = re.compile(r"Error writing persistent compilation cache entry for '([^']+)'")
TOO_LARGE_RE = re.compile(r"Cache value for key '([^']+)-[0-9a-f]{64}' of size \d+ bytes exceeds")


# this venv's JAX (0.10) and each compat interpreter (0.12 refuses no host callbacks)
PYTHONS = [pytest.param(sys.executable, id="this-jax"), *compat_params()]


def run(
    cache: Path, *functions: str, mode: str = "stable", python: str = sys.executable, **env: str
) -> str:
    """The callbacks program with the start-up hook; JAX's log (stderr)."""
    proc = subprocess.run(
        [python, str(PROGRAM), *functions],
        capture_output=True,
        text=True,
        env=base_env(cache, CACHEDOCTOR_HOOK=mode, **env),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cachedoctor:" not in proc.stderr, proc.stderr[-3000:]  # the recorder stayed quiet
    return proc.stderr


def cli_json(*args: str) -> dict[str, Any]:
    """A command's JSON as the console script prints it, run in this process (a fresh
    interpreter per call cost 0.4 s of CPU and checked nothing more)."""
    code, out, err = invoke(*args)
    assert code in (0, 1), err
    assert "Traceback" not in err
    return json.loads(out)  # type: ignore[no-any-return]


def record_counts(cache: Path, counter: str) -> Counter[str]:
    """One counter of every record, per module, read from the files as written."""
    total: Counter[str] = Counter()
    for path in (cache / STATS_DIRNAME).glob("*.json"):
        for module, c in json.loads(path.read_text())["modules"].items():
            total[module] += c.get(counter, 0)
    return +total


def verdicts(cache: Path) -> dict[str, dict[str, str]]:
    """Module -> {command: reason kind} from scan's not-stored, stats' rows and lint's never-hit."""
    said: dict[str, dict[str, str]] = {}
    for f in cli_json("scan", str(cache), "--json")["findings"]:
        if f["kind"] == "not-stored":
            kind = re.search(r"without an entry \(([\w-]+):", f["message"]).group(1)  # type: ignore[union-attr]
            for module in f["message"].rsplit("): ", 1)[1].split(", "):
                said.setdefault(module, {})["scan"] = kind
    for m in cli_json("stats", str(cache), "--json")["modules"]:
        if m["never_hit"]:
            said.setdefault(m["module"], {})["stats"] = m["reason_kind"]
    for f in cli_json("lint", str(cache), "--format", "json")["findings"]:
        if f["kind"] == "never-hit":
            kind = f["evidence"].split("requests and no hit; ", 1)[1].split(":", 1)[0]
            said.setdefault(f["module"], {})["lint"] = kind
    return said


@pytest.mark.slow
def test_host_callbacks_are_named_as_jax_logs_them(tmp_path: Path) -> None:
    """jax.debug.print, pure_callback, io_callback: JAX refuses them; every command says so."""
    cache = tmp_path / "cache"
    cache.mkdir()
    logs = [run(cache, "printing", "pure", "io", "plain", mode="stable") for _ in range(3)]
    refused = Counter(m for log in logs for m in CALLBACKS_RE.findall(log))
    callbacks = {"jit_printing", "jit_pure", "jit_io"}
    if not refused:  # a JAX that stores host callbacks (0.12): written once each, then hit
        written = Counter(m for log in logs for m in WRITING_RE.findall(log))
        assert {m: written[m] for m in callbacks} == dict.fromkeys(callbacks, 1), logs[0][-3000:]
        assert not record_counts(cache, "refused_host_callbacks")
        assert not callbacks & set(verdicts(cache))
        return
    assert set(refused) == callbacks, logs[0][-3000:]
    assert record_counts(cache, "refused_host_callbacks") == refused
    assert not record_counts(cache, "refused_compile_time")

    said = verdicts(cache)
    for module in refused:
        assert said[module] == dict.fromkeys(("scan", "stats", "lint"), "host-callbacks"), said
    assert "jit_plain" not in said  # written once, then hit
    report = cli_json("stats", str(cache), "--json")
    row = next(m for m in report["modules"] if m["module"] == "jit_io")
    assert "uses host callbacks" in row["reason_evidence"]
    assert "min_compile_time" not in row["reason"] and "too fast" not in row["reason"]
    lint = cli_json("lint", str(cache), "--format", "json")["findings"]
    advice = [f["advice"] for f in lint if f["kind"] == "never-hit"]
    assert len(advice) == 3 and not any("diff --module" in a for a in advice), advice


@pytest.mark.slow
def test_a_module_jax_wrote_and_its_lru_evicted_is_evicted_everywhere(tmp_path: Path) -> None:
    """JAX_COMPILATION_CACHE_MAX_SIZE holds one entry: each write evicts the other module."""
    cache = tmp_path / "cache"
    cache.mkdir()
    logs = [run(cache, "plain", "other", JAX_COMPILATION_CACHE_MAX_SIZE="4000") for _ in range(3)]
    written = Counter(m for log in logs for m in WRITING_RE.findall(log))
    assert written == {"jit_plain": 3, "jit_other": 3}, logs[0][-3000:]
    assert not any(ERROR_RE.search(log) or TOO_LARGE_RE.search(log) for log in logs)
    assert record_counts(cache, "writes") == written  # each put left its entry
    assert (cache / ".lockfile").exists()
    held = {k.rsplit("-", 1)[0] for k in entries(cache)}
    gone = set(written) - held
    assert len(gone) == 1, held  # the LRU kept the last one written

    said = verdicts(cache)
    (module,) = gone
    assert said[module] == dict.fromkeys(("scan", "stats", "lint"), "evicted-by-lru"), said
    (kept,) = held  # its entry is there, but JAX wrote the same key 3 times: evicted twice
    keys = Counter(k for log in logs for k in WRITTEN_KEY_RE.findall(log) if k.startswith(kept))
    assert list(keys.values()) == [3] and entries(cache, kept) == list(keys), keys
    assert said[kept] == dict.fromkeys(("stats", "lint"), "evicted-by-lru"), said
    kept_row = next(
        m for m in cli_json("stats", str(cache), "--json")["modules"] if m["module"] == kept
    )
    assert "3 writes whose entry existed afterwards" in kept_row["reason_evidence"]
    assert "the cache holds 1 entry of it now: 2 written and gone" in kept_row["reason_evidence"]
    report = cli_json("stats", str(cache), "--json")
    row = next(m for m in report["modules"] if m["module"] in gone)
    assert "jax_compilation_cache_max_size = 4000" in row["reason_evidence"]
    assert "-atime files" in row["reason_evidence"]


@pytest.mark.slow
def test_a_failed_put_is_no_write_and_never_evicted(tmp_path: Path) -> None:
    """Entries without -atime files, then LRU on: JAX 0.10's eviction pass raises in every put."""
    cache = tmp_path / "cache"
    cache.mkdir()
    run(cache, "plain")  # no max size: an entry without an -atime file
    logs = [run(cache, "other", JAX_COMPILATION_CACHE_MAX_SIZE="100000000") for _ in range(3)]
    failed = Counter(m for log in logs for m in ERROR_RE.findall(log))
    if not failed and WRITING_RE.findall(logs[0]) == ["jit_other"]:
        pytest.skip("this JAX's LRU takes an entry without its -atime file as least recently used")
    assert failed == {"jit_other": 3}, logs[0][-3000:]
    assert record_counts(cache, "write_failures") == failed
    assert "jit_other" not in record_counts(cache, "writes")
    assert not entries(cache, "jit_other")

    report = cli_json("stats", str(cache), "--json")
    assert report["totals"]["writes"] == 1  # jit_plain's, the only entry JAX wrote
    said = verdicts(cache)
    assert said["jit_other"] == dict.fromkeys(("scan", "stats", "lint"), "write-failed"), said
    row = next(m for m in report["modules"] if m["module"] == "jit_other")
    assert "evicted" not in row["reason"]
    assert "Error writing persistent compilation cache entry for 'jit_other'" in row["reason"]
    assert "more entries than -atime files" in row["reason_evidence"]


@pytest.mark.slow
def test_an_entry_over_the_lru_limit_is_lost_not_written(tmp_path: Path) -> None:
    """JAX's LRU drops an entry larger than its max size with a warning, after the write event."""
    cache = tmp_path / "cache"
    cache.mkdir()
    logs = [run(cache, "plain", JAX_COMPILATION_CACHE_MAX_SIZE="1000") for _ in range(3)]
    dropped = Counter(m for log in logs for m in TOO_LARGE_RE.findall(log))
    assert dropped == {"jit_plain": 3}, logs[0][-3000:]
    assert record_counts(cache, "writes_lost") == dropped
    assert not record_counts(cache, "writes")
    said = verdicts(cache)
    assert said["jit_plain"] == dict.fromkeys(("scan", "stats", "lint"), "write-failed"), said
    report = cli_json("stats", str(cache), "--json")
    row = next(m for m in report["modules"] if m["module"] == "jit_plain")
    assert "jax_compilation_cache_max_size = 1000" in row["reason_evidence"]


@pytest.mark.slow
def test_under_the_minimum_compile_time_quotes_the_setting(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    logs = [run(cache, "plain", mode="stats", CALLBACKS_MIN_COMPILE_SECS="30") for _ in range(3)]
    too_fast = Counter(m for log in logs for m in TOO_FAST_RE.findall(log))
    assert too_fast == {"jit_plain": 3}, logs[0][-3000:]
    assert record_counts(cache, "refused_compile_time") == too_fast
    report = cli_json("stats", str(cache), "--json")
    row = next(m for m in report["modules"] if m["module"] == "jit_plain")
    assert row["reason_kind"] == "under-min-compile-time"
    assert "jax_persistent_cache_min_compile_time_secs = 30 in the records" in row["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("python", PYTHONS)
def test_host_callbacks_get_the_reason_jax_logged(tmp_path: Path, python: str) -> None:
    """Under a minimum compile time JAX <= 0.10 refuses a host-callback module for its
    callbacks, 0.12 for its compile time (it stores host callbacks): the records and every
    command give the reason JAX's own log gives, on each JAX."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {"CALLBACKS_MIN_COMPILE_SECS": "30"}
    logs = [run(cache, "printing", "plain", python=python, **env) for _ in range(3)]
    callbacks = Counter(m for log in logs for m in CALLBACKS_RE.findall(log))
    too_fast = Counter(m for log in logs for m in TOO_FAST_RE.findall(log))
    assert callbacks + too_fast == {"jit_printing": 3, "jit_plain": 3}, logs[0][-3000:]
    assert record_counts(cache, "refused_host_callbacks") == callbacks
    assert record_counts(cache, "refused_compile_time") == too_fast

    said = verdicts(cache)
    jaxs = {m: "host-callbacks" for m in callbacks} | {
        m: "under-min-compile-time" for m in too_fast
    }
    for module, kind in jaxs.items():
        assert said[module] == dict.fromkeys(("scan", "stats", "lint"), kind), said
    row = next(
        m
        for m in cli_json("stats", str(cache), "--json")["modules"]
        if m["module"] == "jit_printing"
    )
    quoted = "uses host callbacks" if callbacks else "because it took < ... seconds to compile"
    assert quoted in row["reason_evidence"] and "jit_printing" in row["reason_evidence"], row

    # without a minimum compile time: written by the JAX that stores host callbacks, else refused
    bare = tmp_path / "bare"
    bare.mkdir()
    logs = [run(bare, "printing", mode="stats", python=python) for _ in range(2)]
    written = Counter(m for log in logs for m in WRITING_RE.findall(log))
    refused = Counter(m for log in logs for m in CALLBACKS_RE.findall(log))
    assert written + refused == {"jit_printing": 1 if written else 2}, logs[0][-3000:]
    assert bool(written) == (not callbacks)  # one JAX, one behaviour
    assert record_counts(bare, "writes") == written
    assert record_counts(bare, "refused_host_callbacks") == refused


@pytest.mark.slow
def test_a_stable_hooked_cache_is_never_told_to_turn_stable_keys_off(tmp_path: Path) -> None:
    """Stable keys on, the records archived: no reason is known, and the advice is to run with
    the hook again (it records), never `enable --stats-only`; followed, it gives JAX's reason."""
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {"CALLBACKS_MIN_COMPILE_SECS": "30"}
    run(cache, "plain", mode="stable", **env)
    archived = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "stats", str(cache), "--zero", "--apply"],
        capture_output=True,
        text=True,
        env=base_env(None),
        timeout=300,
    )
    assert archived.returncode == 0, archived.stderr
    findings = cli_json("scan", str(cache), "--json")["findings"]
    (found,) = [f for f in findings if f["kind"] == "not-stored"]
    assert "(unknown:" in found["message"] and "jit_plain" in found["message"], found
    assert "stable mode" in found["evidence"], found
    assert "stats-only" not in found["advice"] + found["evidence"], found
    assert "run it again with the hook on" in found["advice"], found

    log = run(cache, "plain", mode="stable", **env)  # the advice, followed
    assert TOO_FAST_RE.findall(log) == ["jit_plain"], log[-3000:]
    assert verdicts(cache)["jit_plain"]["scan"] == "under-min-compile-time"


# --- without JAX: records of older cachedoctors, and the rule on evidence -----------------------

OLD_RECORD = {  # as cachedoctor wrote it before outcomes: "writes" was JAX's write event
    "format": "cachedoctor-stats/1",
    "host": "vm",
    "pid": 1,
    "start": 1796075058.06,
    "end": 1796075058.43,
    "jax": "0.10.2",
    "hook": "stats",
    "modules": {
        "jit_f": {
            "requests": 3,
            "hits": 0,
            "misses": 3,
            "writes": 3,
            "compile_secs": 0.06,
            "saved_secs": 0,
            "retrieval_secs": 0,
        }
    },
}


def test_an_older_record_reads_and_its_writes_are_unchecked() -> None:
    record = parse_record("old.json", json.dumps(OLD_RECORD).encode())
    c = record.modules["jit_f"]
    assert c.writes == 3 and c.unchecked_writes == 3 and c.checked_writes == 0
    assert record.config == {}
    why = reasons.explain(ModuleEvidence("jit_f", c, 3, held=False, lru=".lockfile"))
    assert why.kind is ReasonKind.UNKNOWN  # evicted, removed or failed: the record cannot tell


def test_no_reason_without_evidence() -> None:
    """Misses without a recorded outcome, or no record at all: unknown, never a guess."""
    for ev in (
        ModuleEvidence("jit_f", Counters(requests=2, misses=2), 2, held=False),
        ModuleEvidence("jit_f", None, 0, held=False, lru="3 -atime files"),
    ):
        assert reasons.explain(ev).kind is ReasonKind.UNKNOWN


def test_written_and_gone_is_evicted_only_with_the_lru_in_use() -> None:
    c = Counters(requests=2, misses=2, writes=2)
    lru = ModuleEvidence("jit_f", c, 2, held=False, lru="2 -atime files")
    assert reasons.explain(lru).kind is ReasonKind.EVICTED_BY_LRU
    no_lru = ModuleEvidence("jit_f", c, 2, held=False)
    assert reasons.explain(no_lru).kind is ReasonKind.REMOVED
    held = ModuleEvidence("jit_f", c, 2, held=True, scan_kind=FindingKind.UNSTABLE_KEY)
    assert reasons.explain(held).kind is ReasonKind.UNSTABLE_KEY


def test_fewer_entries_held_than_written_is_evicted_only_with_the_lru_in_use() -> None:
    c = Counters(requests=3, misses=3, writes=3)
    lru = ModuleEvidence("jit_f", c, 3, held=True, lru="1 -atime files", entries=1)
    assert reasons.explain(lru).kind is ReasonKind.EVICTED_BY_LRU
    for ev in (
        ModuleEvidence("jit_f", c, 3, held=True, entries=1),  # no LRU: no guess
        ModuleEvidence("jit_f", c, 3, held=True, lru="3 -atime files", entries=3),
        ModuleEvidence("jit_f", c, 3, held=True, lru="1 -atime files"),  # entries not counted
    ):
        assert reasons.explain(ev).kind is ReasonKind.UNKNOWN, ev
    unstable = ModuleEvidence(
        "jit_f",
        c,
        3,
        held=True,
        lru="1 -atime files",
        entries=1,
        scan_kind=FindingKind.UNSTABLE_KEY,
    )
    assert reasons.explain(unstable).kind is ReasonKind.UNSTABLE_KEY  # the key, not the LRU


def test_a_stable_hooked_module_is_not_told_to_enable_stable_keys() -> None:
    c = Counters(requests=3, misses=3, writes=3)
    for hooked, enable in ((None, True), ("observe", True), ("stable", False)):
        why = reasons.explain(ModuleEvidence("jit_f", c, 3, held=True, entries=3, hooked=hooked))
        assert why.kind is ReasonKind.UNKNOWN
        assert ("`cachedoctor enable`" in reasons.advice(why, "jit_f")) is enable, hooked
    for hooked in ("stable", "observe"):
        why = reasons.explain(ModuleEvidence("jit_f", None, 0, held=False, hooked=hooked))
        assert "stats-only" not in reasons.advice(why, "jit_f") + why.evidence, hooked
