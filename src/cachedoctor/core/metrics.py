"""``stats --format openmetrics`` / ``prometheus`` and ``cachedoctor.metrics``: the figures of
``stats`` (``core/stats.py``) as metric families, named as Prometheus names them, with the
entries and bytes the cache holds now. Plain data: ``render/openmetrics.py`` writes the text.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cachedoctor.core.stats import ModuleRow, StatsReport, collect_stats
from cachedoctor.core.usage.model import Counters, total
from cachedoctor.core.usage.reasons import ReasonKind
from cachedoctor.stablekeys.stats import OTHER_MODULE, OUTCOMES  # as the recorder names them
from cachedoctor.storage.location import Location

FIRST_OR_UNRECORDED = "first-or-unrecorded"  # the misses no recorded key change explains


@dataclass(frozen=True)
class Sample:
    name: str  # a counter's ends in _total
    labels: tuple[tuple[str, str], ...]
    value: int | float  # counts are ints


@dataclass(frozen=True)
class MetricFamily:
    """One metric as Prometheus names them: its unit in its name, a counter's samples ending
    in ``_total`` and its own name without it (as OpenMetrics requires)."""

    name: str
    type: str  # "counter" or "gauge"
    unit: str  # "", "seconds" or "bytes"
    help: str
    samples: tuple[Sample, ...]

    def to_dict(self) -> dict[str, Any]:
        samples = [
            {"name": s.name, "labels": dict(s.labels), "value": s.value} for s in self.samples
        ]
        return {**asdict(self), "samples": samples}


@dataclass(frozen=True)
class StatsMetrics:
    """The stats report as metric families, with the entries the cache holds now (None: the
    records are of other caches, whose folders are not listed)."""

    stats: StatsReport
    size: tuple[int, int] | None  # entries, bytes
    families: tuple[MetricFamily, ...]

    def value(self, sample: str, **labels: str) -> float | None:
        """One sample's value (every label but ``cache`` given), or None when there is none."""
        for family in self.families:
            for s in family.samples:
                if s.name == sample and {k: v for k, v in s.labels if k != "cache"} == labels:
                    return s.value
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"families": [f.to_dict() for f in self.families]}


def cache_size(where: Location, module: str | None = None) -> tuple[int, int]:
    """The entries the folder holds now (of ``module``, a name or glob) and their bytes, as
    ``scan`` counts them: a link named like an entry is none, a file under two names one."""
    from cachedoctor.cache.listdir import list_cache, module_of

    seen: set[int] = set()
    entries = size = 0
    for item in list_cache(where.store()).entries:
        name = module_of(item.key) if item.key else None
        if item.is_symlink or item.is_dir or not _matches(name, module):
            continue
        entries += 1
        if not item.ino or item.ino not in seen:
            seen.add(item.ino)
            size += item.size
    return entries, size


def _matches(name: str | None, pattern: str | None) -> bool:
    """As ``--module`` selects the records' modules (``usage/fold.py``)."""
    if pattern is None:
        return True
    return name is not None and (name == pattern or fnmatch.fnmatchcase(name, pattern))


def collect_metrics(
    cache_dir: Location,
    *,
    since: float | None = None,
    module: str | None = None,
    max_modules: int = 25,
) -> StatsMetrics:
    """:func:`collect_stats` as metric families, with the cache's entries and bytes now."""
    report = collect_stats(cache_dir, since=since, module=module)
    size = None if report.caches else cache_size(cache_dir, module)
    return metrics_of(report, size, max_modules=max_modules)


Rows = list[tuple[tuple[tuple[str, str], ...], float]]  # each sample's labels and value
HELP = {
    "processes": "Processes whose stats record is added up (one record each, written at exit).",
    "requests": "Lookups in JAX's persistent cache, by module and result (unfinished: in flight "
    "at exit).",
    "outcomes": "What became of each miss: written, a failed write, or refused by JAX.",
    "compile": "Compile time spent on misses, a first compile included.",
    "misses": "Misses, by why they missed (docs/openmetrics.md).",
    "cause": "Compile time spent on misses, by why they missed, shared out by misses.",
    "retrieval": "Time spent reading the entries that hit.",
    "saved": "Compile time saved by hits as JAX counts it: below 0 when the reads cost more.",
    "findings": "Findings of the stats records, by kind and severity.",
    "entries": "Entries in the cache now.",
    "bytes": "Bytes of the cache's entries now.",
}


def metrics_of(
    report: StatsReport, size: tuple[int, int] | None, *, max_modules: int = 25
) -> StatsMetrics:
    """The families of ``report`` (pure: no I/O). The first ``max_modules`` modules (most
    compile time spent on misses first) each have their own ``module`` label, the others add
    up under ``(other modules)``: a dashboard gets as many series as a table has rows."""
    cache = (("cache", report.cache or report.cache_dir),)
    kept = _modules_kept(report.modules, max_modules)

    def family(name: str, kind: str, unit: str, words: str, rows: Rows) -> MetricFamily:
        suffix = "_total" if kind == "counter" else ""
        samples = tuple(Sample(name + suffix, cache + labels, value) for labels, value in rows)
        return MetricFamily(name, kind, unit, words, samples)

    def per_module(field_name: str) -> Rows:
        return [((("module", m),), getattr(c, field_name)) for m, c in kept]

    requests: Rows = []
    for m, c in kept:
        unfinished = c.requests - c.hits - c.misses  # a request in flight at exit
        for result, n in (("hit", c.hits), ("miss", c.misses), ("unfinished", unfinished)):
            if n or result != "unfinished":
                requests.append(((("module", m), ("result", result)), n))
    causes = _cause_rows(report.modules)
    findings: dict[tuple[tuple[str, str], ...], float] = {}
    for f in report.findings:
        key = (("kind", f.kind.value), ("severity", f.severity.label))
        findings[key] = findings.get(key, 0) + 1
    t = report.totals
    outcomes: Rows = [((("outcome", o),), getattr(t, o)) for o in OUTCOMES]
    families = [
        family("cachedoctor_processes", "counter", "", HELP["processes"], [((), report.processes)]),
        family("cachedoctor_requests", "counter", "", HELP["requests"], requests),
        family("cachedoctor_miss_outcomes", "counter", "", HELP["outcomes"], outcomes),
        family("cachedoctor_compile_seconds", "counter", "seconds", HELP["compile"],
               per_module("compile_secs")),
        family("cachedoctor_misses", "counter", "", HELP["misses"],
               [((("cause", k),), n) for k, n, _ in causes]),
        family("cachedoctor_miss_compile_seconds", "counter", "seconds", HELP["cause"],
               [((("cause", k),), secs) for k, _, secs in causes]),
        family("cachedoctor_retrieval_seconds", "counter", "seconds", HELP["retrieval"],
               per_module("retrieval_secs")),
        family("cachedoctor_saved_seconds", "gauge", "seconds", HELP["saved"],
               per_module("saved_secs")),
        family("cachedoctor_findings", "gauge", "", HELP["findings"], sorted(findings.items())),
    ]  # fmt: skip
    if size is not None:
        families.append(family("cachedoctor_cache_entries", "gauge", "", HELP["entries"],
                               [((), size[0])]))  # fmt: skip
        families.append(family("cachedoctor_cache_size_bytes", "gauge", "bytes", HELP["bytes"],
                               [((), size[1])]))  # fmt: skip
    return StatsMetrics(report, size, tuple(families))


def _modules_kept(rows: Sequence[ModuleRow], max_modules: int) -> list[tuple[str, Counters]]:
    """The first ``max_modules`` modules, then one row of the rest (with the recorder's own
    ``(other modules)``) when there are any."""
    kept, rest = [], []
    for n, row in enumerate(rows):
        if n < max_modules and row.module != OTHER_MODULE:
            kept.append((row.module, row.counters))
        else:
            rest.append(row.counters)
    return kept + ([(OTHER_MODULE, total(rest))] if rest else [])


def _cause_rows(rows: Iterable[ModuleRow]) -> list[tuple[str, int, float]]:
    """Each cause of the misses with its misses and compile time, most compile time first.
    A module that never hit misses for its reason (``reasons.py``, its kind) unless that is
    ``unknown`` and its recorded misses have causes; any other module for the causes of its
    recorded misses (``why``: the first component of JAX's key that changed, or
    ``same-key``); the misses no cause explains are ``first-or-unrecorded``. JAX's records time
    a module's compiles, not each miss: the time is shared out by misses."""
    causes: dict[str, list[float]] = {}
    for row in rows:
        c = row.counters
        if not c.misses:
            continue
        said: list[tuple[str, int]] = []
        why = row.why if row.never_hit else None
        if why is not None and (why.kind is not ReasonKind.UNKNOWN or not row.causes):
            said.append((why.kind.value, c.misses))
        else:
            left = c.misses  # `why` reads every record, --since or not: never more than there are
            for cause in row.causes:
                n = min(cause.misses, left)
                name = cause.components[0] if cause.components else cause.verdict
                said.append((name, n))
                left -= n
            said.append((FIRST_OR_UNRECORDED, left))
        for name, n in said:
            if n:
                got = causes.setdefault(name, [0, 0.0])
                got[0] += n
                got[1] += c.compile_secs * n / c.misses
    return sorted(
        ((name, int(n), secs) for name, (n, secs) in causes.items()), key=lambda r: (-r[2], r[0])
    )
