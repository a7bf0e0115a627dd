"""Findings about who can write the cache: an entry is code that JAX loads and runs."""

from __future__ import annotations

import os
import stat

from cachedoctor.cache.listdir import CacheListing, FileKind
from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding
from cachedoctor.errors import count


def insecure_findings(listing: CacheListing) -> list[Finding]:
    if listing.remote:
        return []  # a bucket has no modes or owners; who may write it is IAM's business
    findings = []
    me = os.getuid()
    if listing.root_mode & (stat.S_IWGRP | stat.S_IWOTH) and not listing.root_mode & stat.S_ISVTX:
        findings.append(
            catalog.INSECURE_DIRECTORY_MODE.finding(
                f"the cache directory is writable by {_who(listing.root_mode)}",
                entries=(listing.root,),
                mode=stat.filemode(listing.root_mode),
                root=listing.root,
            )
        )
    if listing.root_uid != me:
        findings.append(
            catalog.INSECURE_DIRECTORY_OWNER.finding(
                f"the cache directory is owned by uid {listing.root_uid}, not you ({me})",
                entries=(listing.root,),
            )
        )
    writable = [
        i.name
        for i in listing.items
        if not i.is_symlink and i.kind is FileKind.ENTRY and i.mode & (stat.S_IWGRP | stat.S_IWOTH)
    ]
    if writable:
        findings.append(
            catalog.INSECURE_ENTRY_MODE.finding(
                count(len(writable), "entry is", "entries are") + " writable by group or others",
                entries=tuple(writable),
            )
        )
    foreign = [i.name for i in listing.items if i.kind is FileKind.ENTRY and i.uid != me]
    if foreign:
        findings.append(
            catalog.INSECURE_ENTRY_OWNER.finding(
                f"{count(len(foreign), 'entry is', 'entries are')} owned by another user",
                entries=tuple(foreign),
            )
        )
    links = [i.name for i in listing.items if i.is_symlink]
    if links:
        findings.append(
            catalog.INSECURE_SYMLINK.finding(
                count(len(links), "symbolic link") + " in the cache directory (not followed)",
                entries=tuple(links),
            )
        )
    return findings


def _who(mode: int) -> str:
    return " and ".join(
        w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit
    )
