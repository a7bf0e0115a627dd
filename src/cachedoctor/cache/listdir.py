"""Listing a cache directory or bucket prefix: every name classified, nothing opened or followed."""

from __future__ import annotations

import dataclasses
import enum
import errno
import operator
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from cachedoctor.layout import (
    ATIME_SUFFIX,
    AUTOTUNE_DIR,
    CACHE_SUFFIX,
    CACHEDOCTOR_PREFIX,
    INDEX_DIRNAME,
    KERNEL_CACHE_FILE,
    LOCKFILE,
)
from cachedoctor.plaindata import slot_filler
from cachedoctor.storage.files import open_regular
from cachedoctor.storage.model import StoreItem
from cachedoctor.storage.stores import Store

_KEY_RE = re.compile(r"^(?:(?P<module>.+)-)?(?P<hash>[0-9a-f]{64})$")


_JAX_TEMP_RE = re.compile(r"^_temp_|\.tmp$|^tmp[._]")


_HASH_RE = re.compile(r"[0-9a-f]{64}")


class FileKind(enum.StrEnum):
    ENTRY = "entry"
    ATIME = "atime"
    LOCKFILE = "lockfile"
    TEMP = "temp"
    AUTOTUNE_SUBCACHE = "autotune-subcache"
    KERNEL_SUBCACHE = "kernel-subcache"
    CACHEDOCTOR = "cachedoctor"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class DirItem:
    """One name in the cache directory, classified, with its lstat facts (links not followed)."""

    name: str
    kind: FileKind
    key: str | None
    size: int
    mtime_ns: int
    mode: int
    uid: int
    is_symlink: bool
    is_dir: bool
    version: str | None = None  # a store's generation/ETag, for conditional deletes
    ino: int = 0  # with ctime_ns: the file's identity for the scan index (see index.py)
    ctime_ns: int = 0


@dataclass(frozen=True)
class CacheListing:
    root: str
    items: tuple[DirItem, ...]
    root_mode: int
    root_uid: int
    remote: bool = False  # a bucket: no POSIX modes or owners, sub-cache sizes are totals

    def of_kind(self, kind: FileKind) -> list[DirItem]:
        return [i for i in self.items if i.kind is kind]

    @property
    def entries(self) -> list[DirItem]:
        return self.of_kind(FileKind.ENTRY)

    def path(self, item: DirItem) -> Path:
        return Path(self.root) / item.name

    @property
    def looks_like_cache(self) -> bool:
        """Empty, or holding something only a JAX cache holds (an entry, -atime, sub-cache, or
        cachedoctor's own records and manifests)."""
        return not self.items or any(i.kind in CACHE_OWN_KINDS for i in self.items)


# What only a JAX cache (or cachedoctor beside one) holds: a folder with none of these but
# other files is another folder (a checkout, a home directory), named by mistake.
CACHE_OWN_KINDS = frozenset(
    {
        FileKind.ENTRY,
        FileKind.ATIME,
        FileKind.LOCKFILE,
        FileKind.AUTOTUNE_SUBCACHE,
        FileKind.KERNEL_SUBCACHE,
        FileKind.CACHEDOCTOR,
    }
)


def module_of(key: str) -> str | None:
    """The module name in a key (``jit_f`` of ``jit_f-<hex>``), or None."""
    parsed = parse_key(key)
    return parsed[1] if parsed else None


def parse_key(name: str) -> tuple[str, str | None] | None:
    """``jit_f-<64hex>`` -> (key, module); None when the name is not a JAX cache key."""
    if (
        len(name) > 65
        and name[-65] == "-"
        and "\n" not in name
        and _HASH_RE.fullmatch(name, -64 + len(name))
    ):
        return name, name[:-65]  # the common case, without the backtracking of _KEY_RE
    m = _KEY_RE.match(name)
    if not m:
        return None
    return name, m.group("module")


# The names a cache is made of, ``<module>-<sha256 hex>-cache`` and ``-atime``, told apart by one
# match (a third of a listing's Python time); any other name, and one with a prefix that
# ``classify`` reads first, takes the whole way.
_ENTRY_OR_ATIME_RE = re.compile(
    rf"([^\n]+-[0-9a-f]{{64}})({re.escape(CACHE_SUFFIX)}|{re.escape(ATIME_SUFFIX)})"
)
_SLOW_PREFIXES = (CACHEDOCTOR_PREFIX, "." + CACHEDOCTOR_PREFIX, KERNEL_CACHE_FILE, "_temp_", "tmp")


def classify(name: str, is_dir: bool) -> tuple[FileKind, str | None]:
    """Kind of a directory member, and its cache key when it belongs to an entry."""
    m = None if is_dir else _ENTRY_OR_ATIME_RE.fullmatch(name)
    if m and not name.startswith(_SLOW_PREFIXES):
        return (FileKind.ENTRY if m.group(2) == CACHE_SUFFIX else FileKind.ATIME), m.group(1)
    return classify_by_rules(name, is_dir)


def classify_by_rules(name: str, is_dir: bool) -> tuple[FileKind, str | None]:
    """``classify`` rule by rule, in the order they apply (``classify`` gives the same answer
    to the common names at once; tests/cache/test_reader.py compares the two)."""
    if name.startswith(CACHEDOCTOR_PREFIX) or name.startswith("." + CACHEDOCTOR_PREFIX):
        return FileKind.CACHEDOCTOR, None
    if name == AUTOTUNE_DIR:
        return FileKind.AUTOTUNE_SUBCACHE, None
    if name.startswith(KERNEL_CACHE_FILE):
        return FileKind.KERNEL_SUBCACHE, None
    if is_dir:
        return FileKind.UNKNOWN, None
    if name == LOCKFILE:
        return FileKind.LOCKFILE, None
    if name.startswith(("_temp_", "tmp.", "tmp_")) or name.endswith(".tmp"):  # _JAX_TEMP_RE
        return FileKind.TEMP, None
    for suffix, kind in ((CACHE_SUFFIX, FileKind.ENTRY), (ATIME_SUFFIX, FileKind.ATIME)):
        if name.endswith(suffix):
            parsed = parse_key(name[: -len(suffix)])
            if parsed:
                return kind, parsed[0]
    parsed = parse_key(name)
    if parsed:  # jax <= 0.4.29 wrote entries without a suffix
        return FileKind.ENTRY, parsed[0]
    return FileKind.UNKNOWN, None


# One name and its lstat facts: name, mode, uid, size, mtime_ns, inode, ctime_ns. Plain ints:
# 100,000 of these take ~25 MB, the os.stat_result objects they come from ~78 MB.
Member = tuple[str, int, int, int, int, int, int]


@dataclass(frozen=True)
class DirSnapshot:
    """What one pass over a local directory saw: its own stat and each member's lstat facts.

    ``listing_of`` classifies it into a ``CacheListing``; the scan memo (``core/scan/memo``)
    hashes it as it is, so a repeated scan of an unchanged cache builds no ``DirItem``.
    """

    root: str
    root_mode: int
    root_uid: int
    members: list[Member]  # in the directory's order


def read_dir(root: str | os.PathLike[str]) -> DirSnapshot:
    """``lstat`` every name in ``root`` (links not followed). Raises OSError when the directory
    itself cannot be read; a name that vanishes before its ``lstat`` is left out (a concurrent
    JAX eviction), and so is the scan index's folder (``layout.INDEX_DIRNAME``, a directory:
    derived data, not part of the cache; a scan that writes it must report what a scan that
    does not would, and the scan memo must not see its own writes)."""
    root_path = Path(root)
    root_stat = root_path.stat()
    if not stat.S_ISDIR(root_stat.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(root))
    members = []
    with os.scandir(root_path) as it:
        for de in it:
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue
            if de.name == INDEX_DIRNAME and stat.S_ISDIR(st.st_mode):
                continue
            members.append(
                (
                    de.name,
                    st.st_mode,
                    st.st_uid,
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_ino,
                    st.st_ctime_ns,
                )
            )
    return DirSnapshot(str(root_path), root_stat.st_mode, root_stat.st_uid, members)


def list_cache(root: str | os.PathLike[str] | Store) -> CacheListing:
    """List and classify a cache directory. Raises OSError when the directory cannot be read.

    ``root`` may also be a ``storage.Store`` (a bucket prefix): its listing is classified the
    same way; items get the store's version (generation/ETag) and no mode or owner.
    """
    if not isinstance(root, (str, os.PathLike)):
        if not root.is_local:
            return _list_store(root)
        root = root.url  # a LocalStore: the directory listing below, with modes and owners
    return listing_of(read_dir(root))


def listing_of(snapshot: DirSnapshot) -> CacheListing:
    """The snapshot's names classified, in name order."""
    items = []
    keys: dict[str, str] = {}  # an entry's -cache and -atime items share one key string
    for name, mode, uid, size, mtime_ns, ino, ctime_ns in sorted(snapshot.members, key=_first):
        is_link = stat.S_ISLNK(mode)
        is_dir = stat.S_ISDIR(mode)
        kind, key = classify(name, is_dir)
        if not (is_link or is_dir or stat.S_ISREG(mode)):
            kind, key = FileKind.UNKNOWN, None  # a FIFO, socket or device: never opened
        elif key is not None:
            key = keys.setdefault(key, key)
        # no version: a local file's identity is its inode and times (fsops.FileId)
        items.append(
            _dir_item(
                name, kind, key, size, mtime_ns, mode, uid, is_link, is_dir, None, ino, ctime_ns
            )
        )
    return CacheListing(snapshot.root, tuple(items), snapshot.root_mode, snapshot.root_uid)


_first = operator.itemgetter(0)


# DirItem is frozen and slotted: a listing of 100,000 names makes 100,000 of them
_dir_item = slot_filler(DirItem, [f.name for f in dataclasses.fields(DirItem)])


def store_item(si: StoreItem) -> DirItem:
    """Classify one member of a store's listing (no mode or owner: uid -1)."""
    kind, key = classify(si.name, si.is_dir)
    return DirItem(
        name=si.name,
        kind=kind,
        key=key,
        size=si.size,
        mtime_ns=si.mtime_ns,
        mode=stat.S_IFDIR if si.is_dir else stat.S_IFREG,
        uid=-1,
        is_symlink=False,
        is_dir=si.is_dir,
        version=si.version,
    )


def _list_store(store: Store) -> CacheListing:
    """A bucket's listing; a ``cachedoctor-index/`` folder uploaded with a local cache is left
    out, as ``read_dir`` leaves it out (a bucket's own index is in the user cache dir)."""
    listed = (si for si in store.list() if not (si.is_dir and si.name == INDEX_DIRNAME))
    items = sorted((store_item(si) for si in listed), key=lambda i: i.name)
    return CacheListing(store.url, tuple(items), stat.S_IFDIR, -1, remote=not store.is_local)


def read_atime(path: str | os.PathLike[str]) -> int | None:
    """The nanosecond timestamp in a ``-atime`` file (8 bytes, little-endian), or None."""
    try:
        fh = open_regular(path)
    except OSError:
        return None
    with fh:
        data = fh.read(9)
    return int.from_bytes(data, "little") if len(data) == 8 else None
