"""The stats records' index: each record file parsed and validated once, its result kept.

``stats`` and ``lint`` read every record in ``cachedoctor-stats/`` on every run; thousands of
them cost seconds. This keeps, per record file, what reading it gave (the record's parsed and
validated content, or the reason it is not a sound one: ``core/usage/records.py`` writes and
reads the bodies), keyed by the file's name and identity, so that a later run lists the folder,
stats each file and takes the unchanged ones from here.

A local file's identity is ``size:mtime_ns:inode:ctime_ns`` (as the scan index's, ``index.py``:
a rewrite, ``touch``, replacement or rename over changes one of them; ``utime`` cannot set
``ctime`` back); a bucket object's is ``size:mtime_ns:generation/ETag``. A row is served only
when the file's identity is the stored one. A file changed in the last ``index.RACY_S`` is read
every time and never stored (a write may still be in flight within one timestamp tick), nor is
one that could not be read (an I/O error may pass) or a bucket object without a version. Rows of
files no longer listed are dropped.

Besides the rows, the *fold*: what ``stats`` and ``lint`` made of the whole folder (totals per
module, day and host, the findings; ``core/usage/fold.py`` writes and reads it), keyed by the
digest of the folder's listing (every name with its identity, as the scan memo keys a cache)
and the options that shape it. A repeated run lists the folder, stats each file and reads that
one row. A listing with a racy file, or a name without an identity, has no digest: no fold is
kept or served for it; a fold of another listing is dropped when one is kept.

Where: beside the scan index, in its own file (``index_file.side_path``, in the user cache dir,
never in the cache). Format: ``sqlite3``, rows of JSON text (no pickle: reading it never runs
code), each with a checksum; a row that fails it is read again from the cache. A file of other
code (the fingerprint of every module of the package), of another cache or owned by someone else
is ignored and rewritten whole. Failures to write are ignored: the index is only a shortcut.
``CACHEDOCTOR_NO_INDEX`` turns it off with the scan index.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cachedoctor.cache import index, index_file
from cachedoctor.storage.files import replacing
from cachedoctor.storage.fsops import CacheDir
from cachedoctor.storage.stores import Store

FORMAT = "cachedoctor-records-index-v2"
PART = "records"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
  name BLOB PRIMARY KEY, identity TEXT NOT NULL, body TEXT NOT NULL, checksum BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS folds (
  listing BLOB NOT NULL, options TEXT NOT NULL, body TEXT NOT NULL, checksum BLOB NOT NULL,
  PRIMARY KEY (listing, options)
);
"""
_DELETE = "DELETE FROM records WHERE name = ?"
_INSERT = "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?)"
_FOLD = "SELECT body, checksum FROM folds WHERE listing = ? AND options = ?"
_FOLD_DROP = "DELETE FROM folds WHERE listing != ?"
_FOLD_INSERT = "INSERT OR REPLACE INTO folds VALUES (?, ?, ?, ?)"

Fold = tuple[bytes, str, str]  # listing digest, options, body


@dataclass(frozen=True)
class Listed:
    """One name in the records folder, with what identifies its content (None: nothing does,
    never indexed) and whether it changed too recently to be trusted (``racy``)."""

    name: str
    is_dir: bool
    identity: str | None
    racy: bool = False


def list_folder(store: Store, sub: str, now: float) -> list[Listed]:
    """The names directly under ``sub``, sorted, each with its identity; FileNotFoundError when
    there is no such folder. A local folder is read with ``lstat`` (for ``ctime``)."""
    if not store.is_local:
        return [
            Listed(
                i.name,
                i.is_dir,
                None if i.version is None else f"{i.size}:{i.mtime_ns}:{i.version}",
            )
            for i in store.list(sub)
        ]
    racy_ns = int((now - index.RACY_S) * 1e9)
    items = []
    # the folder opened without following a link (a link at cachedoctor-stats/: OSError)
    with CacheDir.open(store.url) as root, root.walk(sub) as folder, os.scandir(folder.fd) as it:
        for de in it:
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:  # vanished since listed
                continue
            ident = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"
            racy = max(st.st_mtime_ns, st.st_ctime_ns) >= racy_ns
            items.append(Listed(de.name, stat.S_ISDIR(st.st_mode), ident, racy))
    return sorted(items, key=lambda i: i.name)


def listing_digest(listed: list[Listed]) -> bytes | None:
    """The digest of the folder's listing (each name, whether a folder, its identity), or None
    when a name has no identity or changed too recently to be trusted: then no fold is kept."""
    parts = []
    for i in listed:
        if i.identity is None or i.racy:
            return None
        parts.append(f"{i.name}\0{i.is_dir:d}\0{i.identity}")  # no NUL in a name or identity
    text = "\0".join(parts).encode("utf-8", "surrogateescape")  # as os.fsencode encodes names
    return hashlib.blake2b(text, digest_size=20).digest()


@dataclass
class RecordIndex:
    """The index of one cache's records: ``served`` bodies, then ``save`` what was read anew."""

    cache: str
    path: Path
    remote: bool = False  # a bucket URL (the caller's Store says so): its id is the URL
    _db: sqlite3.Connection | None = None  # open and checked: update it in place
    _stored: set[str] = field(default_factory=set)  # names with a row

    def served(self, listed: list[Listed]) -> dict[str, str]:
        """The stored body of each listed file whose identity is the row's (none racy)."""
        if self._db is None:
            return {}
        current = {i.name: i for i in listed}
        out: dict[str, str] = {}
        try:
            for raw, ident, body, checksum in self._db.execute("SELECT * FROM records"):
                name = os.fsdecode(raw)
                self._stored.add(name)
                item = current.get(name)
                if item is None or item.racy or item.identity != ident:
                    continue
                if checksum == _checksum(name, ident, body):
                    out[name] = body
        except (sqlite3.Error, TypeError, ValueError):  # damaged since it was opened
            self._close()
            return {}
        return out

    def fold(self, listing: bytes, options: str) -> str | None:
        """The fold kept for this listing digest and these options, its checksum checked."""
        if self._db is None:
            return None
        try:
            for body, checksum in self._db.execute(_FOLD, (listing, options)):
                if checksum == _fold_checksum(listing, options, body):
                    return str(body)
        except (sqlite3.Error, TypeError, ValueError):  # damaged since it was opened
            self._close()
        return None

    def close(self) -> None:
        """Done with it, saving nothing."""
        self._close()

    def save(self, listed: list[Listed], fresh: dict[str, str], fold: Fold | None = None) -> None:
        """Store ``fresh`` (name -> body of each file read this run) where it may be kept, and
        drop the rows of files no longer listed, or changed since stored and not kept now;
        keep ``fold`` (dropping those of other listings)."""
        if not index_file.enabled():
            self._close()
            return
        by_name = {i.name: i for i in listed}
        rows = []
        for name, body in fresh.items():
            item = by_name.get(name)
            if item is not None and item.identity is not None and not item.racy:
                ident = item.identity
                rows.append((os.fsencode(name), ident, body, _checksum(name, ident, body)))
        gone = [os.fsencode(n) for n in self._stored if n not in by_name or n in fresh]
        folds = [] if fold is None else [(*fold, _fold_checksum(*fold))]
        with contextlib.suppress(OSError, sqlite3.Error):
            if self._db is not None:
                if rows or gone or folds:
                    with self._db:
                        self._db.executemany(_DELETE, [(n,) for n in gone])
                        self._db.executemany(_INSERT, rows)
                        self._db.executemany(_FOLD_DROP, [(f[0],) for f in folds])
                        self._db.executemany(_FOLD_INSERT, folds)
            elif rows or folds:
                self._save_whole(rows, folds)
        self._close()

    def _save_whole(
        self, rows: list[tuple[bytes, str, str, bytes]], folds: list[tuple[bytes, str, str, bytes]]
    ) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with replacing(self.path, temp_prefix=".tmp-", suffix=index_file.SUFFIX) as tmp:
            db = index_file.connect(Path(tmp))
            try:
                with db:
                    db.executescript(_SCHEMA)
                    header = _header(self.cache, self.remote)
                    db.executemany("INSERT INTO meta VALUES (?, ?)", header.items())
                    db.executemany(_INSERT, rows)
                    db.executemany(_FOLD_INSERT, folds)
            finally:
                db.close()

    def _close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()


def load(cache: str, *, remote: bool = False) -> RecordIndex:
    """The records index of ``cache`` (a directory, or a bucket URL when ``remote``): open when
    it is ours, of this code and this cache; else an empty one (its ``save`` writes a fresh
    file)."""
    path = index_file.side_path(cache, PART, remote=remote)
    return RecordIndex(cache, path, remote, _open_checked(cache, path, remote))


def _open_checked(cache: str, path: Path, remote: bool) -> sqlite3.Connection | None:
    return index_file.open_own(path, _header(cache, remote)) if index_file.enabled() else None


def _header(cache: str, remote: bool) -> dict[str, str]:
    return {
        "format": FORMAT,
        "code": index_file.package_fingerprint().hex(),
        "cache": index_file.cache_id(cache, remote=remote),
    }


def _checksum(name: str, ident: str, body: str) -> bytes:
    data = os.fsencode(name) + b"\0" + ident.encode() + b"\0" + body.encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def _fold_checksum(listing: bytes, options: str, body: str) -> bytes:
    data = listing + b"\0" + options.encode() + b"\0" + body.encode()
    return hashlib.blake2b(data, digest_size=16).digest()
