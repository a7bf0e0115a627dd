"""Why a module is not cached: one answer for ``scan`` (``not-stored``), ``stats`` and ``lint``
(``never-hit``), each resting on evidence that it quotes, and ``unknown`` without any.

The evidence: the stats records (``records.py``: per module, what became of each miss, as JAX's
``compiler._cache_write`` decided it, and the cache settings each process ran with), the cache's
listing (does it hold an entry of the module now; ``-atime`` files and ``.lockfile``: JAX's LRU in
use) and the scan's own key findings (``unstable-key``, ``relocated``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cachedoctor.core.findings import Finding, FindingKind
from cachedoctor.core.usage.model import Counters, Record
from cachedoctor.errors import count
from cachedoctor.stablekeys.stats import CONFIG_NAMES


class ReasonKind(enum.StrEnum):
    HOST_CALLBACKS = "host-callbacks"
    UNDER_MIN_COMPILE_TIME = "under-min-compile-time"
    UNDER_MIN_SIZE = "under-min-size"
    NOT_FIRST_PROCESS = "not-first-process"
    READ_ONLY = "read-only"
    WRITE_FAILED = "write-failed"
    EVICTED_BY_LRU = "evicted-by-lru"
    REMOVED = "removed"
    UNSTABLE_KEY = "unstable-key"
    RELOCATED = "relocated"
    UNDECODABLE = "undecodable"
    ONE_PROCESS = "one-process"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Reason:
    kind: ReasonKind
    summary: str  # what happened, in a few words
    evidence: str  # what that rests on, quoted
    recorded: bool = True  # False: no stats record of the module, so nothing JAX said is known
    # the hook's mode its key manifests show ("stable", "observe"; None: no manifest): every
    # mode records, and `enable --stats-only` would turn its keys or manifests off
    hooked: str | None = None

    @property
    def text(self) -> str:
        return f"{self.summary} ({self.evidence})"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind.value, "summary": self.summary, "evidence": self.evidence}


@dataclass(frozen=True)
class ModuleEvidence:
    """What is known of one module. ``counters``: its records summed (None: no record of it);
    ``settings``: each cache setting's values in those records; ``held``: whether the cache
    holds an entry of it now (None: not looked); ``lru``: what shows JAX's LRU in use (None:
    nothing does); ``entries``: how many entries of it the cache holds (None: not looked);
    ``hooked``: the hook's mode its key manifests (or all records) show; ``scan_kind``: the
    scan's key finding on its entries; ``atime_gap``: entries without an ``-atime`` file while
    the LRU is in use (its eviction pass then raises); ``undecodable``: entries of it held,
    none of which decodes."""

    module: str
    counters: Counters | None = None
    processes: int = 0
    settings: Mapping[str, tuple[float, ...]] | None = None
    held: bool | None = None
    lru: str | None = None
    scan_kind: FindingKind | None = None
    atime_gap: int = 0  # entries without an -atime file while JAX's LRU is in use
    undecodable: int = 0  # the cache holds this many entries of it, and none decodes
    entries: int | None = None  # the cache holds this many entries of it (None: not looked)
    hooked: str | None = None  # the hook's mode in its key manifests (None: none seen)


_JAX_NAME = {name: f"jax_{jax_name}" for name, jax_name in CONFIG_NAMES.items()}
_REFUSED_LOG = (
    "JAX_EXPLAIN_CACHE_MISSES=1 shows JAX's log: \"Not writing persistent cache entry for '{m}' "
    'because {why}"'
)


def settings_of(records: Iterable[Record]) -> dict[str, tuple[float, ...]]:
    """Each cache setting's distinct values across the records, smallest first."""
    seen: dict[str, set[float]] = {}
    for r in records:
        for name, value in r.config.items():
            seen.setdefault(name, set()).add(value)
    return {name: tuple(sorted(values)) for name, values in seen.items()}


def _setting(ev: ModuleEvidence, name: str) -> str | None:
    values = (ev.settings or {}).get(name)
    if not values:
        return None
    return f"{_JAX_NAME[name]} = {_values(values)} in the records"


def _values(values: Iterable[float]) -> str:
    return " or ".join(str(int(v)) if float(v).is_integer() else f"{v:g}" for v in values)


def atime_gap(entries: int, atime_files: int, lru: str | None) -> int:
    """How many more entries than ``-atime`` files while JAX's LRU is in use (else 0)."""
    return max(0, entries - atime_files) if lru else 0


def lru_evidence(
    atime_files: int, lockfile: bool, settings: Mapping[str, tuple[float, ...]]
) -> str | None:
    """What shows JAX's LRU in use, or None: ``-atime`` files (else a ``.lockfile``) in the
    cache, and a positive ``jax_compilation_cache_max_size`` in the records."""
    parts = []
    if atime_files:
        parts.append(f"{atime_files} -atime files")
    elif lockfile:
        parts.append(".lockfile")
    sizes = [v for v in settings.get("max_size", ()) if v > 0]
    if sizes:
        parts.append(f"jax_compilation_cache_max_size = {_values(sizes)} in the records")
    return ", ".join(parts) or None


def summed(records: Iterable[Record], module: str) -> tuple[Counters | None, int]:
    """The module's counters over the records, and how many processes asked for it."""
    total: Counters | None = None
    processes = 0
    for r in records:
        c = r.modules.get(module)
        if c is None:
            continue
        total = c if total is None else total + c
        processes += 1 if c.requests else 0
    return total, processes


def scan_kinds(findings: Iterable[Finding]) -> dict[str, FindingKind]:
    """Module -> the scan's key finding on its entries (unstable key, relocated)."""
    kinds: dict[str, FindingKind] = {}
    for f in findings:
        if f.kind not in (FindingKind.UNSTABLE_KEY, FindingKind.RELOCATED):
            continue
        modules = {f.module} if f.module else {k.rsplit("-", 1)[0] for k in f.entries}
        for module in modules:
            kinds.setdefault(module, f.kind)
    return kinds


def explain(ev: ModuleEvidence) -> Reason:
    """Why ``ev.module`` is not cached, first match wins: what JAX did with its misses when it
    wrote nothing; an entry written and gone; the scan's key findings; one process so far."""
    c = ev.counters
    if c is None:
        return _without_records(ev)
    if c.writes == 0:
        return _not_written(ev, c)
    if ev.held is False:
        return _gone(ev, c)
    if ev.undecodable:
        return Reason(
            ReasonKind.UNDECODABLE,
            "undecodable",
            f"the cache holds {count(ev.undecodable, 'entry', 'entries')} of it and none "
            "decodes (scan finding corrupt or unreadable): JAX cannot load them",
        )
    if ev.scan_kind is not None:
        label = "unstable key" if ev.scan_kind is FindingKind.UNSTABLE_KEY else "relocated"
        return Reason(ReasonKind(ev.scan_kind.value), label, f"scan finding {ev.scan_kind.value}")
    if ev.lru is not None and ev.entries is not None and c.checked_writes > ev.entries:
        return Reason(
            ReasonKind.EVICTED_BY_LRU,
            "evicted by JAX's LRU",
            f"stats records: {count(c.checked_writes, 'write')} whose entry existed afterwards; "
            f"the cache holds {count(ev.entries, 'entry', 'entries')} of it now: "
            f"{c.checked_writes - ev.entries} written and gone; JAX's LRU is in use ({ev.lru})",
        )
    if ev.processes == 1:
        return Reason(
            ReasonKind.ONE_PROCESS, "asked by one process so far", "stats records of 1 process"
        )
    where = "the cache holds an entry of it" if ev.held else "the cache was not looked at"
    lru = f"; JAX's LRU is in use ({ev.lru}): it may have evicted it between runs" if ev.lru else ""
    return Reason(
        ReasonKind.UNKNOWN,
        "no evidence of why",
        f"JAX wrote it {c.writes} times and {where}{lru}; `cachedoctor diff --module "
        f"{ev.module}` compares its keys",
        hooked=ev.hooked,
    )


def _without_records(ev: ModuleEvidence) -> Reason:
    lru = f"; JAX's LRU is in use ({ev.lru}): it may have evicted it" if ev.lru else ""
    if ev.hooked:  # the hook ran, and records in every mode: its records are gone or unwritten
        how = (
            f"its key manifests show the hook ran in {ev.hooked} mode, which records too: the "
            "records of those runs were archived (`stats --zero`), removed or never written"
        )
    else:
        how = "`cachedoctor enable --stats-only` records why JAX does not store a module"
    return Reason(
        ReasonKind.UNKNOWN,
        "no evidence of why",
        f"no stats record of {ev.module}{lru}; {how}",
        recorded=False,
        hooked=ev.hooked,
    )


def _not_written(ev: ModuleEvidence, c: Counters) -> Reason:
    """No write of it succeeded: the most frequent of JAX's refusals and failed writes."""
    m = ev.module
    outcomes = (
        (c.refused_host_callbacks, ReasonKind.HOST_CALLBACKS),
        (c.write_failures + c.writes_lost, ReasonKind.WRITE_FAILED),
        (c.refused_size, ReasonKind.UNDER_MIN_SIZE),
        (c.refused_compile_time, ReasonKind.UNDER_MIN_COMPILE_TIME),
        (c.refused_process, ReasonKind.NOT_FIRST_PROCESS),
        (c.refused_read_only, ReasonKind.READ_ONLY),
    )
    n, kind = max(outcomes, key=lambda o: o[0])  # the first of equals
    of = f"{n} of {c.misses} misses"
    if n == 0:
        return Reason(
            ReasonKind.UNKNOWN,
            "JAX wrote no entry; the records do not say why",
            f"stats records: {c.misses} misses without a recorded outcome (records from before "
            "cachedoctor recorded one, or compiles that raised)",
        )
    if kind is ReasonKind.HOST_CALLBACKS:
        return Reason(
            kind,
            "this JAX does not store a module with host callbacks (jax.debug.print, "
            "pure_callback, io_callback)",
            f"stats records: {of} compiled with host callbacks; "
            + _REFUSED_LOG.format(m=m, why="it uses host callbacks"),
        )
    if kind is ReasonKind.WRITE_FAILED:
        return Reason(kind, "JAX's writes failed", _failed_writes(ev, c))
    if kind is ReasonKind.UNDER_MIN_SIZE:
        return Reason(
            kind,
            "JAX does not store an entry under its minimum entry size",
            f"stats records: {of} reached JAX's put, which wrote nothing and sent no write event, "
            f"with {_setting(ev, 'min_entry_size_bytes') or 'the minimum entry size above 0'}; "
            f'JAX logs "Not writing persistent cache entry with key ... since its size"',
        )
    if kind is ReasonKind.UNDER_MIN_COMPILE_TIME:
        setting = _setting(ev, "min_compile_time_secs") or "a minimum compile time above 0"
        return Reason(
            kind,
            "JAX does not store a module that compiles faster than its minimum compile time",
            f"stats records: {of} not put by JAX, in process 0, with "
            f"{setting} ({c.compile_secs / max(c.misses, 1):.2f} s per compile call); "
            + _REFUSED_LOG.format(m=m, why="it took < ... seconds to compile"),
        )
    if kind is ReasonKind.READ_ONLY:
        return Reason(
            kind,
            "the processes used the cache read-only",
            f"stats records: {of} in processes with `read_only` (cachedoctor enable --read-only"
            " or CACHEDOCTOR_READ_ONLY): JAX's put ran and stored nothing",
        )
    return Reason(
        kind,
        "JAX writes entries only from process 0",
        f"stats records: {of} in processes whose jax.distributed process_id is not 0; JAX "
        'logs "Not writing persistent cache entry since process_id != 0"',
    )


def _failed_writes(ev: ModuleEvidence, c: Counters) -> str:
    parts = []
    if c.write_failures:
        parts.append(
            f"{c.write_failures} of {c.misses} misses sent JAX's write event and then its put "
            'raised; JAX warns "Error writing persistent compilation cache entry for '
            f"'{ev.module}'\""
        )
    if c.writes_lost:
        size = _setting(ev, "max_size")
        limit = f" (JAX's LRU drops an entry larger than its limit: {size})" if size else ""
        parts.append(
            f"{c.writes_lost} of {c.misses} misses sent JAX's write event, its put returned and "
            f"no entry file existed afterwards{limit}"
        )
    said = "stats records: " + "; ".join(parts)
    if ev.atime_gap:
        said += (
            f"; the listing: {ev.atime_gap} more entries than -atime files while JAX's LRU is "
            "in use: up to 0.10 its eviction pass raises FileNotFoundError on an entry without "
            "one (0.12 evicts it first; `cachedoctor prune --repair --apply` recreates them)"
        )
    return said


def _gone(ev: ModuleEvidence, c: Counters) -> Reason:
    """Written, and the cache holds no entry of it now."""
    if c.checked_writes == 0:
        return Reason(
            ReasonKind.UNKNOWN,
            "written, and gone now: evicted, removed or a failed write",
            f"stats records: JAX sent its write event {c.writes} times (records from before "
            "cachedoctor checked that the entry was written) and the cache holds no entry of it",
        )
    written = f"stats records: {c.checked_writes} writes whose entry existed afterwards"
    if ev.lru is not None:
        return Reason(
            ReasonKind.EVICTED_BY_LRU,
            "evicted by JAX's LRU",
            f"{written}; the cache holds no entry of it now; JAX's LRU is in use ({ev.lru})",
        )
    return Reason(
        ReasonKind.REMOVED,
        "written, then removed by something other than JAX",
        f"{written}; the cache holds no entry of it now and shows no sign of JAX's LRU "
        "(no -atime files, no .lockfile): `cachedoctor prune`, a cleanup job or a person",
    )


def advice(reason: Reason, module: str) -> str:
    """One line: what to do about a module not cached for ``reason``."""
    kind = reason.kind
    if kind is ReasonKind.HOST_CALLBACKS:
        return (
            f"{module} recompiles every run: move the jax.debug.print / pure_callback / "
            "io_callback out of the jitted function, or accept it"
        )
    if kind is ReasonKind.UNDER_MIN_COMPILE_TIME:
        return "lower jax_persistent_cache_min_compile_time_secs to store it (`cachedoctor enable`)"
    if kind is ReasonKind.UNDER_MIN_SIZE:
        return "lower jax_persistent_cache_min_entry_size_bytes to store it"
    if kind is ReasonKind.NOT_FIRST_PROCESS:
        return "process 0 writes it; check that process 0 uses the same cache directory"
    if kind is ReasonKind.READ_ONLY:
        return "a job that may write (main's, not a PR's) stores it; nothing to do here"
    if kind is ReasonKind.WRITE_FAILED:
        return (
            "run with JAX's warnings visible (\"Error writing persistent compilation cache "
            "entry\") to see why; `cachedoctor scan` checks the cache's files"
        )
    if kind is ReasonKind.EVICTED_BY_LRU:
        return "raise jax_compilation_cache_max_size, or `cachedoctor prune` what never hits"
    if kind is ReasonKind.REMOVED:
        return "find what removes entries (prune schedules, cleanup jobs)"
    if kind is ReasonKind.ONE_PROCESS:
        return "nothing yet: the next process hits if its key is the same"
    explain = (
        "JAX_EXPLAIN_CACHE_MISSES=1 (JAX logs a compile under the minimum time, an entry under "
        "the minimum size, and up to JAX 0.10 host callbacks)"
    )
    if not reason.recorded and reason.hooked:  # never --stats-only: it turns the hook's keys off
        return f"run it again with the hook on ({reason.hooked} mode records), or with {explain}"
    if not reason.recorded:  # nothing JAX said is known: ask for its words, guess nothing
        return (
            "record JAX's reason: `cachedoctor enable --stats-only` (stats records), or run "
            f"with {explain}"
        )
    if reason.hooked == "stable":  # its keys are stable keys already
        return f"run `cachedoctor diff --module {module}` to see what changes its key"
    return (
        f"run `cachedoctor diff --module {module}` to see what changes its key, "
        "`cachedoctor enable` for stable keys"
    )
