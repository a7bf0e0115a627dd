"""The plan model shared by ``prune`` and ``rekey``: actions, skips, outcomes, manifests.

A command first builds a frozen :class:`Plan`: every planned action names the rule that selected
it, every item left alone says why, and nothing on disk changes. :func:`apply` then carries the
plan out, one unit at a time, under JAX's own lock (see :mod:`cachedoctor.storage.fsops`):

* an entry is removed as a unit: the ``-cache`` file first, then its ``-atime`` file and its
  manifest. JAX's eviction pass (jax <= 0.10) reads the ``-atime`` of every ``-cache`` file and
  fails when one is missing (jax-ml/jax#39880), so the reverse order could break a cache in use;
  in this order a kill at any point leaves at worst an orphaned ``-atime`` (which every later
  run removes) or manifest (``--orphans``), both ignored by JAX;
* each file is re-checked (inode, size, mtime) right before it is removed, and skipped if it
  changed since the plan (a JAX process used or rewrote it);
* symbolic links and files cachedoctor does not recognise are never removed, only reported.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from cachedoctor import layout
from cachedoctor.cache.listdir import DirItem, FileKind
from cachedoctor.errors import path_error
from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX, MANIFEST_SUFFIX
from cachedoctor.plaindata import ToDict
from cachedoctor.storage.fileid import FileId
from cachedoctor.storage.fsops import CacheDir, Folder
from cachedoctor.storage.location import Location

SCHEMA_VERSION = 1


WRITE_BITS = stat.S_IWGRP | stat.S_IWOTH


class Op(enum.StrEnum):
    REMOVE_ENTRY = "remove-entry"  # -cache + -atime + manifest, as one unit
    REMOVE_FILE = "remove-file"  # one file that is not an entry (orphan, temp, sub-cache file)
    RECREATE_ATIME = "recreate-atime"
    FIX_MODE = "fix-mode"
    MOVE_ENTRY = "move-entry"  # rekey: entry + atime + manifest under a new key
    DROP_DUPLICATE = "drop-duplicate"  # rekey: the new key already holds the same executable


class Selector(enum.StrEnum):
    """What took an action or a skip: a prune selector (``--older-than``...), ``rekey``, or the
    stats folder's size bound (always on). The JSON keeps the fields ``rules`` and ``rule``."""

    OLDER_THAN = "older-than"
    MAX_SIZE = "max-size"
    DUPLICATES = "duplicates"
    CORRUPT = "corrupt"
    ORPHANS = "orphans"
    RELOCATED = "relocated"
    STALE_JAX = "stale-jax"
    MODULE = "module"
    XLA_SUBCACHES = "xla-subcaches"
    REPAIR = "repair"
    REKEY = "rekey"
    STATS_BOUND = "stats-bound"  # cachedoctor-stats/ over its size bound (core/prune/rules.py)


@dataclass(frozen=True)
class Action:
    """One planned change. ``files[0]`` is the file the action is about, as the plan saw it."""

    op: Op
    name: str  # the key for entry actions, else the file's path relative to the cache dir
    rules: tuple[Selector, ...]  # every selector that matched; the first one "took" it
    reason: str
    bytes: int = 0  # bytes freed (entry actions count -cache, -atime and manifest files)
    module: str | None = None
    last_used_ns: int | None = None
    files: tuple[FileId, ...] = ()
    folder: str = ""  # for REMOVE_FILE: folder inside the cache dir
    new_key: str | None = None  # for MOVE_ENTRY / DROP_DUPLICATE


@dataclass(frozen=True)
class Skip:
    """Something the plan leaves alone, and why."""

    name: str
    reason: str
    rule: Selector | None = None


@dataclass(frozen=True)
class Plan(ToDict):
    command: str  # "prune" | "rekey"
    cache_dir: Location  # a local folder by its real path (``Location.resolved``), or a bucket
    created_at: float
    selectors: tuple[str, ...]  # e.g. "older-than 30d", as the user gave them
    actions: tuple[Action, ...]
    skipped: tuple[Skip, ...]
    conflicts: tuple[Skip, ...] = ()  # rekey: a different executable already at the new key
    notes: tuple[str, ...] = ()
    eviction_in_use: bool = False
    jax_version: str | None = None
    jaxlib_version: str | None = None

    @property
    def has_locks(self) -> bool:
        """JAX's lock serialises the removals (a local folder); a bucket's are conditional."""
        return self.cache_dir.has_locks

    @property
    def bytes_to_reclaim(self) -> int:
        return sum(a.bytes for a in self.actions)

    @property
    def entries_to_remove(self) -> int:
        return sum(1 for a in self.actions if a.op in (Op.REMOVE_ENTRY, Op.DROP_DUPLICATE))


class Status(enum.StrEnum):
    DONE = "done"
    SKIPPED = "skipped"  # changed since the plan, or already done by someone else
    FAILED = "failed"


@dataclass(frozen=True)
class Outcome:
    action: Action
    status: Status
    detail: str = ""
    bytes: int = 0


@dataclass(frozen=True)
class ApplyReport:
    plan: Plan
    outcomes: tuple[Outcome, ...]
    locked: bool  # whether JAX's .lockfile existed (and was taken for each step)

    @property
    def bytes_reclaimed(self) -> int:
        return sum(o.bytes for o in self.outcomes)

    def count(self, status: Status) -> int:
        return sum(1 for o in self.outcomes if o.status is status)


@dataclass(frozen=True)
class ManifestFile:
    """A manifest as JSON data (the fields prune needs are read defensively)."""

    file: str  # name inside the manifests folder
    key: str  # the entry it describes (from the file name)
    data: dict[str, object] | None  # None when unreadable
    size: int
    mtime_ns: int
    is_symlink: bool

    @property
    def jaxlib(self) -> str | None:
        versions = self.data.get("versions") if self.data else None
        value = versions.get("jaxlib") if isinstance(versions, dict) else None
        return str(value) if value else None


def read_manifests(cd: Folder) -> tuple[list[ManifestFile], list[DirItem]]:
    """Manifests (``<key>.json``) and the other files of the manifests folder."""
    folder = cd.subdir(MANIFEST_DIRNAME)
    if folder is None:
        return [], []
    manifests: list[ManifestFile] = []
    others: list[DirItem] = []
    with folder:
        names = folder.listdir()
        # on a bucket one GET each, read concurrently; a folder's files one by one
        wanted = [n for n in names if n.endswith(MANIFEST_SUFFIX) and not n.startswith(".")]
        found = folder.read_many(wanted, limit=64 << 20)
        raws: dict[str, bytes | None] = dict(zip(wanted, found, strict=True))
        for name in names:
            st = folder.lstat(name)
            if st is None:
                continue
            is_link = stat.S_ISLNK(st.st_mode)
            if name.endswith(MANIFEST_SUFFIX) and not name.startswith("."):
                data = None
                if not is_link:
                    with contextlib.suppress(ValueError, TypeError):
                        raw = raws[name] if name in raws else folder.read_small(name, 64 << 20)
                        loaded = json.loads(raw) if raw else None
                        data = loaded if isinstance(loaded, dict) else None
                key = name[: -len(MANIFEST_SUFFIX)]
                manifests.append(ManifestFile(name, key, data, st.st_size, st.st_mtime_ns, is_link))
            else:
                others.append(
                    DirItem(
                        name=name,
                        kind=FileKind.CACHEDOCTOR,
                        key=None,
                        size=st.st_size,
                        mtime_ns=st.st_mtime_ns,
                        mode=st.st_mode,
                        uid=st.st_uid,
                        is_symlink=is_link,
                        is_dir=stat.S_ISDIR(st.st_mode),
                    )
                )
    return manifests, others


def open_cache(cache_dir: str | os.PathLike[str]) -> CacheDir:
    try:
        return CacheDir.open(cache_dir)
    except OSError as exc:
        raise path_error(exc, cache_dir) from exc


def open_dir(where: Location) -> Folder:
    """The folder API of ``where``: a local folder that follows no link, or a bucket prefix."""
    try:
        return where.open_dir()
    except OSError as exc:
        raise path_error(exc, where.spelling) from exc


@contextlib.contextmanager
def _folder(cd: Folder, rel: str) -> Iterator[Folder | None]:
    """Open a (nested) folder without following links; None when absent."""
    if not rel:
        yield cd
        return
    opened: list[Folder] = []
    current: Folder | None = cd
    try:
        for part in rel.split("/"):
            assert current is not None
            current = current.subdir(part)
            if current is None:
                break
            opened.append(current)
        yield current
    finally:
        for d in reversed(opened):
            d.close()


def remove_companions(cd: Folder, key: str) -> int:
    """Remove ``<key>-atime`` and the manifest files of a key whose ``-cache`` is gone."""
    freed = 0
    st = cd.regular(key + layout.ATIME_SUFFIX)
    if st is not None and cd.unlink_if(None, key + layout.ATIME_SUFFIX) == "removed":
        freed += st.st_size
    with _folder(cd, MANIFEST_DIRNAME) as mdir:
        if mdir is not None:
            for suffix in (MANIFEST_SUFFIX, MANIFEST_IR_SUFFIX):
                mst = mdir.regular(key + suffix)
                if mst is not None and mdir.unlink_if(None, key + suffix) == "removed":
                    freed += mst.st_size
    return freed
