"""Entries JAX itself failed to load, as its processes' stats records saw it.

cachedoctor's reader calls an entry ``corrupt`` only where the bytes prove JAX fails too (a frame
that does not decode whole, a message that does not parse). Some damage only JAX's own parser
sees: deep inside libtpu's messages, an XLA shape or a CPU executable's object code. The stats
recorder keeps JAX's error when its load raises (``stablekeys/stats.py``: ``load_failures``),
and such a failure proves the file that is there now damaged when all of these hold:

- the error is one damaged bytes give: zstd's (``ZstdError``), or XLA refusing the executable
  (``JaxRuntimeError`` / ``XlaRuntimeError`` with status ``INTERNAL``, ``INVALID_ARGUMENT`` or
  ``DATA_LOSS``); never one of the machine (an ``OSError``, memory, ``RESOURCE_EXHAUSTED``,
  ``UNAVAILABLE``: the next run may load it);
- the file is the one JAX read: its size, modification time and inode now are those the
  recorder saw at the failure (a bucket's objects have none: never proven there);
- it was whole when read: last modified before the failing process started (JAX writes an entry
  in place, so a read racing that write can fail on a file that is whole afterwards);
- no process hit that key after the failure.

JAX never replaces a file it failed to load (its put returns when the file exists), so every
later run fails the same way: one proven failure is enough.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cachedoctor.core.usage.model import LoadFailure, Record

# the exception types JAX's load raises on bytes it cannot parse
ZSTD_ERRORS = frozenset({"ZstdError"})
XLA_ERRORS = frozenset({"JaxRuntimeError", "XlaRuntimeError"})
# XLA statuses that say the executable's bytes were refused (absl's codes, as XLA prints them)
DAMAGE_STATUSES = ("INTERNAL:", "INVALID_ARGUMENT:", "DATA_LOSS:")


@dataclass(frozen=True)
class ProvenFailure:
    """A load JAX failed on the file that is there now, and the record that saw it."""

    key: str
    failure: LoadFailure
    record: str  # the stats record's file
    host: str
    pid: int
    runs: int  # how many records saw a load of this file fail

    def words(self) -> str:
        """The evidence, in one clause: JAX's error, who saw it, and why it is these bytes."""
        import time

        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.failure.time))
        seen = f"{self.runs} runs" if self.runs > 1 else "a run"
        return (
            f"JAX's load failed: {self.failure.error}: {_one_line(self.failure.message)} "
            f"({seen}; first at {when}, pid {self.pid} on {self.host}, stats record "
            f"{self.record}); the file is unchanged since, and was whole before that run began"
        )


def _one_line(message: str) -> str:
    text = " ".join(message.split())
    return text if len(text) <= 200 else text[:199] + "…"


def damage_error(failure: LoadFailure) -> bool:
    """Whether JAX's error is one that damaged bytes give (the module docstring)."""
    if failure.error in ZSTD_ERRORS:
        return True
    return failure.error in XLA_ERRORS and failure.message.lstrip().startswith(DAMAGE_STATUSES)


def proven_failures(
    records: Iterable[Record], files: Mapping[str, tuple[int, int, int]]
) -> dict[str, ProvenFailure]:
    """Each entry whose load JAX failed on the file that is there now (``files``: key → size,
    modification time in ns, inode, as listed), by the rules of the module docstring."""
    seen: dict[str, list[tuple[LoadFailure, Record]]] = {}
    hits: dict[str, list[float]] = {}  # key -> when each process that hit it started
    for r in records:
        for key, f in r.load_failures.items():
            seen.setdefault(key, []).append((f, r))
        for key, counts in r.keys.items():
            if counts.hits:
                hits.setdefault(key, []).append(r.start)
    out: dict[str, ProvenFailure] = {}
    for key, failures in seen.items():
        now = files.get(key)
        if now is None:
            continue
        size, mtime_ns, ino = now
        proving = [
            (f, r)
            for f, r in failures
            if damage_error(f)
            and (f.size, f.mtime_ns, f.ino) == (size, mtime_ns, ino)
            and mtime_ns < int(r.start * 1e9)
        ]
        if not proving:
            continue
        first, record = min(proving, key=lambda fr: fr[0].time)
        if any(started >= mtime_ns / 1e9 for started in hits.get(key, ())):
            continue  # a run of this file hit it: the failure was not the bytes
        out[key] = ProvenFailure(
            key, first, record.file, record.host, record.pid, runs=len(proving)
        )
    return out
