"""Findings about damaged or incomplete files: -atime files missing or left over, temporary
files, entries that do not decode.
"""

from __future__ import annotations

from cachedoctor import layout
from cachedoctor.cache.listdir import CacheListing, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.core.scan.report import DAMAGE, judged_by_age_until, real_problems
from cachedoctor.errors import count


def atime_findings(listing: CacheListing) -> list[Finding]:
    entry_keys = {i.key for i in listing.entries}
    atime_keys = {i.key for i in listing.of_kind(FileKind.ATIME)}
    findings = []
    if atime_keys:
        missing = sorted(k for k in entry_keys - atime_keys if k)
        # JAX's LRU cache takes <dir>/.lockfile around every get/put: the evidence that eviction
        # runs here. -atime files without it may be strays (a copy, an old run).
        locked = any(i.kind is FileKind.LOCKFILE for i in listing.items)
        if missing and locked:
            findings.append(
                Finding(
                    kind=FindingKind.MISSING_ATIME,
                    severity=Severity.ERROR,
                    entries=tuple(missing),
                    message=(
                        f"{count(len(missing), 'entry has', 'entries have')} no "
                        "-atime file while LRU eviction is in use (.lockfile present); "
                        "JAX's eviction pass fails on them and stops all cache writes"
                    ),
                    evidence="the listing: -cache files without -atime, and JAX's .lockfile",
                    advice="run `cachedoctor prune --repair --apply` to recreate the -atime files",
                )
            )
        elif missing:
            n = len(atime_keys)
            findings.append(
                Finding(
                    kind=FindingKind.MISSING_ATIME,
                    severity=Severity.WARNING,
                    entries=tuple(missing),
                    message=(
                        f"{count(len(missing), 'entry has', 'entries have')} no "
                        f"-atime file, {count(n, 'entry has', 'entries have')} one and "
                        "there is no .lockfile: LRU eviction does not seem to run here, but "
                        "turning it on (a max size) would fail on these entries"
                    ),
                    advice="run `cachedoctor prune --repair --apply` to recreate the -atime files",
                    evidence="the listing: -atime files beside other entries, none beside these",
                )
            )
    orphans = sorted(k for k in atime_keys - entry_keys if k)
    if orphans:
        findings.append(
            Finding(
                kind=FindingKind.ORPHAN,
                severity=Severity.INFO,
                entries=tuple(f"{k}{layout.ATIME_SUFFIX}" for k in orphans),
                message=f"{count(len(orphans), '-atime file has', '-atime files have')} no entry",
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
