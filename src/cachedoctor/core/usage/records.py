"""The processes' stats records (``cachedoctor-stats/``), read: what each process asked the cache
for and got, as JAX's monitoring events counted it (``stablekeys/stats.py``). A torn or foreign
file is a finding, never an error.

This module is the folder: which files are records, each read once and kept in the records index
(``cache/record_index.py``) with the finding of a file that is not a sound one, and what the
records say of one key (``KeyUse``, for ``prune``). What a record holds is ``model.py``; what
makes a file's bytes a sound record is ``validate.py``.
"""

from __future__ import annotations

import errno
import json
import time
from dataclasses import dataclass

from cachedoctor.cache import record_index
from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding
from cachedoctor.core.usage import validate
from cachedoctor.core.usage.model import (
    KEY_VALUES,
    KeyCounts,
    Record,
    load_failure_of,
    make_key_counts,
    missed_key_of,
    sparse_counters,
    thawed_counters,
)
from cachedoctor.errors import os_reason
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.stablekeys.stats import RECORD_SUFFIX
from cachedoctor.storage import fsops
from cachedoctor.storage.stores import Store

ARCHIVE_PREFIX = "archive-"  # cachedoctor-stats/archive-<UTC time>.jsonl: one per --zero
ARCHIVE_SUFFIX = ".jsonl"
MAX_ARCHIVE_BYTES = 1 << 30  # an archive holds many records, each at most MAX_RECORD_BYTES


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


def read_archived(store: Store) -> list[Record]:
    """The records ``stats --zero`` archived (``archive-*.jsonl``, one record a line): what
    ``why``, ``preflight`` and ``prune`` still rely on after the counters were reset. A line
    that is not a sound record is left out (the archive held what the records folder did)."""
    try:
        items = store.list(STATS_DIRNAME)
    except FileNotFoundError:
        return []
    out: list[Record] = []
    for item in sorted(items, key=lambda i: i.name):
        name = item.name
        if item.is_dir or not (name.startswith(ARCHIVE_PREFIX) and name.endswith(ARCHIVE_SUFFIX)):
            continue
        try:
            with store.open_read(f"{STATS_DIRNAME}/{name}") as fh:
                body = fh.read(MAX_ARCHIVE_BYTES + 1)
        except OSError:
            continue
        if len(body) > MAX_ARCHIVE_BYTES:
            continue  # not an archive --zero wrote: no record is taken from it
        for n, line in enumerate(body.splitlines()):
            if not line.strip():
                continue
            try:
                out.append(validate.parse_record(f"{name}#{n + 1}", line))
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                continue
    return out


def sound_files(store: Store) -> set[str]:
    """The names in ``cachedoctor-stats/`` that hold records: each record that parses, each
    archive of ``stats --zero`` whose every line is one (``pack`` takes these alone)."""
    names = {r.file for r in read_records(store)[0]}
    archived: dict[str, int] = {}
    for r in read_archived(store):
        archive = r.file.split("#", 1)[0]
        archived[archive] = archived.get(archive, 0) + 1
    for archive, n in archived.items():
        try:
            with store.open_read(f"{STATS_DIRNAME}/{archive}") as fh:
                lines = [x for x in fh.read(MAX_ARCHIVE_BYTES + 1).splitlines() if x.strip()]
        except OSError:
            continue
        if len(lines) == n:
            names.add(archive)
    return names


def read_evidence(store: Store) -> list[Record]:
    """The records whose evidence ``why``, ``preflight`` and ``prune`` read: those in the
    folder and those ``stats --zero`` archived (counters reset, history kept)."""
    return [*read_records(store)[0], *read_archived(store)]


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
            data = fh.read(validate.MAX_RECORD_BYTES + 1)
    except OSError as exc:
        return _no_access(path, exc), None
    try:
        record = validate.parse_record(name, data)
    except validate.RuleBroken as exc:
        return _broken(path, str(exc)), _dumps(["broken", str(exc)])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        return _unreadable(path, str(exc)), _dumps(["unreadable", str(exc)])
    return record, _freeze(record)


# --- a record as the records index keeps it: JSON text of its fields, in order -----------------

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def _freeze(r: Record) -> str:
    modules = {name: sparse_counters(c) for name, c in r.modules.items()}
    keys = {key: KEY_VALUES(k) for key, k in r.keys.items()}
    missed = {key: m.to_dict() for key, m in r.missed.items()}
    failures = {key: f.to_dict() for key, f in r.load_failures.items()}
    fields = [r.host, r.pid, r.start, r.end, r.jax, r.hook, r.config, modules, keys, missed]
    return _dumps(["record", *fields, r.cache_dir, failures])


def _thaw(name: str, path: str, body: str) -> Record | Finding | None:
    """What ``_freeze`` or a finding's body kept, or None when the body is not one of ours."""
    try:
        doc = json.loads(body)
        kind = doc[0]
        if kind == "broken" and len(doc) == 2:
            return _broken(path, str(doc[1]))
        if kind == "unreadable" and len(doc) == 2:
            return _unreadable(path, str(doc[1]))
        _, host, pid, start, end, jax, hook, config, modules, keys, missed, cache_dir, *rest = doc
        failures = rest[0] if len(rest) == 1 else {}  # rows kept before failures were read
        if len(rest) > 1 or not isinstance(failures, dict):
            return None
        if not (cache_dir is None or isinstance(cache_dir, str)):
            return None
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
            keys={k: make_key_counts(v) for k, v in keys.items()},
            missed={k: m for k, v in missed.items() if (m := missed_key_of(k, v)) is not None},
            cache_dir=cache_dir,
            load_failures={
                k: f for k, v in failures.items() if (f := load_failure_of(k, v)) is not None
            },
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
