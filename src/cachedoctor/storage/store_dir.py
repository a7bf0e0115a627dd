"""A bucket prefix with ``fsops.CacheDir``'s calls, so prune and rekey plan and apply on
``gs://`` and ``s3://`` as on a folder (``storage/fsops.Folder``)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cachedoctor.storage.fileid import FileId

if TYPE_CHECKING:
    from cachedoctor.storage.stores import Store


@dataclass(frozen=True)
class ObjectStat:
    """An object's metadata in the shape of the ``os.stat_result`` fields the planners read."""

    st_size: int
    st_mtime_ns: int
    version: str | None
    st_mode: int = stat.S_IFREG | 0o644
    st_ino: int = 0
    st_uid: int = -1


_OUTCOME = {"deleted": "removed", "changed": "changed", "gone": "missing"}


class StoreDir:
    """``CacheDir``'s calls over a bucket prefix (a ``storage.Store``): prune on gs:// and s3://.

    A bucket has no links, modes or locks (JAX takes no lock there either), so ``lock`` holds
    nothing. What makes a removal safe next to writers on other hosts is the conditional
    delete: ``unlink_if`` sends the generation/ETag the plan saw, and an object rewritten
    since then is kept ("changed"). Metadata from a listing is remembered for planning
    (``lstat`` of a listed folder costs no request); removals always re-check on the server.
    """

    is_remote = True

    def __init__(self, store: Store, rel: str = "") -> None:
        self.store = store
        self.rel = rel.strip("/")
        self.path = store.url_of(self.rel) if self.rel else store.url
        self.fd = -1
        self._seen: dict[str, ObjectStat] = {}
        self._listed = False
        self._subs: dict[str, StoreDir] = {}

    @classmethod
    def open(cls, url: str) -> StoreDir:
        from cachedoctor.storage.stores import open_store

        return cls(open_store(url))

    def close(self) -> None:
        pass

    def __enter__(self) -> StoreDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _name(self, name: str) -> str:
        return f"{self.rel}/{name}" if self.rel else name

    def remember(self, items: Iterable[tuple[str, int, int, str | None, bool]]) -> None:
        """A listing of this folder: (name, size, mtime_ns, version, is_dir) of every member."""
        for name, size, mtime_ns, version, is_dir in items:
            mode = stat.S_IFDIR | 0o755 if is_dir else stat.S_IFREG | 0o644
            self._seen[name] = ObjectStat(size, mtime_ns, version, mode)
        self._listed = True

    def listdir(self) -> list[str]:
        try:
            items = self.store.list(self.rel)
        except FileNotFoundError:
            items = []
        self.remember((i.name, i.size, i.mtime_ns, i.version, i.is_dir) for i in items)
        return sorted(i.name for i in items)

    def subdir(self, name: str, *, create: bool = False) -> StoreDir | None:
        """A prefix below this one. Object stores have no empty folders: it always "exists"."""
        known = self._seen.get(name)
        if known is not None and not stat.S_ISDIR(known.st_mode):
            return None
        if name not in self._subs:
            self._subs[name] = StoreDir(self.store, self._name(name))
        return self._subs[name]

    def lstat(self, name: str) -> ObjectStat | None:
        known = self._seen.get(name)
        if known is not None or self._listed:
            return known
        item = self.store.stat(self._name(name))
        if item is None:
            return None
        return ObjectStat(item.size, item.mtime_ns, item.version)

    def regular(self, name: str) -> ObjectStat | None:
        st = self.lstat(name)
        return st if st is not None and stat.S_ISREG(st.st_mode) else None

    def read_small(self, name: str, limit: int = 1 << 20) -> bytes | None:
        try:
            with self.store.open_read(self._name(name)) as fh:
                return fh.read(limit)
        except OSError:
            return None

    def read_many(self, names: list[str], limit: int = 1 << 20) -> list[bytes | None]:
        """``read_small`` of each name, in order: one GET each, concurrently on the pool."""
        return list(self.store.map(lambda n: self.read_small(n, limit), names))

    def as_store(self) -> Store:
        """This prefix as a ``Store``: the one it was opened on, or one for a folder below."""
        from cachedoctor.storage.stores import open_store

        return self.store if not self.rel else open_store(self.path)

    @contextlib.contextmanager
    def lock(self, timeout: float = 30.0) -> Iterator[bool]:
        """Nothing to take: see the class docstring (conditional deletes instead)."""
        yield False

    def unlink_if(self, expected: FileId | None, name: str | None = None) -> str:
        """Delete the object if it is still the version the plan saw (server-enforced)."""
        name = name or (expected.name if expected else None)
        assert name is not None
        version = expected.version if expected is not None else None
        result = self.store.delete_if_unchanged(self._name(name), version)
        self._seen.pop(name, None)
        return _OUTCOME[result.outcome.value]

    def write_new(
        self, name: str, data: bytes | os.PathLike[str], mode: int = 0o644, *, durable: bool = True
    ) -> bool:  # an object is durable once written: ``durable`` changes nothing here
        if self.store.stat(self._name(name)) is not None:
            return False
        self.store.write_atomic(self._name(name), data)
        return True

    def link_noreplace(self, src: str, dst: str) -> bool:
        raise OSError(errno.ENOTSUP, "no links in a bucket", self.path)

    def chmod_nofollow(self, name: str, clear_bits: int, expected: FileId | None = None) -> str:
        return "not-a-file"  # objects have no modes

    def fsync(self) -> None:
        pass
