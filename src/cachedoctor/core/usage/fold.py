"""The stats records added up (the *fold*): totals per module, day and host, the records'
cache settings and the findings of files that are no sound record: everything ``stats`` and
``lint`` take from the records, before the scan's reasons are weighed (``core/stats.py``).

A fold of an unchanged records folder is kept in the records index (``cache/record_index.py``),
keyed by the digest of the folder's listing (each name with its size, mtime, inode and ctime)
and the options that shape it (``--since``, ``--module``): a repeated ``stats`` or ``lint`` lists
the folder, stats each file and reads one row instead of thousands of records. It is kept only
when every record file could be read and none changed in the last ``index.RACY_S``; it is served
only for the same listing, code (the index's header) and options; served or made anew, it is the
same values (JSON keeps each number's type and bits).
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Any

from cachedoctor.cache import record_index
from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.core.usage.model import (
    Counters,
    Record,
    sparse_counters,
    thawed_counters,
    total_of,
    total_of_columns,
    values_of,
)
from cachedoctor.core.usage.reasons import settings_of
from cachedoctor.core.usage.records import ARCHIVE_PREFIX, ARCHIVE_SUFFIX, read_listed
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.storage.stores import Store

_REQUESTS = 0  # values_of(c)[_REQUESTS] is c.requests
assert values_of(Counters(requests=1))[_REQUESTS] == 1
FORMAT = "fold-v3"  # the body's layout: in the key, so another is never read


@dataclass(frozen=True)
class Total:
    """A module, a day or a host: how many processes, and their counters summed in record
    order (a module's processes: those that asked the cache for it)."""

    name: str
    processes: int
    counters: Counters


@dataclass(frozen=True)
class Fold:
    records_read: int  # records in the folder, before --since and --module
    processes: int  # records added up
    modules: tuple[Total, ...]  # in the order the records first name them
    days: tuple[Total, ...]  # sorted; only days (hosts) of records with modules
    hosts: tuple[Total, ...]
    settings: dict[str, tuple[float, ...]]  # reasons.settings_of the records added up
    problems: tuple[Finding, ...]  # files that are no sound record
    since: float | None = None  # the options it was folded with
    module: str | None = None
    archives: tuple[str, ...] = ()  # the archives of --zero in the folder (names), sorted
    hooks: tuple[str, ...] = ()  # the hook's modes the records added up ran with, sorted
    # the caches that records of read-only runs name, with how many of the records added up
    # are each one's (the rest are of the cache whose folder holds them), sorted
    caches: tuple[tuple[str, int], ...] = ()

    @property
    def never_hit(self) -> bool:
        """Whether a module asked the cache and never hit (its reason needs the scan)."""
        return any(t.counters.requests > 0 and t.counters.hits == 0 for t in self.modules)


def fold_records(
    records: list[Record],
    problems: list[Finding],
    *,
    since: float | None = None,
    module: str | None = None,
) -> Fold:
    """Add the records up (pure: no I/O)."""
    read = len(records)
    if since is not None:
        records = [r for r in records if r.end >= since]
    if module is not None:
        records = [
            Record(**{**r.__dict__, "modules": _matching(r.modules, module)})
            for r in records
            if _matching(r.modules, module)
        ]
    per_record = [list(map(values_of, r.modules.values())) for r in records]
    each: dict[str, list[tuple[Any, ...]]] = defaultdict(list)  # each module's, in record order
    for r, values in zip(records, per_record, strict=True):
        for name, v in zip(r.modules, values, strict=True):
            each[name].append(v)
    tables = [list(zip(*values, strict=True)) for values in per_record]
    modules = tuple(
        Total(name, sum(1 for v in vs if v[_REQUESTS]), total_of(vs)) for name, vs in each.items()
    )
    return Fold(
        records_read=read,
        processes=len(records),
        modules=modules,
        days=_groups(records, tables, lambda r: r.day),
        hosts=_groups(records, tables, lambda r: r.host),
        settings=settings_of(records),
        problems=tuple(problems),
        since=since,
        module=module,
        hooks=tuple(sorted({r.hook for r in records})),
        caches=tuple(sorted(Counter(r.cache_dir for r in records if r.cache_dir).items())),
    )


def _matching(modules: dict[str, Counters], pattern: str) -> dict[str, Counters]:
    return {n: c for n, c in modules.items() if n == pattern or fnmatch.fnmatchcase(n, pattern)}


def _groups(
    records: list[Record], tables: list[list[tuple[Any, ...]]], key: Any
) -> tuple[Total, ...]:
    """The records by ``key`` (a group only of records with modules), each group's counters
    summed in record order (``tables``: each record's counters by field, as
    ``model.total_of_columns`` takes them)."""
    counters: dict[str, list[list[tuple[Any, ...]]]] = defaultdict(list)
    processes: dict[str, int] = defaultdict(int)
    for r, table in zip(records, tables, strict=True):
        name = key(r)
        processes[name] += 1
        if table:
            counters[name].append(table)
    return tuple(Total(n, processes[n], total_of_columns(counters[n])) for n in sorted(counters))


def read_folded(
    store: Store, *, since: float | None = None, module: str | None = None, use_index: bool = True
) -> Fold:
    """The fold of ``store``'s records folder: the one kept for its listing and these options
    when there is one, else the records read (the unchanged ones from the index) and added up."""
    try:
        listed = record_index.list_folder(store, STATS_DIRNAME, time.time())
    except FileNotFoundError:
        return fold_records([], [], since=since, module=module)
    archives = tuple(
        i.name
        for i in listed
        if i.name.startswith(ARCHIVE_PREFIX) and i.name.endswith(ARCHIVE_SUFFIX)
    )  # sorted, as listed
    idx = record_index.load(store.url, remote=not store.is_local) if use_index else None
    digest = record_index.listing_digest(listed)
    options = json.dumps([FORMAT, since, module])
    if idx is not None and digest is not None:
        body = idx.fold(digest, options)
        kept = None if body is None else thaw(body)
        if kept is not None:
            idx.close()
            return kept
    got = read_listed(store, listed, idx)
    fold = replace(
        fold_records(got.records, got.findings, since=since, module=module), archives=archives
    )
    if idx is not None:
        kept_as = None if digest is None or not got.complete else (digest, options, freeze(fold))
        idx.save(listed, got.fresh, kept_as)
    return fold


# --- a fold as the index keeps it: JSON text of its fields, in order ---------------------------

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def _total(t: Total) -> list[Any]:
    return [t.name, t.processes, sparse_counters(t.counters)]


def _finding(f: Finding) -> list[Any]:
    return [f.kind.value, int(f.severity), f.message, f.advice, f.evidence, f.entries, f.module]


def freeze(fold: Fold) -> str:
    return _dumps(
        [
            FORMAT,
            fold.records_read,
            fold.processes,
            [_total(t) for t in fold.modules],
            [_total(t) for t in fold.days],
            [_total(t) for t in fold.hosts],
            fold.settings,
            [_finding(f) for f in fold.problems],
            fold.since,
            fold.module,
            fold.archives,
            fold.hooks,
            fold.caches,
        ]
    )


def _thawed_total(row: list[Any]) -> Total:
    name, processes, sparse = row
    if not isinstance(name, str) or type(processes) is not int or not isinstance(sparse, dict):
        raise ValueError("not a total")
    return Total(name, processes, thawed_counters(sparse))


def _thawed_finding(row: list[Any]) -> Finding:
    kind, severity, message, advice, evidence, entries, module = row
    return Finding(
        FindingKind(kind),
        Severity(severity),
        str(message),
        str(advice),
        str(evidence),
        tuple(map(str, entries)),
        None if module is None else str(module),
    )


def thaw(body: str) -> Fold | None:
    """What :func:`freeze` kept, or None when the body is not one of ours."""
    try:
        doc = json.loads(body)
        (
            fmt,
            read,
            processes,
            modules,
            days,
            hosts,
            settings,
            problems,
            since,
            module,
            archives,
            hooks,
            caches,
        ) = doc
        if fmt != FORMAT or type(read) is not int or type(processes) is not int:
            return None
        if not (since is None or type(since) in (int, float)) or not (
            module is None or isinstance(module, str)
        ):
            return None
        return Fold(
            records_read=read,
            processes=processes,
            modules=tuple(map(_thawed_total, modules)),
            days=tuple(map(_thawed_total, days)),
            hosts=tuple(map(_thawed_total, hosts)),
            settings={str(k): tuple(v) for k, v in settings.items()},
            problems=tuple(map(_thawed_finding, problems)),
            since=since,
            module=module,
            archives=tuple(map(str, archives)),
            hooks=tuple(map(str, hooks)),
            caches=tuple((str(c), int(n)) for c, n in caches),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
