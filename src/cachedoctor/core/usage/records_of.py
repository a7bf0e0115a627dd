"""The records of one cache, wherever its processes put them.

A process that writes its cache records into the cache's own ``cachedoctor-stats/``. A process
that uses it read-only (``stablekeys/readonly.py``) writes nothing there: its record goes to
the records folder the user named (``records_dir``, ``$CACHEDOCTOR_RECORDS_DIR``), else to this
user's folder for that cache alone (``readonly.default_records_home``), and names the cache it
was of (``Record.cache_dir``). Records written before each cache had its own folder lie in one
folder for every cache (``readonly.default_records_root``); they are read there and told apart
by the cache they name, never moved.

So the folder a command is given is either a cache (its own records, and those of its read-only
runs found in the folders above) or a records folder (the records of the caches they name, and
each cache's own): :func:`records_by_cache` gives, per cache, every record of it, once.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from cachedoctor.core.findings import Finding
from cachedoctor.core.usage import records as usage_records
from cachedoctor.core.usage.model import Record
from cachedoctor.errors import CachedoctorError
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.stablekeys import readonly
from cachedoctor.storage.location import Location


@dataclass
class CacheRecords:
    """Every record of one cache that could be found, and where."""

    cache: str  # how records name it (``readonly.cache_identity``)
    location: Location | None  # the cache itself, where its entries are (None: not at hand)
    records: list[Record] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # the folders its records came from
    given: list[Record] = field(default_factory=list)  # of ``records``: the folder given's
    # of ``records``, those read from another folder, by folder
    elsewhere: dict[str, list[Record]] = field(default_factory=dict)

    @property
    def read_only_runs(self) -> int:
        return sum(1 for r in self.records if r.cache_dir is not None)


def identity(where: Location) -> str:
    """How a record names the cache at ``where`` (``readonly.cache_identity``)."""
    return readonly.cache_identity(where.spelling)


def records_folders(cache: str) -> list[Location]:
    """The folders besides the cache where its read-only runs may have put records: its own
    default folder, the folder every cache's went to before, and the records folder this
    environment names (``$CACHEDOCTOR_RECORDS_DIR``, ``enable --records-dir``)."""
    found = [readonly.default_records_home(cache), readonly.default_records_root()]
    with contextlib.suppress(Exception):  # a config that does not read: no folder named
        from cachedoctor.stablekeys import settings

        named = settings.records_dir(settings.load(check=False))
        if named:
            found.append(named)
    out: list[Location] = []
    for spelled in dict.fromkeys(found):
        where = Location.of_setting(spelled)
        if where is not None:
            out.append(where)
    return out


def _read(where: Location, archived: bool) -> tuple[list[Record], list[Finding]]:
    """A folder's records (none when it is not there or cannot be listed)."""
    folder = where.local_path  # None: a bucket, listed by its store
    if folder is not None and not os.path.isdir(os.path.join(folder, STATS_DIRNAME)):
        return [], []
    store = where.store()
    found, findings = usage_records.read_records(store)
    if archived:
        found = [*found, *usage_records.read_archived(store)]
    return found, findings


def _named(r: Record, folder: str) -> str:
    """The cache a record is of: the one it names, else the cache whose folder holds it."""
    return folder if r.cache_dir is None else cache_named(r.cache_dir)


@functools.lru_cache(maxsize=256)
def cache_named(named: str) -> str:
    """A record's cache as :func:`identity` names it: records written before the recorder
    resolved the cache's path hold JAX's own spelling (a link, ``..``, a trailing slash); a
    relative one, resolved against a working directory no longer known, is kept as it is."""
    where = Location.of_setting(named)
    if where is not None and (where.url is not None or os.path.isabs(named)):
        return readonly.cache_identity(named)
    return named


def records_by_cache(where: Location, *, archived: bool = True) -> list[CacheRecords]:
    """Per cache, its records: ``where``'s own, and those of the same cache in the other
    folders its processes record into. ``where`` is a cache unless every record in it names
    another one (a records folder). The findings are those of the folders that hold only this
    cache's records: ``where`` itself, the cache, its own default folder."""
    here = identity(where)
    own, own_findings = usage_records.read_records(where.store())
    if archived:
        own = [*own, *usage_records.read_archived(where.store())]
    named = list(dict.fromkeys(_named(r, here) for r in own))
    if not named or here in named or any(r.cache_dir is None for r in own):
        named = [here, *(c for c in named if c != here)]
    out = []
    for cache in named:
        location = where if cache == here else _location(cache)
        got = CacheRecords(cache, location, folders=[where.spelling])
        got.records = [r for r in own if _named(r, here) == cache]
        got.given = list(got.records)
        got.findings = list(own_findings) if cache == here or len(named) == 1 else []
        others = [] if location is None or cache == here else [location]
        _gather(got, [*others, *records_folders(cache)], archived, skip={here})
        out.append(got)
    for got in out:
        got.records = _once(got.records)
        kept = {id(r) for r in got.records}
        got.elsewhere = {
            f: [r for r in found if id(r) in kept] for f, found in got.elsewhere.items()
        }
    return out


def _location(cache: str) -> Location | None:
    """A cache a record names, where it can be read: a folder that is there, or a bucket."""
    where = Location.of_setting(cache)
    if where is None or (where.local_path is not None and not os.path.isdir(where.local_path)):
        return None
    return where


def _gather(got: CacheRecords, folders: Iterable[Location], archived: bool, skip: set[str]) -> None:
    """Add the records of ``got.cache`` that ``folders`` hold (each folder read once)."""
    own_home = readonly.default_records_home(got.cache)
    for folder in folders:
        ident = identity(folder)
        if ident in skip:
            continue
        skip.add(ident)
        try:
            found, findings = _read(folder, archived)
        except (OSError, CachedoctorError):
            if folder is got.location:
                got.location = None  # the cache itself: its entries are not at hand either
            continue  # a folder beside the one named, unreadable: no evidence, no failure
        mine = [r for r in found if _named(r, ident) == got.cache]
        if mine:
            got.records += mine
            got.folders.append(folder.spelling)
            got.elsewhere[folder.spelling] = mine
        if ident in (got.cache, identity(Location.local(own_home))):
            got.findings += findings


def _once(found: list[Record]) -> list[Record]:
    """Each process's record once (a folder read twice, a record copied), in the order found."""
    seen: set[tuple[str, int, float, float]] = set()
    out = []
    for r in found:
        mark = (r.host, r.pid, r.start, r.end)
        if mark not in seen:
            seen.add(mark)
            out.append(r)
    return out


def read_only_elsewhere(where: Location) -> dict[str, list[Record]]:
    """The records of the cache at ``where`` that lie outside it (its read-only runs'), by
    folder: the cache's own folder is not read again."""
    got = CacheRecords(identity(where), where)
    _gather(got, records_folders(got.cache), archived=False, skip={got.cache})
    got.records = _once(got.records)
    kept = {id(r) for r in got.records}
    return {f: [r for r in found if id(r) in kept] for f, found in got.elsewhere.items()}
