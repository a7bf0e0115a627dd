"""Findings about damaged or incomplete files: -atime files missing or left over, temporary
files, entries that do not decode.
"""

from __future__ import annotations

from collections.abc import Sequence

from cachedoctor import layout
from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.listdir import CacheListing, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding, Severity
from cachedoctor.core.scan.report import (
    DAMAGE,
    judged_by_age_until,
    lru_evidence,
    real_problems,
    unknown_layout,
)
from cachedoctor.core.usage.load_failures import proven_failures
from cachedoctor.core.usage.model import Record
from cachedoctor.errors import count


def atime_findings(listing: CacheListing, jax_info: JaxInfo | None = None) -> list[Finding]:
    """Entries without their -atime file under JAX's LRU (judged by what the installed JAX's
    eviction pass does with one), -atime files without an entry, leftover temporary files."""
    lru = lru_evidence(listing)
    links = {i.key for i in listing.entries if i.is_symlink}
    findings = []
    missing = lru.without_atime
    if (
        missing
        and (lru.lockfile or lru.with_atime)
        and jax_info
        and jax_info.lru_evicts_without_atime
    ):
        findings.append(
            catalog.MISSING_ATIME_EVICTED_FIRST.finding(
                f"{_entries_have(missing, links)} no -atime file while LRU eviction is in use; "
                f"JAX {jax_info.jax_version} takes them as the least recently used and evicts "
                "them first",
                entries=missing,
                jax=str(jax_info.jax_version),
            )
        )
    elif missing and lru.lockfile:
        findings.append(
            catalog.MISSING_ATIME_LOCKED.finding(
                f"{_entries_have(missing, links)} no -atime file while LRU eviction is in use "
                "(.lockfile present); JAX up to 0.10 fails its eviction pass on them, which "
                "stops all cache writes (0.12 evicts them first)",
                entries=missing,
            )
        )
    elif missing and lru.with_atime:
        # JAX writes -atime files only with eviction on: these entries were used with it on,
        # yet its lock is gone (a copy without dot files; a lock that deletes itself).
        n = len(lru.with_atime)
        findings.append(
            catalog.MISSING_ATIME_UNLOCKED.finding(
                f"{_entries_have(missing, links)} no -atime file while "
                f"{count(n, 'entry has', 'entries have')} one: JAX ran here with LRU "
                "eviction on (only then does it write them), though there is no .lockfile "
                "now; when eviction runs again (a max size) it fails on these entries",
                entries=missing,
            )
        )
    if lru.orphans:
        n = len(lru.orphans)
        findings.append(
            catalog.ORPHAN_ATIME.finding(
                f"{count(n, '-atime file has', '-atime files have')} no entry",
                entries=tuple(f"{k}{layout.ATIME_SUFFIX}" for k in lru.orphans),
            )
        )
    temps = listing.of_kind(FileKind.TEMP)
    if temps:
        findings.append(
            catalog.ORPHAN_TEMP.finding(
                f"{count(len(temps), 'leftover temporary file')}",
                entries=tuple(i.name for i in temps),
            )
        )
    return findings


def _entries_have(keys: tuple[str, ...], links: set[str | None]) -> str:
    """``3 entries have``, naming the symbolic links among them (JAX's eviction globs them)."""
    n_links = sum(1 for k in keys if k in links)
    if not n_links:
        return count(len(keys), "entry has", "entries have")
    n = len(keys) - n_links
    links_named = f"{count(n_links, 'symbolic link')} named -cache"
    who = f"{count(n, 'entry', 'entries')} and {links_named}" if n else links_named
    return f"{who} {'has' if len(keys) == 1 else 'have'}"


def corrupt_findings(entries: list[EntryInfo], now: float) -> list[Finding]:
    """Damaged entries (JAX fails on them too), unreadable ones, and those in a layout the
    reader does not know (no verdict)."""
    findings = []
    for e in entries:
        real = real_problems(e)
        if not real:
            unknown = unknown_layout(e)
            if unknown is not None:
                findings.append(
                    catalog.UNKNOWN_LAYOUT.finding(
                        f"{e.key}: {unknown.message}",
                        module=e.module,
                        entries=(e.key,),
                        problem=unknown.kind,
                    )
                )
            continue
        if real[0].kind not in DAMAGE:
            findings.append(
                catalog.UNREADABLE.finding(
                    f"{e.key}: not checked: {real[0].kind}: {real[0].message}",
                    module=e.module,
                    entries=(e.key,),
                    problem=real[0].kind,
                )
            )
            continue
        young = judged_by_age_until(e, now) is not None
        findings.append(
            catalog.CORRUPT.finding(
                f"{e.key}: {real[0].message}"
                + (" (written under a minute ago: may be a write in progress)" if young else ""),
                severity=Severity.WARNING if young else None,
                module=e.module,
                entries=(e.key,),
                problem=real[0].kind,
            )
        )
    return findings


def load_failure_findings(
    entries: list[EntryInfo], listing: CacheListing, records: Sequence[Record]
) -> list[Finding]:
    """Entries whose bytes look whole to the reader but that JAX's own load refused, on the
    file that is there now (``usage/load_failures``: what such a failure proves)."""
    if not any(r.load_failures for r in records):
        return []
    files = {
        i.key: (i.size, i.mtime_ns, i.ino)
        for i in listing.entries
        if i.key is not None and not i.is_symlink and not listing.remote
    }
    proven = proven_failures(records, files)
    findings = []
    for e in entries:
        found = proven.get(e.key)
        if found is None or real_problems(e):  # the reader's own evidence is said already
            continue
        findings.append(
            catalog.CORRUPT_BY_JAX.finding(
                f"{e.key}: JAX could not load it: {found.failure.error}",
                module=e.module,
                entries=(e.key,),
                problem=found.words(),
            )
        )
    return findings
