"""Findings about who can write the cache: an entry is code that JAX loads and runs."""

from __future__ import annotations

import os
import stat

from cachedoctor.cache.listdir import CacheListing, FileKind
from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.errors import count


def insecure_findings(listing: CacheListing) -> list[Finding]:
    if listing.remote:
        return []  # a bucket has no modes or owners; who may write it is IAM's business
    findings = []
    me = os.getuid()
    if listing.root_mode & (stat.S_IWGRP | stat.S_IWOTH) and not listing.root_mode & stat.S_ISVTX:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.ERROR,
                entries=(listing.root,),
                message=f"the cache directory is writable by {_who(listing.root_mode)}",
                evidence=f"the directory's mode {stat.filemode(listing.root_mode)}",
                advice=(
                    "whoever can write the cache can run code in your JAX processes; "
                    f"`chmod go-w {listing.root}`"
                ),
            )
        )
    if listing.root_uid != me:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.ERROR,
                entries=(listing.root,),
                message=f"the cache directory is owned by uid {listing.root_uid}, not you ({me})",
                evidence="the directory's owner (lstat)",
                advice="use a cache directory you own, or make sure its owner is trusted",
            )
        )
    writable = [
        i.name
        for i in listing.items
        if not i.is_symlink and i.kind is FileKind.ENTRY and i.mode & (stat.S_IWGRP | stat.S_IWOTH)
    ]
    if writable:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.ERROR,
                entries=tuple(writable),
                message=count(len(writable), "entry is", "entries are")
                + " writable by group or others",
                evidence="the entries' modes (lstat)",
                advice="`cachedoctor prune --repair --apply` removes group/other write bits",
            )
        )
    foreign = [i.name for i in listing.items if i.kind is FileKind.ENTRY and i.uid != me]
    if foreign:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.ERROR,
                entries=tuple(foreign),
                message=f"{count(len(foreign), 'entry is', 'entries are')} owned by another user",
                evidence="the entries' owners (lstat)",
                advice="another user's entries run in your process: remove them or trust that user",
            )
        )
    links = [i.name for i in listing.items if i.is_symlink]
    if links:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.WARNING,
                entries=tuple(links),
                message=count(len(links), "symbolic link")
                + " in the cache directory (not followed)",
                evidence="the directory listing (lstat)",
                advice="a link can make JAX load or overwrite a file outside the cache; remove it",
            )
        )
    return findings


def _who(mode: int) -> str:
    return " and ".join(
        w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit
    )
