"""Core of ``cachedoctor stats``: what the processes' records say about the cache's use.

The records (``usage/records.py``) are added up in total, per module, per day and per host, and
each module that never hit is explained by ``usage/reasons.py`` (as ``scan`` and ``lint`` explain
it) with the evidence at hand: the records (what JAX did with each miss), the cache itself (an
entry now, JAX's LRU in use) and the scan's key findings. The misses of every module whose
recorded keys say what changed get their causes from ``why`` (``miss_causes``), and the modules
come most compile time lost first: where a slow start's time went. ``--zero`` archives the
records into one file and removes them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding
from cachedoctor.core.usage import reasons, records_of
from cachedoctor.core.usage.fold import Fold, Total, fold_records, read_folded
from cachedoctor.core.usage.model import Counters, Record, total
from cachedoctor.core.usage.reasons import ModuleEvidence, Reason
from cachedoctor.core.usage.records import ARCHIVE_PREFIX, ARCHIVE_SUFFIX, record_files
from cachedoctor.core.usage.validate import MAX_RECORD_BYTES
from cachedoctor.core.why import MissCause, explain_misses, miss_causes
from cachedoctor.errors import os_reason
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.storage.location import Location

if TYPE_CHECKING:  # the scan is imported only when a module that never hit needs it
    from cachedoctor.core.scan.report import ScanReport

NEVER_HIT_MIN_PROCESSES = 3  # lint: a module that missed in this many processes, never hitting


@dataclass(frozen=True)
class ModuleRow:
    module: str
    processes: int  # processes that asked the cache for it
    counters: Counters
    never_hit: bool
    why: Reason | None = None  # for a module that never hit: why, and the evidence
    causes: tuple[MissCause, ...] = ()  # what changed in JAX's key, per recorded miss (why)

    @property
    def reason(self) -> str | None:
        return None if self.why is None else self.why.text

    @property
    def missed_because(self) -> str | None:
        """Why it missed, in one line: the never-hit reason, else its misses' causes."""
        if self.reason:
            return self.reason
        said = [f"{c.misses}× {c.words}" if c.misses > 1 else c.words for c in self.causes]
        return (
            "; ".join(said[:2]) + (f" (and {len(said) - 2} more)" if len(said) > 2 else "") or None
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "processes": self.processes,
            "never_hit": self.never_hit,
            "reason": self.reason,
            "reason_kind": None if self.why is None else self.why.kind.value,
            "reason_evidence": None if self.why is None else self.why.evidence,
            "miss_causes": [c.to_dict() for c in self.causes],
            **self.counters.to_dict(),
        }


@dataclass(frozen=True)
class Group:
    """A day or a host."""

    name: str
    processes: int
    counters: Counters

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "processes": self.processes, **self.counters.to_dict()}


@dataclass(frozen=True)
class StatsReport:
    cache_dir: str
    processes: int
    totals: Counters
    modules: tuple[ModuleRow, ...]  # most compile time lost on misses first
    days: tuple[Group, ...]
    hosts: tuple[Group, ...]
    findings: tuple[Finding, ...]  # unreadable records, modules that never hit
    since: float | None = None
    module_filter: str | None = None
    records_read: int = 0  # records in the folder, before --since and --module
    archives: tuple[str, ...] = ()  # the archive files --zero left (names in cachedoctor-stats/)
    # the caches that records of read-only runs added up name (the folder is then a records
    # folder, or holds them beside its own), with how many each: the rest are the folder's own
    caches: tuple[tuple[str, int], ...] = ()
    # folders outside the cache holding records of its read-only runs, with how many
    elsewhere: tuple[tuple[str, int], ...] = ()

    @property
    def records_of(self) -> tuple[tuple[str, int, bool], ...]:
        """Whose the figures are: each cache, with how many processes, and whether they used
        it read-only (the folder itself first, for the records that name no other cache)."""
        own = self.processes - sum(n for _, n in self.caches)
        mine = ((self.cache_dir, own, False),) if own or not self.caches else ()
        return mine + tuple((c, n, True) for c, n in self.caches)

    @property
    def cache(self) -> str | None:
        """The one cache the figures are for; None when the records are of several."""
        caches = self.records_of
        return caches[0][0] if len(caches) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache_dir": self.cache_dir,
            "cache": self.cache,
            "caches": [
                {"cache": c, "processes": n, "read_only": ro} for c, n, ro in self.records_of
            ],
            "read_only_records_elsewhere": [{"folder": f, "records": n} for f, n in self.elsewhere],
            "processes": self.processes,
            "since": self.since,
            "module_filter": self.module_filter,
            "totals": self.totals.to_dict(),
            "modules": [m.to_dict() for m in self.modules],
            "days": [d.to_dict() for d in self.days],
            "hosts": [h.to_dict() for h in self.hosts],
            "findings": [
                {
                    "kind": f.kind.value,
                    "severity": f.severity.label,
                    "module": f.module,
                    "message": f.message,
                    "advice": f.advice,
                    "files": list(f.entries),
                }
                for f in self.findings
            ],
        }


@dataclass(frozen=True)
class ZeroReport:
    archive: str | None  # where the records went (None on a dry run or with none to archive)
    records: tuple[str, ...]
    applied: bool
    left: tuple[tuple[str, str], ...] = ()  # (name, why) of each record neither read nor removed


def _evidence(
    module: str,
    counters: Counters,
    processes: int,
    fold: Fold,
    scan: ScanReport | None,
) -> ModuleEvidence:
    """What ``reasons.explain`` weighs for a module, as ``scan`` gathers it (rules/inventory);
    the records' settings (``reasons.settings_of``) and hook modes from ``fold``."""
    settings = fold.settings
    hooked = fold.hooks[0] if len(fold.hooks) == 1 else None  # every process ran in one mode
    if scan is None:
        return ModuleEvidence(module, counters, processes, settings, hooked=hooked)
    summary = scan.summary
    # the entries' own -atime files and the .lockfile, as scan judges them (orphans are none)
    lru = reasons.lru_evidence(summary.entry_atime_files, summary.lockfile, settings)
    held = {m.module: m for m in scan.modules}
    row = held.get(module)
    return ModuleEvidence(
        module,
        counters,
        processes,
        settings,
        held=row is not None,
        lru=lru,
        scan_kind=reasons.scan_kinds(scan.findings).get(module),
        atime_gap=reasons.atime_gap(summary.entries, summary.entry_atime_files, lru),
        undecodable=row.entries if row is not None and row.undecodable == row.entries else 0,
        entries=row.entries if row is not None else 0,
        hooked=hooked,
    )


def _group(t: Total) -> Group:
    return Group(t.name, t.processes, t.counters)


def summarise(
    cache_dir: str,
    records: list[Record],
    problems: list[Finding],
    scan: ScanReport | None,
    *,
    since: float | None = None,
    module: str | None = None,
    causes: Mapping[str, tuple[MissCause, ...]] | None = None,
) -> StatsReport:
    """Add the records up (pure: no I/O)."""
    fold = fold_records(records, problems, since=since, module=module)
    return report_of(cache_dir, fold, scan, causes)


def report_of(
    cache_dir: str,
    fold: Fold,
    scan: ScanReport | None,
    causes: Mapping[str, tuple[MissCause, ...]] | None = None,
) -> StatsReport:
    """The report of the records' fold, each module that never hit explained, each module's
    misses given their causes (pure: no I/O)."""
    rows = []
    for t in fold.modules:
        c = t.counters
        never = c.requests > 0 and c.hits == 0
        why = None
        if never:
            why = reasons.explain(_evidence(t.name, c, t.processes, fold, scan))
        rows.append(ModuleRow(t.name, t.processes, c, never, why, (causes or {}).get(t.name, ())))
    rows.sort(
        key=lambda m: (-m.counters.compile_secs, not m.never_hit, -m.counters.misses, m.module)
    )
    return StatsReport(
        cache_dir=cache_dir,
        processes=fold.processes,
        totals=total(t.counters for t in fold.modules),
        modules=tuple(rows),
        days=tuple(map(_group, fold.days)),
        hosts=tuple(map(_group, fold.hosts)),
        findings=fold.problems + tuple(never_hit_findings(rows)) + tuple(missed_findings(rows)),
        since=fold.since,
        module_filter=fold.module,
        records_read=fold.records_read,
        archives=fold.archives,
        caches=fold.caches,
    )


def never_hit_findings(
    rows: Iterable[ModuleRow], min_processes: int = NEVER_HIT_MIN_PROCESSES
) -> list[Finding]:
    """A module that compiled in ``min_processes`` or more processes and never hit."""
    findings = []
    for row in rows:
        why = row.why
        if not row.never_hit or why is None or row.processes < min_processes:
            continue
        findings.append(
            catalog.NEVER_HIT.finding(
                f"{row.module} asked the cache in {row.processes} processes and never hit "
                f"({row.counters.compile_secs:.2f} s compiling): {why.summary}",
                module=row.module,
                processes=str(row.processes),
                reason=why.kind.value,
                reason_evidence=why.evidence,
                the_reasons_advice=reasons.advice(why, row.module),
            )
        )
    return findings


def missed_findings(rows: Iterable[ModuleRow]) -> list[Finding]:
    """A module whose recorded misses say what changed in JAX's key (one finding per module
    and kind of cause); modules that never hit have their own finding."""
    findings = []
    for row in rows:
        if row.never_hit or not row.causes:
            continue
        for verdict, case in (
            ("changed", catalog.MISSED_KEY_CHANGED),
            ("same-key", catalog.MISSED_ENTRY_GONE),
        ):
            said = [c for c in row.causes if c.verdict == verdict]
            if not said:
                continue
            n = sum(c.misses for c in said)
            words = "; ".join(c.words for c in said[:2])
            components = sorted({name for c in said for name in c.components})
            c = row.counters
            findings.append(
                case.finding(
                    f"{row.module}: {n} miss{'es' if n != 1 else ''} because {words} (its"
                    f" {c.misses} miss{'es' if c.misses != 1 else ''} cost"
                    f" {c.compile_secs:.2f} s compiling)",
                    module=row.module,
                    components=", ".join(components) or "none",
                )
            )
    return findings


def _causes(where: Location, module: str | None) -> dict[str, tuple[MissCause, ...]]:
    """Each module's miss causes from the records' missed keys (none when unreadable)."""
    try:
        return miss_causes(
            explain_misses(
                where, module=module, program_detail=False, archived=False, only_given=True
            )
        )
    except OSError:
        return {}


def collect_stats(
    cache_dir: Location,
    *,
    since: float | None = None,
    module: str | None = None,
    scan: bool = True,
) -> StatsReport:
    """Read and add up the records of ``cache_dir``; ``scan`` explains modules that never hit."""
    where = cache_dir
    store = where.store()
    fold = read_folded(store, since=since, module=module)
    scanned = None
    if scan and fold.never_hit:  # only a module that never hit weighs the scan's evidence
        from cachedoctor.core.scan.run import scan_directory

        try:
            scanned = scan_directory(where, entries=False)
        except OSError:
            scanned = None  # the reasons then rest on the records alone
    report = report_of(where.spelling, fold, scanned, _causes(where, module))
    if not fold.caches:  # a cache: are its read-only runs' records elsewhere?
        return replace(report, elsewhere=read_only_elsewhere(where))
    named: dict[str, int] = {}  # one cache under two spellings (older records: JAX's) is one
    for cache, n in fold.caches:
        key = records_of.cache_named(cache)
        named[key] = named.get(key, 0) + n
    return replace(report, caches=tuple(sorted(named.items())))


def read_only_elsewhere(where: Location) -> tuple[tuple[str, int], ...]:
    """The folders outside the cache at ``where`` that hold records of its read-only runs
    (``usage/records_of.py``), with how many: ``stats`` adds up one folder's records, and
    says where the others are."""
    try:
        found = records_of.read_only_elsewhere(where)
    except OSError:
        return ()
    return tuple(
        (folder, n)
        for folder, records in found.items()
        if (n := sum(1 for r in records if r.cache_dir is not None))
    )


def record_findings(scan: ScanReport, where: Location) -> list[Finding]:
    """For ``lint``: unreadable records in ``where`` (the scanned cache), modules that
    compiled in :data:`NEVER_HIT_MIN_PROCESSES` or more processes without one hit (reasons
    from ``scan``), and modules whose recorded misses say what changed in their key."""
    fold = read_folded(where.store())
    return list(report_of(scan.cache_dir, fold, scan, _causes(where, None)).findings)


def zero(cache_dir: Location, *, apply: bool) -> ZeroReport:
    """Archive every record into one file ``cachedoctor-stats/archive-<time>.jsonl``, then
    delete each record that is unchanged since it was read (a process writing now keeps its)."""
    store = cache_dir.store()
    names = record_files(store)
    if not apply or not names:
        return ZeroReport(None, tuple(names), applied=False)
    versions = {i.name: i.version for i in store.list(STATS_DIRNAME)}
    lines, archived, left = [], [], []
    for name in names:
        try:  # a link is never followed (ELOOP): left where it is, with why
            with store.open_read(f"{STATS_DIRNAME}/{name}") as fh:
                lines.append(fh.read(MAX_RECORD_BYTES + 1).decode("utf-8", "replace").strip())
        except OSError as exc:
            left.append((name, os_reason(exc)))
            continue
        archived.append(name)
    if not archived:
        return ZeroReport(None, (), applied=True, left=tuple(left))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    archive = f"{STATS_DIRNAME}/{ARCHIVE_PREFIX}{stamp}{ARCHIVE_SUFFIX}"
    store.write_atomic(archive, ("\n".join(lines) + "\n").encode())
    for name in archived:
        store.delete_if_unchanged(f"{STATS_DIRNAME}/{name}", versions.get(name))
    return ZeroReport(store.url_of(archive), tuple(archived), applied=True, left=tuple(left))
