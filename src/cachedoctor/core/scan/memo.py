"""The scan memo: a repeated scan of an unchanged cache serves the last report whole.

The scan index (``cache/index.py``) spares decoding unchanged entries, but a repeated scan still
classified every name, served every row and rebuilt every finding: several times the cost of
listing the directory. A report is a pure function of what the scan read, so it is stored (in
the index file) under a digest of all of it, and served when the digest comes out the same:

- every name in the directory with its ``lstat`` facts (mode, owner, size, mtime, inode, ctime:
  a rewrite, ``touch``, ``chmod``, ``chown``, rename or replacement changes ctime, which
  ``utime`` cannot set back), the directory's own mode and owner, and the same for each file of
  the key manifests folder (the one folder the scan reads below the cache);
- for a bucket, each object's name, size, mtime and generation/ETag;
- the code (every module of the package), the installed JAX facts the findings use, the user
  (ownership findings), the path as given and made absolute, and the decode limit.

A report is not stored when it read more than that (XLA sub-caches, a bucket's manifests) or,
locally, when a file changed in the last ``index.RACY_S`` (a write may still be in flight within
one timestamp tick; a bucket object's generation/ETag changes with every write). It is served
only forward in time (a clock set back misses), and only while no young truncated entry it holds
has come of age (``scan.judged_by_age_until``: its verdict changes then). Its entries and
other files are not stored: a caller that asks for them (``scan_directory(entries=True)``:
``check``, the API) gets them read from the index (the same rows a scan without the memo
serves) before the report is returned; the text report, ``lint`` and ``stats`` do not ask, and
read nothing more. ``scan --json`` (``scan_json``) asks for the text of its document's long
parts instead (entries, files, modules, findings): kept beside the memo the first time it is
asked (``memostore.py``), then served as it is, no entry read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import marshal
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

from cachedoctor import layout
from cachedoctor.cache import index, index_file, listdir, memostore
from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.listdir import CacheListing, DirItem, DirSnapshot, Member
from cachedoctor.cache.memostore import KeptText
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.core.scan.report import (
    KeyModeUse,
    ModuleStats,
    PartWriters,
    ScanReport,
    ScanSummary,
    judged_by_age_until,
)
from cachedoctor.storage.location import Location

MEMO_FORMAT = "cachedoctor-scan-memo-v4"
_BY_VALUE = 2  # marshal's format 2 writes no back-references: the bytes depend on values alone


@dataclasses.dataclass(frozen=True)
class Memo:
    """The memo of one scan: serve the stored report, or keep the one the scan makes."""

    inputs: str | None  # None: not used (no index, or a report that must not be kept)
    cache: str
    max_decompressed: int
    remote: bool = False  # a bucket (the listing says so): its index is named by the URL

    def served(self, now: float, rest: Rest | None) -> ScanReport | None:
        if self.inputs is None:
            return None
        body = memostore.read_memo(
            self.cache, (self.max_decompressed,), self.inputs, remote=self.remote
        )
        return None if body is None else served(body, now, rest)

    def kept(self, report: ScanReport) -> ScanReport:
        if self.inputs is not None and keeps(report):
            memostore.write_memo(
                self.cache,
                (self.max_decompressed,),
                self.inputs,
                dump(report),
                remote=self.remote,
            )
        return report

    def kept_text(self, writers: PartWriters) -> KeptText | None:
        """The document text kept beside the served report (call only after ``served`` served
        one: it is good for exactly its inputs), or None."""
        if self.inputs is None:
            return None
        options = (self.max_decompressed,)
        return memostore.read_text(
            self.cache, options, self.inputs, tuple(writers), remote=self.remote
        )

    def keep_text(self, report: ScanReport, writers: PartWriters) -> KeptText | None:
        """The document text ``writers`` make of the report (its entries loaded), kept beside
        its memo (after ``kept`` or ``served``); None when the memo does not keep the report or
        the text could not be kept (no index: the caller writes the entries, as without)."""
        if self.inputs is None or not keeps(report) or not index_file.enabled():
            return None
        parts = []
        for name, write in writers.items():
            body = memostore.compressed(write(report))
            if body is None:
                return None
            parts.append((name, body))
        kept = KeptText(tuple(parts))
        options = (self.max_decompressed,)
        return (
            kept
            if memostore.write_text(self.cache, options, self.inputs, kept, remote=self.remote)
            else None
        )


# --- what a report rests on ----------------------------------------------------------------------


def _common(
    h: Any, root: str, subcache_dir: str | None, jax_info: JaxInfo, max_decompressed: int
) -> None:
    h.update(MEMO_FORMAT.encode() + b"\0" + index_file.package_fingerprint())
    where = (root, os.path.abspath(root), subcache_dir)  # relocated: as spelled
    facts = (*where, os.getuid(), max_decompressed, *_fields(jax_info))
    h.update(json.dumps(facts).encode("utf-8", "surrogatepass") + b"\0")


def local_inputs(
    snapshot: DirSnapshot, jax_info: JaxInfo, max_decompressed: int, now: float
) -> str | None:
    """The digest of everything a local scan of ``snapshot`` reads, or None when a report made
    from it must not be kept or served (a file changed too recently, or cannot be read)."""
    h = hashlib.sha256()
    _common(h, snapshot.root, None, jax_info, max_decompressed)  # sub-caches: inside it
    h.update(marshal.dumps((snapshot.root_mode, snapshot.root_uid), _BY_VALUE))
    newest = _hash_members(h, snapshot.members)
    if any(m[0] == layout.MANIFEST_DIRNAME for m in snapshot.members):
        try:
            manifests = listdir.read_dir(os.path.join(snapshot.root, layout.MANIFEST_DIRNAME))
        except OSError:
            return None
        h.update(b"\0manifests\0")
        newest = max(newest, _hash_members(h, sorted(manifests.members)))
    if any(m[0] == layout.STATS_DIRNAME for m in snapshot.members):
        try:  # not-stored's reasons and JAX's failed loads read the stats records
            records = listdir.read_dir(os.path.join(snapshot.root, layout.STATS_DIRNAME))
        except OSError:
            return None
        h.update(b"\0stats\0")
        newest = max(newest, _hash_members(h, sorted(records.members)))
    if newest >= (now - index.RACY_S) * 1e9:
        return None
    return h.hexdigest()


def _hash_members(h: Any, members: list[Member]) -> int:
    """Hash each name and its lstat facts, in the order given (a directory lists in the same
    order while unchanged; another order only misses); the newest mtime or ctime (ns)."""
    h.update(marshal.dumps(members, _BY_VALUE))  # one C call over tuples of str and int
    return max(max(map(_MTIME, members), default=0), max(map(_CTIME, members), default=0))


_MTIME, _CTIME = operator.itemgetter(4), operator.itemgetter(6)  # listdir.Member's fields


def bucket_inputs(
    where: Location, listing: CacheListing, jax_info: JaxInfo, max_decompressed: int, now: float
) -> str | None:
    """As ``local_inputs`` for the listing of the bucket ``where`` (objects by generation/ETag,
    which every write changes); None when it holds key manifests (read with a second
    listing)."""
    if any(i.name == layout.MANIFEST_DIRNAME for i in listing.items):
        return None
    h = hashlib.sha256()
    _common(h, listing.root, where.subcache_dir, jax_info, max_decompressed)
    for i in listing.items:
        h.update(json.dumps([i.name, i.size, i.mtime_ns, i.version, i.is_dir]).encode() + b"\0")
    return h.hexdigest()


# --- the report as JSON, without its entries and other files -------------------------------------


def keeps(report: ScanReport) -> bool:
    """Whether the memo can hold this report: one that read XLA sub-caches cannot (their files
    are not part of the digest)."""
    return report.subcaches is None


def dump(report: ScanReport) -> str:
    """The report without entries and other files, as JSON; each advice and evidence text once
    (thousands of findings share a few: 2 of the 3 MB of ``dist-10k``'s report were repeats)."""
    if report.entries is None:
        raise ValueError("a report made without its entries cannot be kept")
    texts: dict[str, int] = {}
    ages = (judged_by_age_until(e, report.scanned_at) for e in report.entries)
    body = {
        "scanned_at": report.scanned_at,
        "until": min((t for t in ages if t is not None), default=None),
        "cache_dir": report.cache_dir,
        "jax": _fields(report.jax),
        "summary": _fields(report.summary),
        "modules": [_module_row(m) for m in report.modules],
        "findings": [_finding_row(f, texts) for f in report.findings],
        "texts": list(texts),
        "counts": [report.summary.entries, report.other_file_count, report.holds_cache_files],
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True)


Rest = Callable[[], tuple[Sequence[EntryInfo], Sequence[DirItem]]]  # entries, other files


def served(body: str, now: float, rest: Rest | None) -> ScanReport | None:
    """The stored report, scanned at ``now``, with the entries and other files ``rest`` reads
    (None: without them); None when the body is damaged, of another shape, or from a later
    time."""
    try:
        data = json.loads(body)
        if not isinstance(data, dict) or not data["scanned_at"] <= now:
            return None
        if data["until"] is not None and not now < data["until"]:
            return None
        n_entries, n_other, holds_cache_files = data["counts"]
        report = ScanReport(
            cache_dir=_str(data["cache_dir"]),
            scanned_at=now,
            jax=JaxInfo(*data["jax"]),
            summary=_summary(data["summary"]),
            modules=tuple(_module(m) for m in data["modules"]),
            entries=None,
            findings=tuple(_finding(f, data["texts"]) for f in data["findings"]),
            other_files=None,
            other_file_count=int(n_other),
            holds_cache_files=bool(holds_cache_files),
        )
        if report.summary.entries != n_entries:
            return None
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    if rest is None:
        return report
    entries, others = rest()
    return dataclasses.replace(report, entries=tuple(entries), other_files=tuple(others))


def _fields(value: Any) -> list[Any]:
    return [getattr(value, f.name) for f in dataclasses.fields(value)]


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("memo of another shape")
    return value


def _pairs(rows: list[list[Any]]) -> tuple[tuple[str, int], ...]:
    return tuple((_str(name), int(n)) for name, n in rows)


def _summary(values: list[Any]) -> ScanSummary:
    names = [f.name for f in dataclasses.fields(ScanSummary)]
    if len(values) != len(names):
        raise ValueError("memo of another shape")
    fields: dict[str, Any] = dict(zip(names, values, strict=True))
    for name in ("platforms", "formats", "subcaches"):
        fields[name] = _pairs(fields[name])
    return ScanSummary(**fields)


def _module_row(m: ModuleStats) -> list[Any]:
    return [
        m.module,
        m.entries,
        m.programs,
        m.bytes_on_disk,
        m.compile_seconds,
        [_fields(u) for u in m.key_modes],
        m.undecodable,
    ]


def _module(values: list[Any]) -> ModuleStats:
    module, entries, programs, bytes_on_disk, compile_seconds, modes, undecodable = values
    key_modes = tuple(KeyModeUse(*u) for u in modes)
    return ModuleStats(
        module, entries, programs, bytes_on_disk, compile_seconds, key_modes, undecodable
    )


def _finding_row(f: Finding, texts: dict[str, int]) -> list[Any]:
    advice = texts.setdefault(f.advice, len(texts))
    evidence = texts.setdefault(f.evidence, len(texts))
    return [f.kind, f.severity, f.message, advice, evidence, f.entries, f.module]


def _finding(values: list[Any], texts: list[str]) -> Finding:
    kind, severity, message, advice, evidence, entries, module = values
    return Finding(
        FindingKind(kind),
        Severity(severity),
        message,
        _str(texts[advice]),
        _str(texts[evidence]),
        tuple(entries),
        module,
    )
