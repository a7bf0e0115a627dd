"""Findings about damaged or incomplete files: -atime files missing or left over, temporary
files, entries that do not decode.
"""

from __future__ import annotations

from cachedoctor import layout
from cachedoctor.cache.listdir import CacheListing, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.core.scan.report import (
    DAMAGE,
    judged_by_age_until,
    lru_evidence,
    real_problems,
)
from cachedoctor.errors import count


def atime_findings(listing: CacheListing) -> list[Finding]:
    lru = lru_evidence(listing)
    links = {i.key for i in listing.entries if i.is_symlink}
    findings = []
    missing = lru.without_atime
    if missing and lru.lockfile:
        findings.append(
            Finding(
                kind=FindingKind.MISSING_ATIME,
                severity=Severity.ERROR,
                entries=missing,
                message=(
                    f"{_entries_have(missing, links)} no -atime file while LRU eviction is in "
                    "use (.lockfile present); JAX's eviction pass fails on them and stops all "
                    "cache writes"
                ),
                evidence="the listing: -cache files without -atime, and JAX's .lockfile",
                advice="run `cachedoctor prune --repair --apply` to recreate the -atime files",
            )
        )
    elif missing and lru.with_atime:
        # JAX writes -atime files only with eviction on: these entries were used with it on,
        # yet its lock is gone (a copy without dot files; a lock that deletes itself).
        n = len(lru.with_atime)
        findings.append(
            Finding(
                kind=FindingKind.MISSING_ATIME,
                severity=Severity.WARNING,
                entries=missing,
                message=(
                    f"{_entries_have(missing, links)} no -atime file while "
                    f"{count(n, 'entry has', 'entries have')} one: JAX ran here with LRU "
                    "eviction on (only then does it write them), though there is no .lockfile "
                    "now; when eviction runs again (a max size) it fails on these entries"
                ),
                advice="run `cachedoctor prune --repair --apply` to recreate the -atime files",
                evidence=(
                    "the listing: -atime files beside other entries, none beside these, "
                    "no .lockfile"
                ),
            )
        )
    if lru.orphans:
        n = len(lru.orphans)
        findings.append(
            Finding(
                kind=FindingKind.ORPHAN,
                severity=Severity.INFO,
                entries=tuple(f"{k}{layout.ATIME_SUFFIX}" for k in lru.orphans),
                message=f"{count(n, '-atime file has', '-atime files have')} no entry",
                evidence="the directory listing: no -cache file of the same key",
                advice="harmless; `cachedoctor prune --orphans --apply` removes them",
            )
        )
    temps = listing.of_kind(FileKind.TEMP)
    if temps:
        findings.append(
            Finding(
                kind=FindingKind.ORPHAN,
                severity=Severity.INFO,
                entries=tuple(i.name for i in temps),
                message=f"{count(len(temps), 'leftover temporary file')}",
                evidence="the directory listing: temporary file names of JAX's writers",
                advice="left by interrupted writers; `cachedoctor prune --orphans --apply`",
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
    findings = []
    for e in entries:
        real = real_problems(e)
        if not real:
            continue
        if real[0].kind not in DAMAGE:
            findings.append(
                Finding(
                    kind=FindingKind.UNREADABLE,
                    severity=Severity.WARNING,
                    module=e.module,
                    entries=(e.key,),
                    message=f"{e.key}: not checked: {real[0].kind}: {real[0].message}",
                    evidence=f"the reader could not read the bytes ({real[0].kind})",
                    advice=(
                        "cachedoctor could not read its bytes, so it says nothing about them and "
                        "never removes it; fix its permissions (or owner) to have it checked"
                    ),
                )
            )
            continue
        young = judged_by_age_until(e, now) is not None
        findings.append(
            Finding(
                kind=FindingKind.CORRUPT,
                severity=Severity.WARNING if young else Severity.ERROR,
                module=e.module,
                entries=(e.key,),
                message=f"{e.key}: {real[0].message}"
                + (" (written under a minute ago: may be a write in progress)" if young else ""),
                advice=(
                    "JAX fails to load this entry and recompiles; "
                    "`cachedoctor prune --corrupt --apply` removes it"
                ),
                evidence=f"decoding the file: {real[0].kind}",
            )
        )
    return findings
