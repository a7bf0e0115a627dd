"""A cache directory on a local (or NFS/Lustre) filesystem, behind the ``Store`` protocol.

The reader's own behaviour for a folder: ``os.scandir`` listings that skip entries JAX evicts
meanwhile, no-follow opens, atomic writes (temp file, fsync, rename or hard link) and a delete
that re-checks inode, size and mtime first. Separate from the bucket store because it shares
none of its machinery (no fsspec, no retries): only the values in :mod:`.model`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, TypeVar

from cachedoctor.storage.files import open_regular
from cachedoctor.storage.fsops import CacheDir
from cachedoctor.storage.model import DeleteOutcome, DeleteResult, IoStats, StoreItem
from cachedoctor.storage.retry import bounded_map

T = TypeVar("T")


def local_version(st: os.stat_result) -> str:
    """What identifies one version of a local file for a conditional delete."""
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


class LocalStore:
    """A cache directory on a local (or NFS/Lustre) filesystem: the reader's own behaviour."""

    is_local = True

    def __init__(self, root: str, *, workers: int = 4) -> None:
        self.root = root
        self.url = root
        self.workers = workers
        self.stats = IoStats()

    def url_of(self, name: str) -> str:
        return os.path.join(self.root, name)

    def _item(self, name: str, st: os.stat_result) -> StoreItem:
        return StoreItem(
            name=name,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            version=local_version(st),
            is_dir=stat.S_ISDIR(st.st_mode),
        )

    @contextlib.contextmanager
    def _folder(self, sub: str, *, create: bool = False) -> Iterator[CacheDir]:
        """The folder ``sub`` of the root, open, every part of it below the root a folder of
        its own (``CacheDir.walk``: a link planted at ``cachedoctor-stats/`` is never entered;
        OSError ELOOP). The root itself is the user's to name, a link included."""
        if create:
            with contextlib.suppress(FileExistsError):  # a file there: the open says ENOTDIR
                os.makedirs(self.root, exist_ok=True)
        with CacheDir.open(self.root) as root, root.walk(sub, create=create) as folder:
            yield folder

    def list(self, sub: str = "") -> builtins.list[StoreItem]:
        """Names directly under the root, or under its folder ``sub`` (e.g. the manifests)."""
        items = []
        with self._folder(sub) as folder, os.scandir(folder.fd) as it:
            for de in it:
                with contextlib.suppress(OSError):  # vanished: a concurrent JAX eviction
                    items.append(self._item(de.name, de.stat(follow_symlinks=False)))
        return sorted(items, key=lambda i: i.name)

    def stat(self, name: str) -> StoreItem | None:
        """The file's item (links not followed), None when absent, or when a folder on its way
        is not one (a link there leads outside the cache)."""
        sub, base = _split(name)
        try:
            with self._folder(sub) as folder:
                st = folder.lstat(base)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            return None
        return None if st is None else self._item(name, st)

    def fresh_version(self, name: str) -> str | None:
        """The file's version now (``stat``'s), None when it is gone."""
        item = self.stat(name)
        return item.version if item is not None else None

    @contextlib.contextmanager
    def reading_as_listed(self, listed: Iterable[tuple[str, int, str | None]]) -> Iterator[None]:
        """A folder's reads ask the file system itself: nothing to be told."""
        yield

    def open_read(self, name: str) -> BinaryIO:
        sub, base = _split(name)
        if not sub:  # the common case (an entry): one open, no folder walked
            return open_regular(self.url_of(name))
        with self._folder(sub) as folder:
            try:
                return open_regular(base, dir_fd=folder.fd)
            except OSError as exc:  # named by its whole path, as an open by path names it
                raise OSError(exc.errno, exc.strerror, self.url_of(name)) from None

    def delete_if_unchanged(self, name: str, version: str | None) -> DeleteResult:
        """Unlink ``name`` if its inode, size and mtime are still those of the plan.

        POSIX has no conditional unlink: the window is one lstat-to-unlink, and JAX never
        rewrites an entry in place (it writes a new file), so a changed file is caught here.
        The file is looked up and removed relative to its folder, opened without following a
        link (``CacheDir``).
        """
        sub, base = _split(name)
        with self._folder(sub) as folder:
            st = folder.lstat(base)
            if st is None:
                return DeleteResult(name, DeleteOutcome.GONE, conditional=False)
            if version is not None and local_version(st) != version:
                return DeleteResult(name, DeleteOutcome.CHANGED, conditional=False)
            try:
                os.unlink(base, dir_fd=folder.fd)
            except FileNotFoundError:
                return DeleteResult(name, DeleteOutcome.GONE, conditional=False)
        return DeleteResult(name, DeleteOutcome.DELETED, conditional=False)

    def write_atomic(
        self, name: str, data: bytes | os.PathLike[str], *, create: bool = False, mode: int = 0o600
    ) -> None:
        """Temp file in the same directory, fsync, rename: readers see old or new, never half.
        ``data``: the bytes, or a local file copied a chunk at a time.

        ``name`` may name a file in a folder (``cachedoctor-manifests/<key>.json``), made when
        absent; no part of the way is a link followed (``CacheDir``). With ``create``,
        FileExistsError when it exists (a hard link publishes it, never replacing), and the
        new file gets ``mode`` (an entry others read: the mode JAX's own writes get).
        """
        sub, base = _split(name)
        with self._folder(sub, create=True) as folder:
            if create:
                if not folder.write_new(base, data, mode=mode):
                    raise FileExistsError(errno.EEXIST, "File exists", self.url_of(name))
            else:
                folder.write_replacing(base, data)
            folder.fsync()

    def map(self, fn: Callable[[T], Any], items: Sequence[T]) -> builtins.list[Any]:
        return bounded_map(fn, items, self.workers)


def _split(name: str) -> tuple[str, str]:
    """``a/b/c`` -> (``a/b``, ``c``): the folder below the root and the name in it."""
    sub, _, base = name.rpartition("/")
    return sub, base
