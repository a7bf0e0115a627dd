"""Damage only JAX's own parser sees: a load JAX refused, kept by the stats recorder, is the
evidence that makes an entry ``corrupt`` and lets ``prune --corrupt`` remove it. JAX's log is
the oracle: the warning it prints when its load fails, and its hits and misses afterwards."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import zstandard

from cachedoctor.core.usage.load_failures import proven_failures
from cachedoctor.core.usage.model import LoadFailure, Record, make_key_counts
from cachedoctor.formats import wire
from tests.support.cli import invoke
from tests.support.hookrun import MISS_RE, run_recorded

JAX_READ_ERROR = "Error reading persistent compilation cache entry for 'jit_g'"


def break_buffer_assignment(data: bytes) -> bytes:
    """The entry with one byte of its CPU executable's buffer assignment made a tag of a wire
    type protobuf does not have: the reader walks past that message, XLA's parser refuses it
    ("Failed to parse serialized CpuAotCompilationResult")."""
    raw = bytearray(zstandard.ZstdDecompressor().decompress(data))
    body = memoryview(raw)[4:]  # JAX's compile time, then the PJRT executable
    length, at = wire.read_varint(body, 0, len(body))
    start = at + length if b"pjrt_ifrt" in bytes(body[at : at + length]) else 0
    executable = next(v for n, _wt, v in wire.field_list(body[start:]) if n == 1)
    assert isinstance(executable, memoryview)
    assignment = bytes(next(v for n, _wt, v in wire.field_list(executable) if n == 2))
    where = bytes(raw).find(assignment)
    assert where > 0 and bytes(raw).count(assignment) == 1
    raw[where] = (raw[where] & 0xF8) | 7
    return zstandard.ZstdCompressor().compress(bytes(raw))


def _corrupt(cache: Path) -> dict[str, str]:
    code, out, err = invoke("scan", "--json", str(cache))
    assert code in (0, 1), err
    found = json.loads(out)["findings"]
    return {k: f["evidence"] for f in found if f["kind"] == "corrupt" for k in f["entries"]}


def _entry(cache: Path) -> Path:
    (entry,) = cache.glob("jit_g-*-cache")
    return entry


@pytest.fixture
def refused(tmp_path: Path) -> tuple[Path, Path, str]:
    """A cache of the plain program whose ``jit_g`` entry JAX refuses and cachedoctor's reader
    does not (the premise, checked), after one run with the stats recorder; the healthy bytes
    kept beside it; JAX's log of that run."""
    cache = tmp_path / "cache"
    run_recorded(cache, "stats", "plain")
    entry = _entry(cache)
    healthy = tmp_path / "healthy"
    healthy.write_bytes(entry.read_bytes())
    entry.write_bytes(break_buffer_assignment(healthy.read_bytes()))
    before = time.time() - 60  # written well before the run that reads it
    os.utime(entry, (before, before))
    assert _corrupt(cache) == {}, "the premise: the reader sees nothing wrong"
    log = run_recorded(cache, "stats", "plain")
    assert JAX_READ_ERROR in log, "the premise: JAX refuses the entry"
    return cache, healthy, log


@pytest.mark.slow
def test_a_load_jax_refused_is_corrupt_and_prune_removes_it(
    refused: tuple[Path, Path, str],
) -> None:
    cache, _healthy, log = refused
    key = _entry(cache).name.removesuffix("-cache")
    found = _corrupt(cache)
    assert list(found) == [key]
    said = log.split(JAX_READ_ERROR + ": ", 1)[1].splitlines()[0]  # JAX's own words
    assert said.split(": ", 1)[1] in found[key], (said, found[key])
    code, out, err = invoke("prune", "--corrupt", "--json", str(cache))
    assert code == 0, err
    plan = json.loads(out)
    assert [a["name"] for a in plan["actions"] if a["op"] == "remove-entry"] == [key]
    code, _out, err = invoke("prune", "--corrupt", "--apply", str(cache))
    assert code == 0, err
    assert not (cache / f"{key}-cache").exists()
    again = run_recorded(cache, "stats", "plain")
    assert JAX_READ_ERROR not in again
    assert MISS_RE.findall(again) == ["jit_g"], "compiled once more, and stored"
    assert MISS_RE.findall(run_recorded(cache, "stats", "plain")) == [], "then it hits"


@pytest.mark.slow
def test_a_file_replaced_since_the_failure_is_no_evidence(refused: tuple[Path, Path, str]) -> None:
    """The failure holds the file's size, mtime and inode: the healthy bytes put back (another
    file now) are judged on their own, and JAX hits them."""
    cache, healthy, _log = refused
    entry = _entry(cache)
    entry.unlink()
    shutil.copyfile(healthy, entry)
    assert _corrupt(cache) == {}
    assert MISS_RE.findall(run_recorded(cache, "stats", "plain")) == []


# --- what a failure proves, rule by rule --------------------------------------------------------

KEY = "jit_g-" + "ab" * 32
FILE = (4436, 1_700_000_000 * 10**9, 99)  # size, mtime_ns, inode as listed now


def _record(
    *,
    start: float = 1_700_000_100.0,
    error: str = "JaxRuntimeError",
    message: str = "INTERNAL: Failed to parse serialized CpuAotCompilationResult.",
    file: tuple[int, int, int] | None = FILE,
    hits: int = 0,
    name: str = "r1.json",
) -> Record:
    size, mtime_ns, ino = file if file is not None else (None, None, None)
    failures = {}
    if error:
        failures[KEY] = LoadFailure(KEY, "jit_g", start + 5, error, message, size, mtime_ns, ino)
    keys = {KEY: make_key_counts((1, hits, 0))} if hits else {}
    return Record(
        name, "host", 1, start, start + 9, "0.10.2", "stats", {}, keys=keys, load_failures=failures
    )


def test_a_refused_load_of_the_whole_file_there_proves_it() -> None:
    assert list(proven_failures([_record()], {KEY: FILE})) == [KEY]


@pytest.mark.parametrize(
    ("why", "records", "files"),
    [
        ("the file changed since", [_record()], {KEY: (FILE[0], FILE[1] + 1, FILE[2])}),
        ("another file at the name", [_record()], {KEY: (*FILE[:2], 100)}),
        ("gone", [_record()], {}),
        ("a bucket: no identity kept", [_record(file=None)], {KEY: FILE}),
        ("written while that run read it", [_record(start=FILE[1] / 1e9 - 1)], {KEY: FILE}),
        ("the machine's error", [_record(error="PermissionError", message="denied")], {KEY: FILE}),
        ("out of memory", [_record(message="RESOURCE_EXHAUSTED: out of memory")], {KEY: FILE}),
        ("memory", [_record(error="MemoryError", message="")], {KEY: FILE}),
        (
            "a later run hit the same file",
            [_record(), _record(error="", hits=1, start=1_700_000_200.0, name="r2.json")],
            {KEY: FILE},
        ),
    ],
)
def test_what_a_failure_does_not_prove(
    why: str, records: list[Record], files: dict[str, tuple[int, int, int]]
) -> None:
    assert proven_failures(records, files) == {}, why
