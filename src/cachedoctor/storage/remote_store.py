"""A cache prefix in a GCS or S3 bucket, reached through gcsfs / s3fs as JAX reaches it.

JAX reaches a URL cache directory through ``etils.epath``, which hands ``gs://`` and ``s3://``
to fsspec's ``gcsfs`` and ``s3fs``; ``RemoteStore`` makes a private instance of the same
filesystem, configured by the same environment, with the library's own retries off (ours are
in :mod:`.retry`). Reads are ranged and retried per read (``_RetryingReader``), never turned
into "corrupt entry"; ``delete_if_unchanged`` re-checks the generation (GCS) or ETag (S3) and
sends the delete conditionally. Separate from :mod:`.stores` because only a bucket cache dir
needs it: importing it brings fsspec's glue, which a local cache never loads.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, TypeVar, cast

from cachedoctor.storage.model import (
    DeleteOutcome,
    DeleteResult,
    IoStats,
    MissingExtraError,
    StoreItem,
)
from cachedoctor.storage.retry import RetryPolicy, bounded_map, call_with_retry
from cachedoctor.storage.urls import SCHEMES, split_url

T = TypeVar("T")

EXTRA_PACKAGES = {"gcs": "gcsfs", "s3": "s3fs"}
DEFAULT_WORKERS = 16  # concurrent requests per scan: well under any bucket's request-rate limit
READ_BLOCK = 4 << 20  # one ranged GET per 4 MiB; a CPU entry is read in one request


def _import_filesystem(scheme: str) -> Any:
    """The fsspec filesystem class for a scheme, or a MissingExtraError naming the extra."""
    extra = SCHEMES[scheme]
    try:
        if scheme == "s3":
            import s3fs

            return s3fs.S3FileSystem
        import gcsfs

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            # An emulator speaks the JSON API only; gcsfs's extended class would first probe
            # the bucket type over gRPC, which an emulator does not serve (a 60 s stall).
            from gcsfs.core import GCSFileSystem

            return GCSFileSystem
        return gcsfs.GCSFileSystem
    except ImportError as exc:
        raise MissingExtraError(
            f"{scheme}:// cache directories need {EXTRA_PACKAGES[extra]}: "
            f"pip install '.[{extra}]' in a clone of cachedoctor"
        ) from exc


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


def _with_listing_index(cls: Any, scheme: str) -> Any:
    """``cls`` with its lookups of one object in a cached listing served by a ListingIndex."""

    if scheme == "s3":

        class CachedoctorS3FileSystem(cls):  # type: ignore[misc]
            def _ls_from_cache(self, path: str) -> Any:
                # fsspec's own rules, bar the scan: the path's own listing, else the parent's
                # listing's entries of that name (FileNotFoundError when it has none)
                told = self._cachedoctor_index.told(path)
                if told is not None:
                    return [told]
                stripped = path.rstrip("/")
                with contextlib.suppress(KeyError):
                    return self.dircache[stripped]
                if stripped != path:
                    return super()._ls_from_cache(path)
                parent = self._parent(path)
                try:
                    listing = self.dircache[parent]
                except KeyError:
                    return None
                found = self._cachedoctor_index.named(parent, listing, path)
                if not found:
                    raise FileNotFoundError(path)
                return list(found)

        return CachedoctorS3FileSystem

    class CachedoctorGCSFileSystem(cls):  # type: ignore[misc]
        async def _info(self, path: str, generation: Any = None, **kwargs: Any) -> Any:
            # gcsfs's first answer, bar the scan: the first entry of the parent's cached listing
            # with this name; anything else (a generation, no listing, no entry) is gcsfs's
            stripped = self._strip_protocol(path).rstrip("/")
            told = self._cachedoctor_index.told(stripped)
            if told is not None and generation is None:
                return told
            if "/" in stripped and generation is None:
                bucket, key, path_generation = self.split_path(stripped)
                parent = self._parent(stripped)
                listing = self._ls_from_cache(parent)
                if listing and not path_generation:
                    found = self._cachedoctor_index.named(parent, listing, f"{bucket}/{key}")
                    if found:
                        return found[0]
            return await super()._info(path, generation=generation, **kwargs)

    return CachedoctorGCSFileSystem


def _filesystem_class(scheme: str) -> Any:
    """The library's filesystem class (imported every time: a missing extra is named), its own
    retries off (gcsfs) and its listings indexed."""
    return _adapted(_import_filesystem(scheme), scheme)


@functools.cache
def _adapted(cls: Any, scheme: str) -> Any:
    if scheme != "s3":
        request = getattr(cls, "_request", None)
        unwrapped = getattr(request, "__wrapped__", None)
        if unwrapped is not None:  # gcsfs wraps _request in retry_request(retries=6)
            cls = type("CachedoctorGCSRequests", (cls,), {"_request": unwrapped})
    return _with_listing_index(cls, scheme)


def _make_filesystem(scheme: str) -> Any:
    """A private instance of the filesystem JAX would use, with the library's retries off and
    its lookups in cached listings indexed (``ListingIndex``).

    Our ``call_with_retry`` owns the retry policy: with the libraries retrying too, attempts
    would multiply (s3fs 5 times botocore 5 times ours) and no retry would be visible to us.
    """
    cls = _filesystem_class(scheme)
    if scheme == "s3":
        fs = cls(skip_instance_cache=True, config_kwargs={"retries": {"total_max_attempts": 1}})
        fs.retries = 1  # s3fs's own loop around botocore
    else:
        fs = cls(skip_instance_cache=True)
    fs._cachedoctor_index = ListingIndex(strip=scheme != "s3")
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


def _norm_etag(etag: object) -> str | None:
    return str(etag).strip('"') if etag else None


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

    def retry(self, fn: Callable[[], T], *, what: str) -> T:
        return call_with_retry(fn, what=what, stats=self.stats, policy=self.policy)

    def map(self, fn: Callable[[T], Any], items: Sequence[T]) -> builtins.list[Any]:
        return bounded_map(fn, items, self.workers)

    # listing
    def _item(self, info: dict[str, Any]) -> StoreItem:
        name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
        is_dir = info.get("type") == "directory"
        version = info.get("generation") if self.scheme == "gs" else _norm_etag(info.get("ETag"))
        return StoreItem(
            name=name,
            size=int(info.get("size") or 0),
            mtime_ns=_mtime_ns(info),
            version=str(version) if version is not None else None,
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
        bucket, key = self.bucket, self.path_of(name).split("/", 1)[1]

        def head() -> str | None:
            if self.scheme == "s3":
                return _norm_etag(self.fs.call_s3("head_object", Bucket=bucket, Key=key)["ETag"])
            from fsspec.asyn import sync

            found = sync(
                self.fs.loop, self.fs._call, "GET", "b/{}/o/{}", bucket, key, json_out=True
            )
            return str(found["generation"])

        try:
            version = self.retry(head, what=f"checking {self.url_of(name)}")
        except FileNotFoundError:
            return None
        except Exception as exc:
            if _s3_error_code(exc) in ("NoSuchKey", "404", "NotFound"):
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
                if self.scheme == "s3":
                    info.update(Key=path, Size=size, ETag=f'"{version}"')
                else:
                    info["generation"] = version
                details[path] = info
        index = getattr(self.fs, "_cachedoctor_index", None)  # None: JAX's own filesystem
        with index.telling(details) if index is not None and details else contextlib.nullcontext():
            yield

    def open_read(self, name: str) -> BinaryIO:
        return cast(BinaryIO, _RetryingReader(self, name))

    def write_atomic(self, name: str, data: bytes, *, create: bool = False) -> None:
        """One PUT: an object store publishes an object whole or not at all (no rename).

        ``create``: the PUT carries a precondition (S3 ``If-None-Match: *``, GCS
        ``ifGenerationMatch=0``), so the server keeps the object a concurrent writer put first
        and this raises FileExistsError. An S3 server that rejects the header as unsupported
        gets a fresh existence check, then a plain PUT.
        """
        path = self.path_of(name)
        what = f"writing {self.url_of(name)}"
        if not create:
            self.retry(lambda: self.fs.pipe_file(path, data), what=what)
        else:
            try:
                self.retry(lambda: self.fs.pipe_file(path, data, mode="create"), what=what)
            except FileExistsError:
                raise
            except Exception as exc:
                if _s3_error_code(exc) not in ("NotImplemented", "501"):
                    raise
                if self.stat(name) is not None:
                    raise FileExistsError(errno.EEXIST, "exists", self.url_of(name)) from exc
                self.retry(lambda: self.fs.pipe_file(path, data), what=what)
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
        expected = version or current.version
        if self.scheme == "gs":
            return self._delete_gcs(name, expected)
        return self._delete_s3(name, expected)

    def _delete_gcs(self, name: str, generation: str | None) -> DeleteResult:
        from fsspec.asyn import sync

        params = {"ifGenerationMatch": generation} if generation else {}

        def delete() -> None:
            sync(
                self.fs.loop,
                self.fs._call,
                "DELETE",
                "b/{}/o/{}",
                self.bucket,
                self.path_of(name).split("/", 1)[1],
                **params,
            )

        try:
            self.retry(delete, what=f"deleting {self.url_of(name)}")
        except FileExistsError:  # gcsfs raises it for 412 Precondition Failed
            return DeleteResult(name, DeleteOutcome.CHANGED, conditional=True)
        except FileNotFoundError:
            return DeleteResult(name, DeleteOutcome.GONE, conditional=bool(generation))
        finally:
            self.fs.invalidate_cache(self.path_of(name))
        self.stats.count_call()
        return DeleteResult(name, DeleteOutcome.DELETED, conditional=bool(generation))

    def _delete_s3(self, name: str, etag: str | None) -> DeleteResult:
        key = self.path_of(name).split("/", 1)[1]

        def delete(conditional: bool) -> None:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
            if conditional and etag:
                kwargs["IfMatch"] = f'"{etag}"'
            self.fs.call_s3("delete_object", **kwargs)

        try:
            self.retry(lambda: delete(True), what=f"deleting {self.url_of(name)}")
            conditional = bool(etag)
        except Exception as exc:
            code = _s3_error_code(exc)
            if code == "PreconditionFailed":
                return DeleteResult(name, DeleteOutcome.CHANGED, conditional=True)
            if code in ("NoSuchKey", "404"):
                return DeleteResult(name, DeleteOutcome.GONE, conditional=True)
            if code not in ("NotImplemented", "InvalidArgument", "501"):
                raise
            again = self.stat(name)  # the server ignores If-Match on DELETE: check once more
            if again is None:
                return DeleteResult(name, DeleteOutcome.GONE, conditional=False)
            if etag is not None and again.version != etag:
                return DeleteResult(name, DeleteOutcome.CHANGED, conditional=False)
            self.retry(lambda: delete(False), what=f"deleting {self.url_of(name)}")
            conditional = False
        finally:
            self.fs.invalidate_cache(self.path_of(name))
        self.stats.count_call()
        return DeleteResult(name, DeleteOutcome.DELETED, conditional=conditional)


def _s3_error_code(exc: BaseException) -> str | None:
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            return str((response.get("Error") or {}).get("Code") or "") or None
        if isinstance(current, FileNotFoundError):
            return "NoSuchKey"
        current = current.__cause__ or current.__context__
    return None
