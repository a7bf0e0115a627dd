"""What a stats record holds (``Counters``, ``KeyCounts``, ``Record``), made fast, and added up.

Kept apart from reading and checking a record (``records.py``, ``validate.py``): everything that
adds records up (``fold.py``, ``core/stats.py``), explains them (``reasons.py``) or renders them
needs only these values. Thousands of records hold hundreds of thousands of counters, so they
are made without ``__init__`` and summed a field at a time.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cachedoctor.stablekeys.stats import KEY_COUNTS


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
    refused_read_only: int = 0  # the process used the cache read-only: stored nothing
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


KEY_VALUES = operator.attrgetter(*KEY_COUNTS)  # a KeyCounts' counts, in KEY_COUNTS order


_KEY_COUNTS_MEMO: dict[tuple[int, ...], KeyCounts] = {}  # a few small counts: each made once


def make_key_counts(values: Iterable[int]) -> KeyCounts:
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
class MissedKey:
    """What went into a key JAX looked up and did not find (``stablekeys/misskeys.py``): one
    digest per component of JAX's key, in JAX's order, and the hashed pieces of the small ones.
    ``kind`` is ``jax`` (JAX's own key) or ``stable`` (the stable hook's)."""

    key: str
    module: str
    kind: str
    time: float
    outcome: str | None
    components: tuple[tuple[str, str], ...]
    values: dict[str, tuple[str, ...]]
    devices: dict[str, Any] | None = None
    metadata_in_key: bool | None = None
    # JAX settings that change the program it lowers (misskeys.LOWERING_SETTINGS), in force then
    settings: dict[str, Any] | None = None

    def digest(self, component: str) -> str | None:
        return dict(self.components).get(component)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "module": self.module,
            "kind": self.kind,
            "time": self.time,
            "outcome": self.outcome,
            "components": [list(c) for c in self.components],
            "values": {k: list(v) for k, v in self.values.items()},
            "devices": self.devices,
            "metadata_in_key": self.metadata_in_key,
            "settings": self.settings,
        }


def _scalars(doc: dict[Any, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in doc.items() if isinstance(v, (bool, int, float, str, type(None)))}


def missed_key_of(key: str, doc: Any) -> MissedKey | None:
    """A record's ``missed`` entry, or None when it is not one the recorder writes (left out:
    the record's counts stay good)."""
    try:
        components = tuple((str(n), str(d)) for n, d in doc["components"])
        if not components or any(len(d) != 64 for _, d in components):
            return None
        values = {str(k): tuple(str(x) for x in v) for k, v in (doc.get("values") or {}).items()}
        devices = doc.get("devices")
        meta = doc.get("metadata_in_key")
        settings = doc.get("settings")
        return MissedKey(
            key=str(key),
            module=str(doc["module"]),
            kind=str(doc["kind"]),
            time=float(doc["time"]),
            outcome=None if doc.get("outcome") is None else str(doc["outcome"]),
            components=components,
            values=values,
            devices=devices if isinstance(devices, dict) else None,
            metadata_in_key=meta if isinstance(meta, bool) else None,
            settings=_scalars(settings) if isinstance(settings, dict) else None,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class LoadFailure:
    """JAX's load of an entry raised (``stablekeys/stats.py``): its error, and the file's size,
    modification time and inode then (None on a bucket, or when it could not be stat'ed)."""

    key: str
    module: str
    time: float
    error: str  # the exception's type name, as JAX's warning shows it
    message: str
    size: int | None = None
    mtime_ns: int | None = None
    ino: int | None = None

    def to_dict(self) -> dict[str, Any]:
        file = None
        if self.size is not None:
            file = {"size": self.size, "mtime_ns": self.mtime_ns, "ino": self.ino}
        return {
            "module": self.module,
            "time": self.time,
            "error": self.error,
            "message": self.message,
            "file": file,
        }


def load_failure_of(key: str, doc: Any) -> LoadFailure | None:
    """A record's ``load_failures`` entry, or None when it is not one the recorder writes."""
    try:
        file = doc.get("file")
        ident: tuple[int | None, ...] = (None, None, None)
        if isinstance(file, dict):
            values = tuple(file.get(n) for n in ("size", "mtime_ns", "ino"))
            if all(type(v) is int and v >= 0 for v in values):
                ident = values
        when = float(doc["time"])
        if not math.isfinite(when):
            return None
        return LoadFailure(
            key=str(key),
            module=str(doc["module"]),
            time=when,
            error=str(doc["error"])[:200],
            message=str(doc.get("message", ""))[:1000],
            size=ident[0],
            mtime_ns=ident[1],
            ino=ident[2],
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


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
    # what went into each key that missed (at most 64); empty in records from before them
    missed: dict[str, MissedKey] = field(default_factory=dict)
    # a process that used its cache read-only records it elsewhere, naming the cache
    # (``readonly.cache_identity``); None: the record is of the cache whose folder holds it
    cache_dir: str | None = None
    # entries JAX failed to load (at most 16); empty in records from before them
    load_failures: dict[str, LoadFailure] = field(default_factory=dict)

    @property
    def day(self) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self.end))


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
