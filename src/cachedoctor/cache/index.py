"""A small, self-invalidating index of decoded entries, so a repeated scan reads nothing new.

Decoding an entry means decompressing and walking all of it; an unchanged cache does not need
that twice. The index maps each entry's file name and identity to the ``EntryInfo`` decoded last
time. A local file's identity is ``(size, mtime_ns, inode, ctime_ns)``: a file that was
rewritten, touched, replaced or renamed over has another one (``ctime`` cannot be set back by
``touch`` or ``utime``) and is decoded again; entries changed in the last seconds are never
stored (a write may still be in flight within one timestamp tick). A bucket object's identity is
its size, mtime and generation (GCS) or ETag (S3), which change with every write. Entries that
could not be read are never stored.

A local row also carries the digest of the entry file's bytes (``travel.py``: XXH3-128, taken
from the read that decoded it). The identity is trusted only in the place the index was written
(the cache directory's real path, device and inode: ``travel.place``); anywhere else, or when
the identity differs, a row of the same name and size is served only when the file's bytes hash
to its digest (one read, no decode), and its identity is then brought up to date. A restored
copy of a cache (new path, inodes, mtimes) is so served from its index: its files are hashed
on the other cores from the start of the scan (``travelled``, ``parallel.start_hashing_dir``),
and its new identities are learnt by the second scan in its place (the first notes only that
it was ``seen`` there: a CI runner scans a restored cache once, and the identities would go
with the runner).

This module is which rows a scan trusts, and serving, updating and saving them. The file they
live in (where it is, what it says of itself, how it is opened, the folder kept small) is
``index_file.py``; a row's shape is ``index_rows.py``. Two scans at once: a new index is written
beside the old one and renamed over it (atomic); an update is one sqlite transaction.

Rows are plain (typed values and JSON text, no pickle: reading an index can never run code, and
needs no allow-list kept in step with the dataclasses). Each row carries a checksum, each shared
body (an entry's parts, an HLO summary) is known by the digest of its text; a row that fails
either or does not decode is decoded again from the cache, alone. An index that is not ours,
of this code and these options (``index_file.open_checked``), is ignored and rewritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachedoctor.cache import index_file, index_rows, travel
from cachedoctor.cache.index_file import SUFFIX, connect, enabled, open_checked
from cachedoctor.cache.index_rows import COLUMNS, PART_VALUES, SHARED_VALUES, SLOTS
from cachedoctor.cache.listdir import DirItem
from cachedoctor.cache.model import EntryInfo
from cachedoctor.storage.files import replacing
from cachedoctor.xla.hlo import HloSummary

RACY_S = 2.0  # entries changed this recently are decoded every time (git's "racily clean")

Identity = str  # "size:mtime_ns:inode:ctime_ns" for a file, "size:mtime_ns:version" for an object
# starts hashing the files of these items, returns what waits for their digests (in order)
StartDigests = Callable[[list[DirItem]], Callable[[], list[str | None]]]


def identity(item: DirItem, remote: bool) -> Identity:
    if remote:
        return f"{item.size}:{item.mtime_ns}:{item.version}"
    return f"{item.size}:{item.mtime_ns}:{item.ino}:{item.ctime_ns}"


@dataclass
class ScanIndex:
    """The index of one cache, opened (or empty), consulted once by the scan, then saved.

    Rows are read when they are served (``serve``), one at a time, and only the changed ones are
    written (``save``): the index never holds the text of a whole cache's rows in memory.
    """

    cache: str
    options: tuple[object, ...]
    path: Path
    loaded: bool = False
    remote: bool = False  # a bucket: objects are known by generation/ETag, never racy
    place: str = ""  # where file identities are valid now (travel.place)
    place_ok: bool = False  # the index's rows were written in this place: identities hold
    # scanned in this place before, its identities left as they were: learn them now (a CI
    # runner scans a restored cache once, and its files' identities go with the runner)
    seen_here: bool = False
    _hlo_memo: dict[str, HloSummary] = field(default_factory=dict)
    _parts_memo: dict[str, list[Any]] = field(default_factory=dict)  # copies share their parts
    _changed: dict[str, tuple[DirItem, EntryInfo, str | None]] = field(default_factory=dict)
    _removed: set[str] = field(default_factory=set)
    _moved: dict[str, Identity] = field(default_factory=dict)  # rows served by their digest
    _first_here: bool = False  # rows served by digest in a place not seen before: say so
    _db: sqlite3.Connection | None = None  # open from load to serve: the file that was checked

    @property
    def entries(self) -> dict[str, Identity]:
        """Name -> identity of each row in the file (read anew each time; for tools and tests)."""
        if not self.loaded:
            return {}
        with contextlib.closing(connect(self.path)) as db:
            rows = db.execute("SELECT name, identity FROM entries")
            return {os.fsdecode(name): ident for name, ident in rows}

    def serve(
        self,
        items: Iterable[DirItem],
        path_of: Callable[[DirItem], str],
        strings: dict[str, str],
        digests_of: StartDigests | None = None,
    ) -> dict[str, EntryInfo]:
        """The stored result of every item whose file or object is unchanged, by name, each
        reported at ``path_of(item)``, its strings shared through ``strings`` (as
        ``model.share_strings`` does for decoded entries: once per distinct shared text here).

        A row whose identity does not hold here (another place, a new inode or mtime) but whose
        size does is served only when its file's bytes hash to the row's digest:
        ``digests_of(items)`` starts hashing those files (on other cores) while the rows are
        decoded here, and returns what gives their digests, in order; a row whose digest
        differs is then dropped, and its entry decoded. Rows of names no longer listed are
        dropped at ``save``."""
        db, self._db = self._db, None
        if db is None:
            return {}
        current = {item.name: item for item in items}
        served: dict[str, EntryInfo] = {}
        check: dict[str, tuple[DirItem, str]] = {}
        hashed: list[DirItem] = []  # the files whose digests ``waiting`` gives, in order
        waiting: Callable[[], list[str | None]] | None = None
        try:
            with contextlib.closing(db):
                if self.place_ok or digests_of is None:
                    check = self._to_check(db, current, digests_of is not None)
                    hashed = [item for item, _ in check.values()]
                else:  # elsewhere (a restored copy) every listed file is hashed, and each row
                    # of one is checked in the pass that decodes it
                    hashed = [item for item in current.values() if not item.is_symlink]
                if hashed and digests_of is not None:
                    waiting = digests_of(hashed)
                bodies = _Bodies(
                    dict(db.execute("SELECT id, body FROM hlo")),
                    dict(db.execute("SELECT id, body FROM parts")),
                )
                for raw_name, *row in db.execute(f"SELECT {COLUMNS} FROM entries"):
                    name = os.fsdecode(raw_name)
                    item = current.get(name)
                    if item is None:
                        self._removed.add(name)
                        continue
                    held = self.place_ok and row[0] == identity(item, self.remote)
                    if not (held or self.place_ok or digests_of is None):
                        ident, digest = row[0], row[1]
                        if not _same_size(ident, item) or not isinstance(digest, str):
                            continue
                        check[name] = (item, digest)
                    if held or name in check:
                        info = self._decode(name, row, bodies, item, path_of(item), strings)
                        if info is not None:
                            served[name] = info
        except (sqlite3.Error, TypeError, ValueError):  # damaged since it was opened
            self.loaded = False  # decode everything and write a fresh index
            self._removed.clear()
            served.clear()
        finally:
            found = [] if waiting is None else waiting()
        digests = dict(zip((item.name for item in hashed), found, strict=False))
        for name, (item, digest) in check.items():
            if digests.get(name) != digest or name not in served:
                served.pop(name, None)  # changed (or unreadable): decoded again
            elif self.place_ok or self.seen_here:
                self._moved[name] = identity(item, self.remote)  # the same bytes, a new identity
            else:  # the first scan in this place: served, its identity learnt on a second
                self._first_here = True
        return served

    def _to_check(
        self, db: sqlite3.Connection, current: dict[str, DirItem], by_digest: bool
    ) -> dict[str, tuple[DirItem, str]]:
        """The rows to serve only by the digest of their file's bytes: a row whose identity
        does not hold, of a file of the same size (name -> the item and the row's digest).
        Rows of names no longer listed are marked removed."""
        check: dict[str, tuple[DirItem, str]] = {}
        for raw_name, ident, digest in db.execute("SELECT name, identity, digest FROM entries"):
            name = os.fsdecode(raw_name)
            item = current.get(name)
            if item is None:
                self._removed.add(name)
            elif self.place_ok and ident == identity(item, self.remote):
                continue
            elif by_digest and isinstance(digest, str) and _same_size(ident, item):
                check[name] = (item, digest)
        return check

    def _decode(
        self,
        name: str,
        row: list[Any],
        bodies: _Bodies,
        item: DirItem,
        path: str,
        strings: dict[str, str],
    ) -> EntryInfo | None:
        """The row's entry, or None when the row is damaged or of another shape."""
        _ident, _digest, compile_time, compression, parts_id, hlo_id, checksum = row
        if checksum != index_rows.checksum(name, compile_time, compression, parts_id, hlo_id):
            return None
        if not (compile_time is None or type(compile_time) is int):
            return None  # (stored as given: the column has no type, so no affinity converts)
        if not (compression is None or isinstance(compression, str)):
            return None
        try:
            summary = None
            if hlo_id is not None:
                summary = self._hlo_memo.get(hlo_id)
                if summary is None:
                    body = bodies.hlo[hlo_id]
                    if index_rows.body_id(body) != hlo_id:
                        return None
                    summary = self._hlo_memo[hlo_id] = index_rows.thaw_hlo(json.loads(body))
            compound = self._parts_memo.get(parts_id)
            if compound is None:
                body = bodies.parts[parts_id]
                if index_rows.body_id(body) != parts_id:
                    return None
                compound = self._parts_memo[parts_id] = index_rows.thaw_parts(
                    json.loads(body), strings
                )
        except (ValueError, TypeError, KeyError, IndexError):  # a damaged or foreign row
            return None
        if compression is not None:
            compression = strings.setdefault(compression, compression)
        # the file's own facts from the listing: a row is served only where its size holds (its
        # identity, or its size and digest), and was stored from a decode of the listed file
        own = (item.key, path, item.size, item.mtime_ns, compile_time, compression)
        return index_rows.entry(own, compound, summary)

    def update(
        self,
        items: Iterable[DirItem],
        decoded: dict[str, EntryInfo],
        now: float,
        digests: dict[str, str | None] | None = None,
    ) -> None:
        """Mark the decoded entries to store (when storable) or to drop from the index, each
        with the digest of the bytes it was decoded from (``digests``, when known)."""
        current = {i.name: i for i in items}
        racy_ns = int((now - RACY_S) * 1e9)
        for name, info in decoded.items():
            item = current.get(name)
            if item is None:
                continue
            racy = not self.remote and max(item.mtime_ns, item.ctime_ns) >= racy_ns
            # what a row serves of the file (its size and mtime) comes from the listing: store
            # only a decode of the file as listed
            listed = info.size == item.size and (self.remote or info.mtime_ns == item.mtime_ns)
            if racy or not listed or not _storable(info):
                self._changed.pop(name, None)
                self._removed.add(name)
                continue
            self._changed[name] = (item, info, None if digests is None else digests.get(name))
            self._removed.discard(name)
        if self.remote:
            return
        for name, ident in self._moved.items():
            size, mtime_ns, _ino, ctime_ns = ident.split(":")
            if max(int(mtime_ns), int(ctime_ns)) >= racy_ns:
                # a file written just now may still change within one timestamp tick: keep
                # only its size, so that it is hashed again next time
                self._moved[name] = f"{size}:"

    def save(self) -> None:
        """Write what changed; failures are ignored (the index is only a shortcut)."""
        if not enabled():
            return
        if not (
            self._changed or self._removed or self._moved or self._first_here or not self.loaded
        ):
            return
        with contextlib.suppress(OSError, sqlite3.Error):
            if self.loaded:
                self._save_changes()
            else:
                self._save_whole()
            self._changed.clear()
            self._removed.clear()
            self._moved.clear()
            self._first_here = False
            self.loaded = True
            index_file.tidy(self.path.parent, keep=self.path)

    def _save_changes(self) -> None:
        """Update the index in place, in one transaction (another scan may be reading it)."""
        db = connect(self.path)
        try:
            with db:
                db.executemany(
                    "DELETE FROM entries WHERE name = ?", [(os.fsencode(n),) for n in self._removed]
                )
                self._insert(db)
                db.executemany("UPDATE entries SET identity = ? WHERE name = ?", self._moved_rows())
                if self._first_here and not self.seen_here:
                    # identities hold only where 'place' says; until they are learnt, the rows
                    # stay those of the place they were written in, and are checked by digest
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('seen', ?)", (self.place,))
                elif not self.place_ok:
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('place', ?)", (self.place,))
                if self._removed:
                    db.execute(
                        "DELETE FROM hlo WHERE id NOT IN "
                        "(SELECT hlo FROM entries WHERE hlo IS NOT NULL)"
                    )
                    db.execute("DELETE FROM parts WHERE id NOT IN (SELECT parts FROM entries)")
        finally:
            db.close()

    def _save_whole(self) -> None:
        """Write a fresh index beside the old one, then rename it over (atomic)."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with replacing(self.path, temp_prefix=".tmp-", suffix=SUFFIX) as tmp:
            db = connect(Path(tmp))
            try:
                with db:
                    db.executescript(index_file.SCHEMA)
                    header = index_file.header_of(self.cache, self.options, self.path, self.remote)
                    db.executemany("INSERT INTO meta VALUES (?, ?)", header.items())
                    db.execute("INSERT INTO meta VALUES ('place', ?)", (self.place,))
                    self._insert(db)  # not loaded: every row is new
            finally:
                db.close()

    def _moved_rows(self) -> Iterator[tuple[object, ...]]:
        """(identity, name) of each row served by its digest: its identity here (only its size
        for a file written just now). A damaged identity or digest only misses (the checksum
        covers what a row serves, not what finds it)."""
        for name, ident in self._moved.items():
            yield (ident, os.fsencode(name))

    def _insert(self, db: sqlite3.Connection) -> None:
        """Write the changed rows, each made when sqlite asks for it (never all held at once),
        and the HLO summaries and parts they use, each once."""
        bodies = _Bodies({}, {})
        summaries: dict[int, tuple[HloSummary, str]] = {}  # decoded copies share one summary
        # copies also share their parts' objects (reader._PAYLOAD_MEMO): one text for them all;
        # each value keeps its objects alive, so no id is reused while this runs
        part_ids: dict[tuple[int, ...], tuple[tuple[object, ...], str]] = {}

        def rows() -> Iterator[tuple[object, ...]]:
            for name, (item, info, digest) in self._changed.items():
                ident = identity(item, self.remote)
                hlo_id = None
                if info.hlo is not None:
                    known = summaries.get(id(info.hlo))
                    if known is None:
                        body = index_rows.dumps(info.hlo)
                        known = summaries[id(info.hlo)] = (info.hlo, index_rows.body_id(body))
                        bodies.hlo[known[1]] = body
                    hlo_id = known[1]
                objects = PART_VALUES(info)
                shared = SHARED_VALUES(info)
                memo_key = (*map(id, objects), *shared)
                known_parts = part_ids.get(memo_key)
                if known_parts is None:
                    if len(part_ids) >= 4096:  # distinct entries: bound what is held
                        part_ids.clear()
                    text = index_rows.dumps([*objects, *shared])
                    known_parts = part_ids[memo_key] = (objects, index_rows.body_id(text))
                    bodies.parts[known_parts[1]] = text
                parts_id = known_parts[1]
                own = (info.compile_time_s, info.compression)
                checksum = index_rows.checksum(name, *own, parts_id, hlo_id)
                yield (os.fsencode(name), ident, digest, *own, parts_id, hlo_id, checksum)

        db.executemany(f"INSERT OR REPLACE INTO entries ({COLUMNS}) VALUES ({SLOTS})", rows())
        db.executemany("INSERT OR REPLACE INTO hlo VALUES (?, ?)", bodies.hlo.items())
        db.executemany("INSERT OR REPLACE INTO parts VALUES (?, ?)", bodies.parts.items())


@dataclass
class _Bodies:
    """The shared bodies of an index's rows, by id (the digest of each text)."""

    hlo: dict[str, str]
    parts: dict[str, str]


def _same_size(ident: object, item: DirItem) -> bool:
    """Whether a row's identity names the size ``item`` has (a row of another size is never
    checked by digest: its file changed)."""
    return isinstance(ident, str) and ident.partition(":")[0] == str(item.size)


def _storable(info: EntryInfo) -> bool:
    return not any(p.kind in ("unreadable", "symlink") for p in info.problems)


def load(
    cache: str, options: tuple[object, ...] = (), *, entries: bool = True, remote: bool = False
) -> ScanIndex:
    """The index for ``cache`` (a directory, or a bucket URL when ``remote``), open for
    ``serve``, or an empty one when there is none we can use. Its rows are not read here.
    ``entries``: the scan found entries (``index_file.index_path``: only then may a new index be
    written into the cache)."""
    path = index_file.index_path(cache, entries=entries, remote=remote)
    here = index_file.cache_id(cache, remote=True) if remote else travel.place(cache)
    empty = ScanIndex(cache, options, path, remote=remote, place=here)
    db = open_checked(cache, options, path, remote=remote)
    if db is None:
        return empty
    try:
        db.execute("SELECT count(*) FROM entries").fetchone()  # visits every page: truncated?
        meta = dict(db.execute("SELECT k, v FROM meta WHERE k IN ('place', 'seen')"))
    except (sqlite3.Error, TypeError, ValueError):  # damaged, truncated or not ours
        db.close()
        return empty
    same_place = meta.get("place") == here and bool(here)
    seen = meta.get("seen") == here and bool(here)
    return ScanIndex(cache, options, path, True, remote, here, same_place, seen, _db=db)


def travelled(cache: str, options: tuple[object, ...] = ()) -> bool:
    """Whether ``cache`` holds an index of its own, usable by this code with these options,
    written in another place (``travel.place``): a restored copy, whose rows will each be
    served by the digest of its file's bytes."""
    if not enabled() or not travel.usable(cache):
        return False
    path = travel.index_file(cache)
    db = open_checked(cache, options, path)
    if db is None:
        return False
    try:
        row = db.execute("SELECT v FROM meta WHERE k = 'place'").fetchone()
    except (sqlite3.Error, TypeError, ValueError):
        return False
    finally:
        db.close()
    return row is not None and row[0] != travel.place(cache)
