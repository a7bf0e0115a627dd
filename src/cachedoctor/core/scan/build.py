"""From a listing and its decoded entries to the report: the findings of every rule of
``rules/registry.SCAN_RULES``, the summary and the module table (pure: no I/O but the size of a
local sub-cache folder).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.listdir import CACHE_OWN_KINDS, CacheListing, DirItem, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.scan.report import (
    ModuleStats,
    ScanReport,
    ScanSummary,
    is_symlink,
    lru_evidence,
    undecodable,
)
from cachedoctor.core.scan.rules.keys import count_modes, key_modes_by_entry
from cachedoctor.core.scan.rules.registry import ScanInput, run_rules
from cachedoctor.core.usage.model import Record
from cachedoctor.xla import subcaches


def other_files(listing: CacheListing) -> tuple[DirItem, ...]:
    return tuple(i for i in listing.items if i.kind is not FileKind.ENTRY)


def build_report(
    listing: CacheListing,
    entries: list[EntryInfo],
    jax_info: JaxInfo,
    now: float,
    sub: subcaches.SubcacheReport | None = None,
    *,
    manifests: Sequence[Mapping[str, object] | None] = (),
    records: Sequence[Record] = (),
    root_as_given: str | None = None,
    evidence_records: Sequence[Record] | None = None,
) -> ScanReport:
    """Findings and statistics from decoded entries (pure: no I/O).

    ``manifests``: the cache's key manifests as JSON data (``stablekeys.manifest``): they say
    which entries are under the stable hasher, and which modules JAX compiled but never stored.
    ``records``: the stats records (``usage/records.py``): why those were not stored.
    ``evidence_records``: those and the ones ``stats --zero`` archived (``records`` when not
    given): which loads JAX failed on the files there now.
    ``root_as_given``: the directory as the user spelled it, when the listing's root is its
    real path (``relocated`` compares paths as JAX hashes them: as spelled).
    """
    scan = ScanInput(
        listing,
        entries,
        jax_info,
        now,
        sub,
        manifests,
        records,
        root_as_given or listing.root,
        records if evidence_records is None else evidence_records,
    )
    findings = run_rules(scan)  # core/scan/rules/registry.SCAN_RULES, in its order
    findings.sort(key=lambda f: (-f.severity, f.kind, f.module or "", f.entries))
    others = other_files(listing)
    return ScanReport(
        cache_dir=listing.root,
        scanned_at=now,
        jax=jax_info,
        summary=_summary(listing, entries),
        modules=_module_stats(entries, manifests, _inodes(listing)),
        entries=tuple(entries),
        findings=tuple(findings),
        other_files=others,
        subcaches=sub,
        other_file_count=len(others),
        holds_cache_files=any(i.kind in CACHE_OWN_KINDS for i in others),
    )


def _summary(listing: CacheListing, all_entries: list[EntryInfo]) -> ScanSummary:
    """The totals over the regular entries: a symbolic link named like an entry is counted as
    one (``symlinks``), never as an entry; an undecodable entry counts as one (``corrupt``)."""
    entries = [e for e in all_entries if not is_symlink(e)]
    lru = lru_evidence(listing)
    subcaches: dict[str, int] = {}
    for item in listing.items:
        if item.kind in (FileKind.AUTOTUNE_SUBCACHE, FileKind.KERNEL_SUBCACHE):
            local_dir = item.is_dir and not listing.remote  # a bucket lists totals already
            subcaches[item.name] = tree_size(listing.path(item)) if local_dir else item.size
    return ScanSummary(
        entries=len(entries),
        bytes_on_disk=bytes_once(entries, _inodes(listing)),
        decompressed_bytes=sum(e.decompressed_size or 0 for e in entries),
        compile_seconds=sum(stored_compile_time(e) or 0 for e in entries),
        modules=len({e.module for e in entries}),
        platforms=tuple(Counter(e.platform for e in entries if e.ok).most_common()),
        formats=tuple(Counter(e.format_label for e in entries if e.ok).most_common()),
        corrupt=sum(1 for e in entries if undecodable(e)),
        atime_files=len(listing.of_kind(FileKind.ATIME)),
        eviction_in_use=lru.in_use,
        subcaches=tuple(sorted(subcaches.items())),
        symlinks=len(all_entries) - len(entries),
        entry_atime_files=len(lru.with_atime),
        orphan_atime_files=len(lru.orphans),
        lockfile=lru.lockfile,
        without_compile_time=sum(1 for e in entries if stored_compile_time(e) is None),
    )


def _inodes(listing: CacheListing) -> dict[str, int]:
    """Each entry's inode: two keys with one inode are one file (a hard link: the stable hook
    adopts a plain entry by one). A bucket's objects have none (0): each is its own."""
    return {i.key: i.ino for i in listing.entries if i.key is not None and i.ino}


def bytes_once(entries: Iterable[EntryInfo], inodes: Mapping[str, int]) -> int:
    """The entries' bytes on disk, a file under several names counted once."""
    seen: set[int] = set()
    total = 0
    for e in entries:
        ino = inodes.get(e.key, 0)
        if ino:
            if ino in seen:
                continue
            seen.add(ino)
        total += e.size
    return total


def stored_compile_time(e: EntryInfo) -> int | None:
    """The compile time JAX stored in a decodable entry; None for an undecodable one, whose
    first four bytes are no compile time (a damaged file can read as 19,352,772 s)."""
    return None if undecodable(e) else e.compile_time_s


def tree_size(path: os.PathLike[str] | str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _module_stats(
    entries: list[EntryInfo],
    manifests: Sequence[Mapping[str, object] | None] = (),
    inodes: Mapping[str, int] | None = None,
) -> tuple[ModuleStats, ...]:
    by_module: dict[str, list[EntryInfo]] = defaultdict(list)
    for e in entries:
        if not is_symlink(e):  # not an entry: the insecure finding names it
            by_module[e.module or "(unnamed)"].append(e)
    modes = key_modes_by_entry(manifests)
    stats = [
        ModuleStats(
            module=module,
            entries=len(group),
            programs=len({e.program_digest or e.key for e in group if not undecodable(e)}),
            bytes_on_disk=bytes_once(group, inodes or {}),
            compile_seconds=sum(stored_compile_time(e) or 0 for e in group),
            key_modes=count_modes(modes[e.key] for e in group if e.key in modes),
            undecodable=sum(1 for e in group if undecodable(e)),
        )
        for module, group in by_module.items()
    ]
    stats.sort(key=lambda s: (-s.bytes_on_disk, s.module))
    return tuple(stats)
