"""The scan's report: its summary, module table and the frozen ScanReport.

Everything above the scan (lint, stats, check, prune, the renderers) reads these types; this
module imports no rule and does no I/O.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cachedoctor.cache import model
from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.listdir import CacheListing, DirItem, FileKind
from cachedoctor.cache.memostore import KeptText
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.findings import Finding, Severity
from cachedoctor.plaindata import ToDict
from cachedoctor.xla import subcaches

SCHEMA_VERSION = 1


RECENT_WRITE_S = 60  # JAX writes entries in place; a very young truncated file may be mid-write


@dataclass(frozen=True)
class KeyModeUse:
    """How the stable hasher keyed some of a module's entries, and why (from their manifests)."""

    mode: str  # static, replay, declared or fallback (stablekeys.manifest.KEY_MODES)
    reason: str
    entries: int


@dataclass(frozen=True)
class ModuleStats:
    module: str
    entries: int
    programs: int  # distinct programs (modulo volatile fields) among the entries
    bytes_on_disk: int
    compile_seconds: int
    key_modes: tuple[KeyModeUse, ...] = ()  # empty: no entry has a key manifest
    undecodable: int = 0  # entries among ``entries`` that do not decode: no program counted


@dataclass(frozen=True)
class ScanSummary:
    entries: int
    bytes_on_disk: int
    decompressed_bytes: int
    compile_seconds: int
    modules: int
    platforms: tuple[tuple[str, int], ...]
    formats: tuple[tuple[str, int], ...]
    corrupt: int
    atime_files: int  # every -atime file, an entry's or not
    eviction_in_use: bool  # a .lockfile, or an -atime file beside an entry (LruEvidence)
    subcaches: tuple[tuple[str, int], ...]  # name, bytes on disk
    symlinks: int = 0  # -cache names that are symbolic links: not followed, not in ``entries``
    entry_atime_files: int = 0  # entries with an -atime file of the same key
    orphan_atime_files: int = 0  # -atime files with no entry of the same key
    lockfile: bool = False  # JAX's .lockfile (its LRU cache locks it around every get/put)
    # entries whose compile time is not in ``compile_seconds``: undecodable, none is known
    without_compile_time: int = 0


@dataclass(frozen=True)
class ScanReport(ToDict):
    """What a scan found. Plain data: ``entries`` and ``other_files`` are tuples, or None when
    the scan was asked not to load them (``scan_directory(..., entries=False)``: the text
    report, ``lint`` and ``stats`` use only the summary, modules and findings, and a repeated
    scan then reads nothing but the listing and the memo)."""

    cache_dir: str
    scanned_at: float
    jax: JaxInfo
    summary: ScanSummary
    modules: tuple[ModuleStats, ...]
    entries: tuple[EntryInfo, ...] | None
    findings: tuple[Finding, ...]
    other_files: tuple[DirItem, ...] | None = ()  # every name that is not an entry
    subcaches: subcaches.SubcacheReport | None = None
    other_file_count: int = 0  # len(other_files), also when they are not loaded
    holds_cache_files: bool = False  # an -atime file, lockfile or sub-cache among them

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    def loaded_entries(self) -> tuple[tuple[EntryInfo, ...], tuple[DirItem, ...]]:
        """``entries`` and ``other_files``; a report made without them is refused (ValueError)."""
        if self.entries is None or self.other_files is None:
            raise ValueError("this scan was made without its entries (entries=False)")
        return self.entries, self.other_files

    @property
    def looks_like_cache(self) -> bool:
        """Empty, or holding something only a JAX cache holds (an entry, -atime, sub-cache)."""
        named_entries = self.summary.entries + self.summary.symlinks
        return named_entries > 0 or self.other_file_count == 0 or self.holds_cache_files

    def without(self, kinds: Iterable[str]) -> ScanReport:
        """This report with the findings of ``kinds`` left out (``--ignore``)."""
        drop = set(kinds)
        return dataclasses.replace(
            self, findings=tuple(f for f in self.findings if f.kind not in drop)
        )

    def fails(self, threshold: Severity, ignore: Iterable[str] = ()) -> bool:
        ignored = set(ignore)
        return any(f.severity >= threshold and f.kind not in ignored for f in self.findings)


ProgressCallback = Callable[[int, int], None]


# How a renderer writes the long parts of its scan document (``render/jsonout.SCAN_PARTS``):
# by name, a function from a report with its entries to that part's text, in pieces.
# ``scan_json`` keeps the text beside the scan memo, and a served scan hands it back instead of
# the entries.
PartWriters = Mapping[str, Callable[["ScanReport"], Iterable[str]]]


@dataclass(frozen=True)
class JsonScan:
    """What ``scan_json`` returns: the report, and the text of its document's long parts as
    the writers made it (kept with the memo, checked when read). With ``kept`` the report's
    ``entries`` and ``other_files`` are None; without (no memo kept: no index, files written in
    the last seconds, XLA sub-caches) the report holds them."""

    report: ScanReport
    kept: KeptText | None = None

    def without(self, kinds: Iterable[str]) -> JsonScan:
        """As ``ScanReport.without``: the findings of ``kinds`` left out (``--ignore``), and
        then not their kept text."""
        report = self.report.without(kinds)
        kept = self.kept
        if kept is not None and len(report.findings) != len(self.report.findings):
            kept = kept.without("findings")
        return JsonScan(report, kept)


@dataclass(frozen=True)
class LruEvidence:
    """What a listing says about JAX's LRU eviction: one judgement for the summary, the
    ``missing-atime`` finding and ``prune --repair``.

    JAX writes ``<key>-atime`` beside an entry and locks ``.lockfile`` only with eviction on
    (``lru_cache.py``). An -atime file with no entry of its key says nothing about the entries
    (a copy, an old run), so it is not evidence that eviction runs on them.
    """

    lockfile: bool
    with_atime: frozenset[str]  # keys of regular entries with an -atime file
    without_atime: tuple[str, ...]  # -cache names without one (links too: JAX globs them), sorted
    orphans: tuple[str, ...]  # keys of -atime files with no -cache name, sorted

    @property
    def in_use(self) -> bool:
        return self.lockfile or bool(self.with_atime)


def lru_evidence(listing: CacheListing) -> LruEvidence:
    """What the listing shows of JAX's LRU eviction (asked by the summary and the findings of
    one scan: made once per listing)."""
    last = _LAST_LRU[0] if _LAST_LRU else None
    if last is not None and last[0]() is listing:
        return last[1]
    evidence = _lru_evidence(listing)
    _LAST_LRU[:] = [(weakref.ref(listing), evidence)]
    return evidence


_LAST_LRU: list[tuple[weakref.ref[CacheListing], LruEvidence]] = []


def _lru_evidence(listing: CacheListing) -> LruEvidence:
    entry_keys = {i.key for i in listing.entries if i.key}
    regular = {i.key for i in listing.entries if i.key and not i.is_symlink}
    atime_keys = {i.key for i in listing.of_kind(FileKind.ATIME) if i.key}
    return LruEvidence(
        lockfile=any(i.kind is FileKind.LOCKFILE for i in listing.items),
        with_atime=frozenset(regular & atime_keys),
        without_atime=tuple(sorted(entry_keys - atime_keys)),
        orphans=tuple(sorted(atime_keys - entry_keys)),
    )


# Problems that mean the bytes are damaged. "unreadable" (permissions) and "too-large" (over the
# decode cap) say nothing about the bytes: such an entry is reported unreadable, never corrupt.
DAMAGE = frozenset({"truncated", "decompress", "not-compressed", "header", "protobuf"})


# Problems that say nothing of the bytes: a symbolic link (never followed), a layout the reader
# cannot decode (no zstandard installed) or does not know (no verdict: when in doubt, keep).
NOT_DAMAGE = frozenset({"symlink", "unsupported", "unknown-layout"})


def real_problems(e: EntryInfo) -> list[model.Problem]:
    """Problems that make an entry unusable (a symlink or an unknown layout is not damage)."""
    if not e.problems:  # nearly every entry: asked of each, several times per scan
        return []
    return [p for p in e.problems if p.kind not in NOT_DAMAGE]


def is_symlink(e: EntryInfo) -> bool:
    """A -cache name that is a symbolic link: never followed, so neither an entry nor decoded."""
    return bool(e.problems) and any(p.kind == "symlink" for p in e.problems)


def unknown_layout(e: EntryInfo) -> model.Problem | None:
    """The problem saying an entry's layout is one the reader does not know, if it is."""
    if not e.problems:
        return None
    return next((p for p in e.problems if p.kind == "unknown-layout"), None)


def undecodable(e: EntryInfo) -> bool:
    """A regular entry that does not decode: damaged, unreadable or over the decode cap."""
    return bool(e.problems) and not is_symlink(e) and bool(real_problems(e))


def judged_by_age_until(entry: EntryInfo, now: float) -> float | None:
    """Until when ``entry`` counts as a write in progress: a truncated file written less than
    ``RECENT_WRITE_S`` ago (JAX writes entries in place); None when its verdict is final."""
    real = real_problems(entry)
    if not real or real[0].kind != "truncated":
        return None
    until = entry.mtime_ns / 1e9 + RECENT_WRITE_S
    return until if now < until else None
