"""A cache prefix in a GCS or S3 bucket, reached through gcsfs / s3fs as JAX reaches it.

JAX reaches a URL cache directory through ``etils.epath``, which hands ``gs://`` and ``s3://``
to fsspec's ``gcsfs`` and ``s3fs``; ``RemoteStore`` makes a private instance of the same
filesystem, configured by the same environment, with the library's own retries off (ours are
in :mod:`.retry`). Reads are ranged and retried per read (``_RetryingReader``), never turned
into "corrupt entry"; ``delete_if_unchanged`` re-checks the generation (GCS) or ETag (S3) and
sends the delete conditionally. What differs between services is their backend's
(:mod:`.backends`): this module names none. Separate from :mod:`.stores` because only a bucket
cache dir needs it: importing it brings fsspec's glue, which a local cache never loads.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, TypeVar, cast

from cachedoctor.storage import backends
from cachedoctor.storage.backends import Backend, Failure, Op, failure_of
from cachedoctor.storage.model import (
    DeleteOutcome,
    DeleteResult,
    IoStats,
    MissingExtraError,
    StoreItem,
)
from cachedoctor.storage.retry import RetryPolicy, bounded_map, call_with_retry
from cachedoctor.storage.urls import split_url

T = TypeVar("T")

DEFAULT_WORKERS = 16  # concurrent requests per scan: well under any bucket's request-rate limit
READ_BLOCK = 4 << 20  # one ranged GET per 4 MiB; a CPU entry is read in one request
PART = 8 << 20  # an upload's part: over S3's 5 MiB least, a multiple of GCS's 256 KiB
MAX_PARTS = 10_000  # S3's most parts in one multipart upload


def part_size(size: int) -> int:
    """The part a file of ``size`` bytes is uploaded in: :data:`PART`, or as large as S3's
    part limit needs (a multiple of 256 KiB)."""
    needed = -(-size // MAX_PARTS)
    return max(PART, -(-needed // (256 << 10)) * (256 << 10))


Listing = list[dict[str, Any]]


class ListingIndex:
    """A filesystem's cached listings, each indexed by object name once.

    fsspec finds an object's details in its parent's cached listing by a linear scan (s3fs in
    ``_ls_from_cache``, gcsfs in ``_info``), and every open asks for them: after a listing of n
    objects, opening each costs O(n), 8 ms an open at 100k objects, which made a bucket scan's
    time per object grow 4 x from 10k to 100k objects. The index is rebuilt whenever the
    cached listing is another list or has another length, so it answers what the scan would.
    ``strip``: names are keyed without a trailing slash (gcsfs compares them so).

    It also answers for objects another process listed (``telling``): a worker that reads
    the objects a scan listed takes their details from the scan, not from a request each.
    """

    def __init__(self, *, strip: bool) -> None:
        self._strip = strip
        self._kept: dict[str, tuple[Listing, int, dict[str, Listing]]] = {}
        self._told: dict[str, dict[str, Any]] = {}

    def told(self, path: str) -> dict[str, Any] | None:
        """The details a caller of ``telling`` gave for ``path``, if it is being told."""
        return self._told.get(path)

    @contextlib.contextmanager
    def telling(self, details: dict[str, dict[str, Any]]) -> Iterator[None]:
        """Lookups of these paths (fsspec paths to details) answer those details in the block."""
        self._told.update(details)
        try:
            yield
        finally:
            for path in details:
                self._told.pop(path, None)

    def named(self, parent: str, listing: Listing, name: str) -> Listing:
        """The entries of ``listing`` (``parent``'s cached listing) named ``name``, in order."""
        kept = self._kept.get(parent)
        if kept is None or kept[0] is not listing or kept[1] != len(listing):
            by_name: dict[str, Listing] = {}
            for info in listing:
                key = str(info.get("name", ""))
                by_name.setdefault(key.rstrip("/") if self._strip else key, []).append(info)
            kept = (listing, len(listing), by_name)
            self._kept[parent] = kept  # a race rebuilds the same index twice: harmless
        return kept[2].get(name, [])


def _filesystem_class(backend: Backend) -> Any:
    """The library's filesystem class (imported every time: a missing extra is named), its own
    retries off and its listings indexed (``Backend.adapt``)."""
    try:
        cls = backend.filesystem_class()
    except ImportError as exc:
        raise MissingExtraError(
            f"{backend.scheme}:// cache directories need {backend.package}: "
            f"pip install '.[{backend.extra}]' in a clone of cachedoctor"
        ) from exc
    return backend.adapt(cls)


def _make_filesystem(scheme: str) -> Any:
    """A private instance of the filesystem JAX would use, with the library's retries off and
    its lookups in cached listings indexed (``ListingIndex``).

    Our ``call_with_retry`` owns the retry policy: with the libraries retrying too, attempts
    would multiply (s3fs 5 times botocore 5 times ours) and no retry would be visible to us.
    """
    backend = backends.backend_for(scheme)
    fs = backend.new_filesystem(_filesystem_class(backend))
    fs._cachedoctor_index = ListingIndex(strip=backend.strip_listed_names)
    return fs


def _mtime_ns(info: dict[str, Any]) -> int:
    for key in ("mtime", "LastModified", "updated", "last_modified"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1e9)
        if isinstance(value, (int, float)):
            return int(value * 1e9)
        if isinstance(value, str):
            from datetime import datetime

            with contextlib.suppress(ValueError):
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
    return 0


class _RetryingReader:
    """A seekable binary reader over one object: ranged reads, each retried on throttling.

    After a failed read the underlying fsspec file is dropped and reopened at the same offset,
    so a throttled range never turns into a short read (which the reader would call damage).
    """

    def __init__(self, store: RemoteStore, name: str) -> None:
        self._store = store
        self._name = name
        self._path = store.path_of(name)
        self._fh: Any = None
        self._pos = 0
        self.closed = False

    def _open(self) -> Any:
        if self._fh is None:
            self._fh = self._store.fs.open(
                self._path, "rb", block_size=READ_BLOCK, cache_type="readahead"
            )
            self._fh.seek(self._pos)
        return self._fh

    def _drop(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(Exception):
                fh.close()

    def read(self, n: int = -1) -> bytes:
        def attempt() -> bytes:
            try:
                return bytes(self._open().read(n))
            except BaseException:
                self._drop()
                raise

        data = self._store.retry(attempt, what=f"reading {self._store.url_of(self._name)}")
        self._store.stats.count_call(len(data))
        self._pos += len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            self._pos = offset
        elif whence == os.SEEK_CUR:
            self._pos += offset
        else:
            self._pos = (
                self._store.retry(lambda: int(self._open().size), what=f"size of {self._name}")
                + offset
            )
        if self._fh is not None:
            self._fh.seek(self._pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._drop()
        self.closed = True

    def __enter__(self) -> _RetryingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteStore:
    """A cache prefix in a GCS or S3 bucket, reached through gcsfs / s3fs as JAX reaches it."""

    is_local = False

    def __init__(
        self,
        url: str,
        *,
        workers: int = DEFAULT_WORKERS,
        policy: RetryPolicy | None = None,
        fs: Any = None,
    ) -> None:
        self.scheme, self.bucket, self.prefix = split_url(url)
        self.backend = backends.backend_for(self.scheme)
        self.url = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.workers = max(1, workers)
        self.policy = policy or RetryPolicy()
        self.stats = IoStats()
        self.fs = fs if fs is not None else _make_filesystem(self.scheme)

    # names
    def path_of(self, name: str = "") -> str:
        """The fsspec path (``bucket/prefix/name``) of a member."""
        parts = [self.bucket, *([self.prefix] if self.prefix else []), *([name] if name else [])]
        return "/".join(parts)

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _key(self, name: str) -> str:
        """The object key of a member (``prefix/name``), without the bucket."""
        return self.path_of(name).split("/", 1)[1]

    def retry(self, fn: Callable[[], T], *, what: str) -> T:
        return call_with_retry(fn, what=what, stats=self.stats, policy=self.policy)

    def map(self, fn: Callable[[T], Any], items: Sequence[T]) -> builtins.list[Any]:
        return bounded_map(fn, items, self.workers)

    # listing
    def _item(self, info: dict[str, Any]) -> StoreItem:
        name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
        is_dir = info.get("type") == "directory"
        return StoreItem(
            name=name,
            size=int(info.get("size") or 0),
            mtime_ns=_mtime_ns(info),
            version=self.backend.version_of(info),
            is_dir=is_dir,
        )

    def list(self, sub: str = "") -> builtins.list[StoreItem]:
        """One listing of the prefix (paged by the library), then sub-prefix totals in the pool.

        With ``sub``, the listing of that folder under the prefix (e.g. the manifests).
        """
        root = self.path_of(sub.strip("/"))

        def ls() -> builtins.list[dict[str, Any]]:
            self.fs.invalidate_cache(root)
            return list(self.fs.ls(root, detail=True))

        try:
            infos = self.retry(ls, what=f"listing {self.url}")
        except FileNotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, "no such bucket or prefix", self.url) from exc
        self.stats.count_call()
        items = [self._item(i) for i in infos]
        items = [i for i in items if i.name]
        dirs = [i for i in items if i.is_dir]
        if dirs:
            prefix = f"{sub.strip('/')}/" if sub else ""
            totals = self.map(lambda d: self.tree_size(prefix + d.name), dirs)
            sizes = dict(zip([d.name for d in dirs], totals, strict=True))
            items = [
                StoreItem(i.name, sizes[i.name], i.mtime_ns, None, True) if i.is_dir else i
                for i in items
            ]
        return sorted(items, key=lambda i: i.name)

    def tree_size(self, name: str) -> int:
        path = self.path_of(name)
        found = self.retry(
            lambda: self.fs.find(path, detail=True), what=f"listing {self.url_of(name)}"
        )
        self.stats.count_call()
        return sum(int(v.get("size") or 0) for v in found.values())

    def stat(self, name: str) -> StoreItem | None:
        path = self.path_of(name)

        def info() -> dict[str, Any]:
            self.fs.invalidate_cache(path)
            return dict(self.fs.info(path))

        try:
            result = self.retry(info, what=f"checking {self.url_of(name)}")
        except FileNotFoundError:
            return None
        self.stats.count_call()
        return self._item(result)

    def fresh_version(self, name: str) -> str | None:
        """The object's version (ETag / generation) asked of the server now, None when it is
        gone; unlike ``stat``, the cached listing stays (the rest of a scan still reads by it)."""
        bucket, key = self.bucket, self._key(name)

        def head() -> str | None:
            return self.backend.head_version(self.fs, bucket, key)

        try:
            version = self.retry(head, what=f"checking {self.url_of(name)}")
        except FileNotFoundError:
            return None
        except Exception as exc:
            if failure_of(exc, self.backend, Op.HEAD) is Failure.GONE:
                return None
            raise
        self.stats.count_call()
        return version

    # reading and writing
    @contextlib.contextmanager
    def reading_as_listed(self, listed: Iterable[tuple[str, int, str | None]]) -> Iterator[None]:
        """Reads of these objects, ``(name, size, version)`` as a listing elsewhere gave them,
        take their details from it rather than from a request each (a worker reading what the
        scan listed: one request an object instead of two on S3 and about four on GCS).

        The reads are then what the scan's own process does with its cached listing: an object
        rewritten since the listing fails its read on S3 (the listed ETag goes as ``If-Match``)
        and is read at the listed size on GCS; ``reader.decode_item`` tells either from damage.
        An object listed without a version is looked up as before.
        """
        details: dict[str, dict[str, Any]] = {}
        for name, size, version in listed:
            if version is not None:
                path = self.path_of(name)
                info: dict[str, Any] = {"name": path, "size": size, "type": "file"}
                info.update(self.backend.listed_fields(path, size, version))
                details[path] = info
        index = getattr(self.fs, "_cachedoctor_index", None)  # None: JAX's own filesystem
        with index.telling(details) if index is not None and details else contextlib.nullcontext():
            yield

    def open_read(self, name: str) -> BinaryIO:
        return cast(BinaryIO, _RetryingReader(self, name))

    def write_atomic(
        self, name: str, data: bytes | os.PathLike[str], *, create: bool = False, mode: int = 0o600
    ) -> None:
        """One PUT: an object store publishes an object whole or not at all (no rename).

        ``data``: the bytes, or a local file, uploaded in parts of :func:`part_size` (the
        library's multipart or resumable upload, aborted on failure: never published half), so
        a file of gigabytes is never held whole. ``create``: the PUT carries a precondition (S3
        ``If-None-Match: *``, GCS ``ifGenerationMatch=0``), so the server keeps the object a
        concurrent writer put first and this raises FileExistsError. An S3 server that rejects
        the header as unsupported gets a fresh existence check, then a plain PUT. ``mode``:
        objects have none.
        """
        path = self.path_of(name)
        what = f"writing {self.url_of(name)}"

        def put(mode: str) -> None:
            if isinstance(data, bytes | bytearray | memoryview):
                self.fs.pipe_file(path, data, **({"mode": mode} if mode == "create" else {}))
            else:
                part = part_size(os.path.getsize(data))
                self.fs.put_file(os.fspath(data), path, mode=mode, chunksize=part)

        if not create:
            self.retry(lambda: put("overwrite"), what=what)
        else:
            try:
                self.retry(lambda: put("create"), what=what)
            except FileExistsError:
                raise
            except Exception as exc:
                if failure_of(exc, self.backend, Op.CREATE) is not Failure.UNSUPPORTED:
                    raise
                if self.stat(name) is not None:
                    raise FileExistsError(errno.EEXIST, "exists", self.url_of(name)) from exc
                self.retry(lambda: put("overwrite"), what=what)
        self.stats.count_call()

    # deleting
    def delete_if_unchanged(self, name: str, version: str | None) -> DeleteResult:
        """Delete ``name`` only if it is still the version that was planned.

        Two checks: a fresh metadata read (works on every server), then the delete itself sent
        with a precondition (GCS ``ifGenerationMatch``, S3 ``If-Match``) so that a write landing
        between the two is refused by the server. A server that rejects the precondition as
        unsupported gets a plain delete right after the fresh check (``conditional=False``).
        """
        current = self.stat(name)
        if current is None:
            return DeleteResult(name, DeleteOutcome.GONE, conditional=False)
        if version is not None and current.version != version:
            return DeleteResult(name, DeleteOutcome.CHANGED, conditional=False)
        return self._send_delete(name, version or current.version)

    def _send_delete(self, name: str, version: str | None) -> DeleteResult:
        """The delete itself, conditional on ``version`` when there is one (no pre-check).

        ``conditional``: whether the server enforced the version (``Failure.UNSUPPORTED``: it
        rejects the precondition, so the object is checked once more and deleted plainly).
        """
        key, what = self._key(name), f"deleting {self.url_of(name)}"

        def delete(expected: str | None) -> None:
            self.backend.delete(self.fs, self.bucket, key, expected)

        try:
            self.retry(lambda: delete(version), what=what)
            conditional = bool(version)
        except Exception as exc:
            failure = failure_of(exc, self.backend, Op.DELETE)
            if failure is Failure.CHANGED:
                return DeleteResult(name, DeleteOutcome.CHANGED, conditional=True)
            if failure is Failure.GONE:
                return DeleteResult(name, DeleteOutcome.GONE, conditional=bool(version))
            if failure is not Failure.UNSUPPORTED:
                raise
            again = self.stat(name)  # the server ignores the precondition: check once more
            if again is None:
                return DeleteResult(name, DeleteOutcome.GONE, conditional=False)
            if version is not None and again.version != version:
                return DeleteResult(name, DeleteOutcome.CHANGED, conditional=False)
            self.retry(lambda: delete(None), what=what)
            conditional = False
        finally:
            self.fs.invalidate_cache(self.path_of(name))
        self.stats.count_call()
        return DeleteResult(name, DeleteOutcome.DELETED, conditional=conditional)
