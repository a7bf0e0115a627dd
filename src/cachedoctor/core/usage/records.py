"""The processes' stats records (``cachedoctor-stats/``), read and validated: what each process
asked the cache for and got, as JAX's monitoring events counted it (``stablekeys/stats.py``).
A torn or foreign file is a finding, never an error.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import math
import operator
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cachedoctor.cache import record_index
from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding
from cachedoctor.errors import os_reason
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.stablekeys.stats import (
    CONFIG_NAMES,
    COUNTERS,
    KEY_COUNTS,
    OUTCOMES,
    RECORD_FORMAT,
    RECORD_SUFFIX,
)
from cachedoctor.storage import fsops
from cachedoctor.storage.stores import Store

MAX_RECORD_BYTES = 1 << 20  # a record is a few KiB; anything larger is not one of ours

ARCHIVE_PREFIX = "archive-"  # cachedoctor-stats/archive-<UTC time>.jsonl: one per --zero
ARCHIVE_SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Counters:
    """Sums of the recorded counters (see stablekeys/stats.py for each one's JAX event).

    Each miss has at most one outcome: ``writes`` (the entry existed afterwards), a failed
    write, or one of JAX's refusals. Records written before outcomes were recorded count JAX's
    write event as a write, unchecked: those are ``unchecked_writes`` (part of ``writes``).
    """

    requests: int = 0
    hits: int = 0
    misses: int = 0
    writes: int = 0
    write_failures: int = 0  # JAX's put raised
    writes_lost: int = 0  # JAX's put returned, and no entry existed afterwards
    refused_process: int = 0  # JAX writes only from process 0
    refused_host_callbacks: int = 0
    refused_compile_time: int = 0  # under jax_persistent_cache_min_compile_time_secs
    refused_size: int = 0  # under jax_persistent_cache_min_entry_size_bytes
    unchecked_writes: int = 0  # of ``writes``: JAX's write event in an older record
    compile_secs: float = 0.0  # wall time of the compiles that missed
    saved_secs: float = 0.0  # JAX's compile_time_saved_sec, summed over hits
    retrieval_secs: float = 0.0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.requests if self.requests else None

    @property
    def checked_writes(self) -> int:
        """Writes whose entry existed afterwards."""
        return self.writes - self.unchecked_writes

    def __add__(self, other: Counters) -> Counters:
        return _make_counters(map(operator.add, _VALUES(self), _VALUES(other)))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": self.hit_rate}


_FIELDS = tuple(f.name for f in fields(Counters))
_VALUES = operator.attrgetter(*_FIELDS)  # a Counters' field values, in order
_ZERO = _VALUES(Counters())
_DEFAULTS = dict(zip(_FIELDS, _ZERO, strict=True))
assert all(getattr(Counters, n) == v for n, v in _DEFAULTS.items())  # class attributes: defaults


def _make_counters(values: Iterable[Any]) -> Counters:
    """A Counters of its field values in order, without ``__init__`` (frozen: a setattr per
    field; thousands of records hold hundreds of thousands of them)."""
    c = object.__new__(Counters)
    c.__dict__.update(zip(_FIELDS, values, strict=True))
    return c


def values_of(c: Counters) -> tuple[Any, ...]:
    """A Counters' field values, in order (what :func:`total_of` adds up)."""
    values: tuple[Any, ...] = _VALUES(c)
    return values


# each field: its getter from values_of, its zero, whether it is a count (ints, summed in C)
_COLUMNS = tuple((operator.itemgetter(n), zero, type(zero) is int) for n, zero in enumerate(_ZERO))


def total_of(rows: Iterable[tuple[Any, ...]]) -> Counters:
    """``Counters() + c1 + c2 + ...`` of the counters whose :func:`values_of` are ``rows``:
    each field summed in that order, one pass per field (the counts are ints, whose sum does not
    depend on the order; the times are added left to right, as ``+`` adds them: the same
    floats)."""
    rows = rows if isinstance(rows, list) else list(rows)
    return _make_counters(
        sum(map(column, rows)) if whole else functools.reduce(operator.add, map(column, rows), zero)
        for column, zero, whole in _COLUMNS
    )


def total_of_columns(tables: Iterable[list[tuple[Any, ...]]]) -> Counters:
    """:func:`total_of` of the rows of several tables (each a record's counters, as
    ``list(zip(*rows))``: one tuple per field; an empty table has none) in order: the counts
    summed per table first (ints: the same sum), the times added left to right over all rows."""
    tables = [t for t in tables if t]
    chain = itertools.chain.from_iterable
    return _make_counters(
        sum(sum(t[n]) for t in tables)
        if whole
        else functools.reduce(operator.add, chain(t[n] for t in tables), zero)
        for n, (_, zero, whole) in enumerate(_COLUMNS)
    )


def total(counters: Iterable[Counters]) -> Counters:
    """``Counters() + c1 + c2 + ...`` (see :func:`total_of`)."""
    return total_of(map(_VALUES, counters))


@dataclass(frozen=True)
class KeyCounts:
    """One key's counts in one record: JAX looked it up, got its executable, wrote it."""

    lookups: int = 0
    hits: int = 0
    writes: int = 0  # a miss whose entry existed afterwards (the module's ``writes`` outcome)


_KEY = operator.attrgetter(*KEY_COUNTS)


_KEY_COUNTS_MEMO: dict[tuple[int, ...], KeyCounts] = {}  # a few small counts: each made once


def _make_key_counts(values: Iterable[int]) -> KeyCounts:
    """One shared KeyCounts per distinct counts (frozen: sharing is safe; a record names up to
    16 keys a module, most with counts like (1, 1, 0))."""
    counts = tuple(values)
    k = _KEY_COUNTS_MEMO.get(counts)
    if k is None:
        if len(counts) != len(KEY_COUNTS):
            raise ValueError("key counts of another shape")
        k = object.__new__(KeyCounts)
        k.__dict__.update(zip(KEY_COUNTS, counts, strict=True))
        if len(_KEY_COUNTS_MEMO) < 4096:
            _KEY_COUNTS_MEMO[counts] = k
    return k


@dataclass(frozen=True)
class Record:
    """One process's record."""

    file: str
    host: str
    pid: int
    start: float
    end: float
    jax: str
    hook: str
    modules: dict[str, Counters]
    # the cache settings in force at the process's exit (stablekeys.stats.CONFIG_NAMES); empty
    # in records from before they were recorded
    config: dict[str, float] = field(default_factory=dict)
    # per key, over all modules (at most 16 keys a module); empty in records from before keys
    keys: dict[str, KeyCounts] = field(default_factory=dict)

    @property
    def day(self) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self.end))


# What every record the recorder writes obeys (docs/stats.md, "Reading"): counts are whole
# numbers, none negative; compile and retrieval times are not negative; every number is finite;
# a module's hits plus misses are at most its requests (JAX sends a hit only after a request,
# and the recorder counts a miss only for a request without one). saved_secs may be negative.
COUNTS = (*(n for n in COUNTERS if not n.endswith("_secs")), "lookups")  # whole; the rest: s
NEVER_NEGATIVE = ("compile_secs", "retrieval_secs")  # saved_secs may be: JAX's own difference


class RuleBroken(ValueError):
    """A record that parses but breaks a rule every recorded record keeps (above)."""


def _listed(store: Store) -> list[tuple[str, bool]]:
    try:
        items = store.list(STATS_DIRNAME)
    except FileNotFoundError:
        return []
    return [(i.name, i.is_dir) for i in items]


def _is_record_name(name: str, is_dir: bool) -> bool:
    return not is_dir and name.endswith(RECORD_SUFFIX) and not fsops.is_own_temp(name)


def _belongs(name: str, is_dir: bool) -> bool:
    """A record, an archive of ``stats --zero``, or a record being written."""
    if is_dir:
        return False
    if name.startswith(ARCHIVE_PREFIX) and name.endswith(ARCHIVE_SUFFIX):
        return True
    return name.endswith(RECORD_SUFFIX) or fsops.is_own_temp(name)


def record_files(store: Store) -> list[str]:
    return [name for name, is_dir in _listed(store) if _is_record_name(name, is_dir)]


def _number(module: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"module {module!r}: counter {name!r} is not a number")
    if not math.isfinite(value):
        raise RuleBroken(f"module {module!r}: {name} {json.dumps(value)} is not a finite number")
    if name in COUNTS and value != int(value):
        raise RuleBroken(f"module {module!r}: {name} {value} is not a whole number")
    if value < 0 and (name in COUNTS or name in NEVER_NEGATIVE):
        raise RuleBroken(f"module {module!r}: {name} {value} is negative")
    return value


_COUNT_NAMES = tuple(n for n in COUNTERS if n in COUNTS)
_TIME_NAMES = tuple(n for n in COUNTERS if n not in COUNTS)
_TIME_NEVER_NEGATIVE = tuple(n in NEVER_NEGATIVE for n in _TIME_NAMES)
_OLDER_OUTCOMES = tuple(n for n in OUTCOMES if n != "writes")  # absent from older records


def _plain(counts: list[Any], times: list[Any] | None = None) -> bool:
    """Whether the values keep every rule of :func:`_number` as they are (counts ints, not
    negative; times finite, those in NEVER_NEGATIVE not negative), checked a list at once:
    False sends them through ``_number``, which says which rule one breaks."""
    if not set(map(type, counts)) <= {int} or (counts and min(counts) < 0):
        return False
    if times is None:  # a key's counts: no times
        return True
    if not set(map(type, times)) <= {int, float} or not math.isfinite(sum(times)):
        return False  # a sum of finite numbers is finite unless it overflows: then the slow way
    return all(v >= 0 for v, never in zip(times, _TIME_NEVER_NEGATIVE, strict=True) if never)


def _counters(module: str, raw: object) -> Counters:
    if not isinstance(raw, dict):
        raise ValueError(f"module {module!r}: counters are not an object")
    counts = [raw.get(name, 0) for name in _COUNT_NAMES]
    times = [raw.get(name, 0) for name in _TIME_NAMES]
    values: dict[str, Any]
    if _plain(counts, times):
        values = dict(zip(_COUNT_NAMES, counts, strict=True))
        values["unchecked_writes"] = 0
        values.update(zip(_TIME_NAMES, times, strict=True))
    else:
        pairs = zip(_COUNT_NAMES, counts, strict=True)
        values = {name: int(_number(module, name, v)) for name, v in pairs}
        values["unchecked_writes"] = 0
        pairs = zip(_TIME_NAMES, times, strict=True)
        values.update((name, _number(module, name, v)) for name, v in pairs)
    if not any(name in raw for name in _OLDER_OUTCOMES):
        values["unchecked_writes"] = values["writes"]  # an older record: the write event
    c = object.__new__(Counters)  # every field set, in order: Counters.__init__ without its cost
    c.__dict__.update(values)
    for part, value in (("hits", c.hits), ("misses", c.misses)):
        if value > c.requests:
            raise RuleBroken(f"module {module!r}: {part} {value} > requests {c.requests}")
    if c.hits + c.misses > c.requests:
        raise RuleBroken(
            f"module {module!r}: hits + misses {c.hits + c.misses} > requests {c.requests}"
        )
    return c


def _key_counts(module: str, key: object, counts: dict[Any, Any]) -> KeyCounts:
    values = [counts.get(name, 0) for name in KEY_COUNTS]
    if not _plain(values):
        try:  # a count: whole, not negative
            values = [int(_number(module, n, v)) for n, v in zip(KEY_COUNTS, values, strict=True)]
        except RuleBroken as exc:
            raise RuleBroken(f"{exc} (key {key})") from None
        except ValueError as exc:
            raise ValueError(f"{exc} (key {key})") from None
    return _make_key_counts(values)


def _keys(module: str, raw: object, c: Counters) -> dict[str, KeyCounts]:
    """A module's ``keys``: each count whole and not negative, a key's hits at most its lookups,
    its hits plus writes at most the module's requests, and the keys' sums at most the module's
    own requests, hits and writes (each is counted in both, the key's only when it fits)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"module {module!r}: keys are not an object")
    out: dict[str, KeyCounts] = {}
    for key, counts in raw.items():
        if not isinstance(counts, dict):
            raise ValueError(f"module {module!r}: key {key!r}: counts are not an object")
        k = _key_counts(module, key, counts)
        if k.hits > k.lookups:
            raise RuleBroken(f"module {module!r}: key {key}: hits {k.hits} > lookups {k.lookups}")
        if k.hits + k.writes > c.requests:
            raise RuleBroken(
                f"module {module!r}: key {key}: hits + writes {k.hits + k.writes} > requests "
                f"{c.requests}"
            )
        out[str(key)] = k
    for name, limit in (("lookups", c.requests), ("hits", c.hits), ("writes", c.writes)):
        summed = sum(getattr(k, name) for k in out.values())
        if summed > limit:
            what = "requests" if name == "lookups" else name
            raise RuleBroken(f"module {module!r}: keys' {name} {summed} > {what} {limit}")
    return out


def _modules(raw: dict[Any, Any]) -> tuple[dict[str, Counters], dict[str, KeyCounts]]:
    modules: dict[str, Counters] = {}
    keys: dict[str, KeyCounts] = {}
    for name, counters in raw.items():
        c = modules[str(name)] = _counters(str(name), counters)
        for key, k in _keys(str(name), counters.get("keys"), c).items():
            prior = keys.get(key)  # a key under two module names: once summed
            if prior is not None:
                k = _make_key_counts(map(operator.add, _KEY(prior), _KEY(k)))
            keys[key] = k
    return modules, keys


def _config(raw: object) -> dict[str, float]:
    if not isinstance(raw, dict):
        return {}
    return {
        name: value
        for name, value in raw.items()
        if name in CONFIG_NAMES and isinstance(value, int | float) and not isinstance(value, bool)
    }


def parse_record(file: str, data: bytes) -> Record:
    """A record from its bytes; ValueError says why it is not one (``RuleBroken``: which rule
    its numbers break)."""
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"over {MAX_RECORD_BYTES} bytes, larger than any record")
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a {RECORD_FORMAT} record")
    modules = doc.get("modules")
    if not isinstance(modules, dict):
        raise ValueError("no 'modules' object")
    start, end = float(doc["start"]), float(doc["end"])
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuleBroken("start and end are not finite times")
    counters, keys = _modules(modules)
    return Record(
        file=file,
        host=str(doc.get("host", "?")),
        pid=int(doc.get("pid", 0)),
        start=start,
        end=end,
        jax=str(doc.get("jax", "")),
        hook=str(doc.get("hook", "")),
        modules=counters,
        config=_config(doc.get("config")),
        keys=keys,
    )


def read_records(store: Store, *, use_index: bool = True) -> tuple[list[Record], list[Finding]]:
    """Every record in ``cachedoctor-stats/``; each file that is not a sound record (torn,
    unreadable, foreign, or breaking a rule its recorder keeps) is a finding and is left out.

    Each record file is read and checked once: what that gave is kept in the records index
    (``cache/record_index.py``), from which a later call takes every file unchanged since."""
    try:
        listed = record_index.list_folder(store, STATS_DIRNAME, time.time())
    except FileNotFoundError:
        return [], []
    idx = record_index.load(store.url, remote=not store.is_local) if use_index else None
    got = read_listed(store, listed, idx)
    if idx is not None:
        idx.save(listed, got.fresh)
    return got.records, got.findings


@dataclass(frozen=True)
class FolderRead:
    """What :func:`read_listed` found: the records, the findings, the body of each file read
    anew (name -> body, for the index), and whether every record file's result may be kept
    (``complete``: none failed to be read)."""

    records: list[Record]
    findings: list[Finding]
    fresh: dict[str, str]
    complete: bool


def read_listed(
    store: Store, listed: list[record_index.Listed], idx: record_index.RecordIndex | None
) -> FolderRead:
    """The records and findings of the ``listed`` folder, the unchanged ones from ``idx``
    (saving nothing: the caller saves ``fresh``)."""
    served = {} if idx is None else idx.served(listed)
    fresh: dict[str, str] = {}  # name -> body, for the index
    records: list[Record] = []
    findings: list[Finding] = []
    complete = True
    for item in listed:
        name, is_dir = item.name, item.is_dir
        path = f"{STATS_DIRNAME}/{name}"
        if not _belongs(name, is_dir):
            findings.append(_foreign(path, is_dir))
            continue
        if not _is_record_name(name, is_dir):
            continue
        body = served.get(name)
        got = None if body is None else _thaw(name, path, body)
        if got is None:
            got, body = _read_one(store, name, path)
            if body is None:
                complete = False
            else:
                fresh[name] = body
        if isinstance(got, Record):
            records.append(got)
        else:
            findings.append(got)
    return FolderRead(records, findings, fresh, complete)


def _read_one(store: Store, name: str, path: str) -> tuple[Record | Finding, str | None]:
    """The file's record or finding, and its body for the index (None: never to be kept, the
    file could not be read)."""
    try:
        with store.open_read(path) as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        return _no_access(path, exc), None
    try:
        record = parse_record(name, data)
    except RuleBroken as exc:
        return _broken(path, str(exc)), _dumps(["broken", str(exc)])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        return _unreadable(path, str(exc)), _dumps(["unreadable", str(exc)])
    return record, _freeze(record)


# --- a record as the records index keeps it: JSON text of its fields, in order -----------------

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def _freeze(r: Record) -> str:
    modules = {name: sparse_counters(c) for name, c in r.modules.items()}
    keys = {key: _KEY(k) for key, k in r.keys.items()}
    return _dumps(["record", r.host, r.pid, r.start, r.end, r.jax, r.hook, r.config, modules, keys])


def sparse_counters(c: Counters) -> dict[str, Any]:
    """The fields of ``c`` that are not their default (most are 0 in a record): exactly, type
    and sign of zero included, so that the thawed Counters is the same."""
    return {
        name: value
        for name, value in zip(_FIELDS, _VALUES(c), strict=True)
        if type(value) is not type(_DEFAULTS[name])
        or value != _DEFAULTS[name]
        or math.copysign(1.0, value) < 0
    }


def thawed_counters(sparse: dict[str, Any]) -> Counters:
    """A Counters holding only the fields that are not their default: a field missing from an
    instance reads its class attribute, the dataclass's default (fields, ``==``, ``asdict`` and
    ``repr`` all read attributes), and 100,000 of them are made several times faster."""
    if not sparse.keys() <= _DEFAULTS.keys():
        raise ValueError("counters of another shape")
    c = object.__new__(Counters)
    c.__dict__.update(sparse)
    return c


def _thaw(name: str, path: str, body: str) -> Record | Finding | None:
    """What ``_freeze`` or a finding's body kept, or None when the body is not one of ours."""
    try:
        doc = json.loads(body)
        kind = doc[0]
        if kind == "broken" and len(doc) == 2:
            return _broken(path, str(doc[1]))
        if kind == "unreadable" and len(doc) == 2:
            return _unreadable(path, str(doc[1]))
        _, host, pid, start, end, jax, hook, config, modules, keys = doc
        return Record(
            file=name,
            host=host,
            pid=pid,
            start=start,
            end=end,
            jax=jax,
            hook=hook,
            modules={m: thawed_counters(v) for m, v in modules.items()},
            config=config,
            keys={k: _make_key_counts(v) for k, v in keys.items()},
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


@dataclass(frozen=True)
class KeyUse:
    """One key's counts summed over stats records (those of processes that ended after a time:
    a hit by a process that ended before an entry was written was not of that entry)."""

    key: str
    lookups: int
    hits: int
    writes: int
    processes: int  # records with a hit of the key
    last_hit_end: float | None  # the latest end of a record with a hit (epoch seconds)
    # the key policies of the recorded processes that wrote the key (any time)
    writers: frozenset[KeyPolicy] = frozenset()

    @property
    def pointer_writer(self) -> bool:
        """A recorded process wrote this key while JAX's key held the pointer, and none wrote
        it with the pointer left out: no later process computes it."""
        said = {p.hashes_pointer for p in self.writers}
        return said == {True}

    @property
    def evidence(self) -> str:
        """The records' word, quotable in a plan: hits, processes, when the last one ended."""
        if not self.hits or self.last_hit_end is None:
            return f"stats records: {self.lookups} lookups, no hit"
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.last_hit_end))
        hits = "1 hit" if self.hits == 1 else f"{self.hits} hits"
        by = "1 process" if self.processes == 1 else f"{self.processes} processes"
        return f"stats records: {hits} by {by}, last at {when}"


# key: (record end, counts, the writer's key policy) of each record naming it
KeyIndex = dict[str, tuple[tuple[float, KeyCounts, "KeyPolicy"], ...]]


@dataclass(frozen=True)
class KeyPolicy:
    """How a recording process computed its keys: its hook mode and JAX's pointer flag (None:
    a record from before the flag was recorded, or a JAX without it)."""

    hook: str
    pointer_removed: bool | None

    @property
    def hashes_pointer(self) -> bool | None:
        """Whether JAX's key of a custom_partitioning program held the per-process pointer in
        this process: the flag off and no stable hook (which computes its own key)."""
        if self.hook == "stable" or self.pointer_removed is None:
            return None
        return not self.pointer_removed


def policy_of(r: Record) -> KeyPolicy:
    flag = r.config.get("remove_ptr_from_key")
    return KeyPolicy(r.hook, None if flag is None else bool(flag))


def index_keys(records: list[Record]) -> KeyIndex:
    """Each key the records name, with every record's end time and counts of it."""
    found: dict[str, list[tuple[float, KeyCounts, KeyPolicy]]] = {}
    for r in records:
        policy = policy_of(r)
        for key, counts in r.keys.items():
            found.setdefault(key, []).append((r.end, counts, policy))
    return {key: tuple(seen) for key, seen in found.items()}


def key_use(index: KeyIndex, key: str, ended_after: float | None = None) -> KeyUse | None:
    """``key``'s counts summed over the records that name it and (when ``ended_after`` is
    given) ended after that time; None when no such record names it."""
    named = index.get(key, ())
    seen = [(end, k) for end, k, _ in named if ended_after is None or end > ended_after]
    writers = frozenset(p for _, k, p in named if k.writes)
    if not seen and not writers:
        return None
    hit_ends = [end for end, k in seen if k.hits]
    return KeyUse(
        key=key,
        lookups=sum(k.lookups for _, k in seen),
        hits=sum(k.hits for _, k in seen),
        writes=sum(k.writes for _, k in seen),
        processes=len(hit_ends),
        last_hit_end=max(hit_ends, default=None),
        writers=writers,
    )


def _broken(path: str, rule: str) -> Finding:
    return catalog.STATS_RECORD_BROKEN.finding(
        f"{path} breaks a rule of stats records ({rule}); it is left out of the totals",
        entries=(path,),
    )


def _unreadable(path: str, reason: str) -> Finding:
    return catalog.STATS_RECORD_UNREADABLE.finding(
        f"{path} is not a readable stats record ({reason}); it is left out",
        entries=(path,),
    )


def _no_access(path: str, exc: OSError) -> Finding:
    """A record the system would not let cachedoctor read: its bytes are unknown, so it is not
    called torn, and the advice is the one that lets it be read."""
    reason = os_reason(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        fix = (
            "make it readable to the user running cachedoctor (`chmod a+r` the file, or run as "
            "its owner): its numbers are then counted"
        )
    elif exc.errno == errno.ELOOP or "symbolic link" in reason:
        fix = (
            "the recorder never writes a link and cachedoctor never follows one: put the record "
            "it points to in its place, or remove the link"
        )
    else:
        fix = "run `stats` again once the storage answers; if it keeps failing, copy it out"
    return catalog.STATS_RECORD_NO_ACCESS.finding(
        f"{path} cannot be read ({reason}); it is left out",
        entries=(path,),
        reason=reason,
        fix=fix,
    )


def _foreign(path: str, is_dir: bool) -> Finding:
    what = "a folder" if is_dir else "a file"
    return catalog.STATS_RECORD_FOREIGN.finding(
        f"{path} is not a stats record ({what} named neither as a record, *{RECORD_SUFFIX}, "
        f"nor as an archive of `stats --zero`, {ARCHIVE_PREFIX}*{ARCHIVE_SUFFIX}); it is left out",
        entries=(path,),
    )
