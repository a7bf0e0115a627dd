"""Where a cache lives: a local directory, or a prefix in a GCS or S3 bucket.

JAX reaches a URL cache directory through ``etils.epath``, which hands ``gs://`` and ``s3://``
to fsspec's ``gcsfs`` and ``s3fs``. ``RemoteStore`` uses the same fsspec filesystems, configured
by the same environment (credentials, ``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``,
``FSSPEC_*``), so cachedoctor sees the bucket exactly as JAX does.

Three rules make a bucket safe to inspect and prune next to writers on other hosts:

- every call that can be throttled goes through ``call_with_retry`` (the one retry policy:
  exponential backoff with jitter on 429/503/SlowDown; the libraries' own retries are turned off
  where they allow it, so attempts do not multiply and every retry is counted);
- reads are ranged (fsspec block reads) and retried per read, never turned into "corrupt entry";
- ``delete_if_unchanged`` re-checks the object's generation (GCS) or ETag (S3) right before the
  delete and sends the delete conditionally (``ifGenerationMatch`` / ``If-Match``), so an object
  rewritten after the plan was made is never deleted.

The reader stays the one decoder: ``cache.reader.decode_entries`` hands it open file objects.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import enum
import errno
import os
import random
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol, TypeVar, cast, runtime_checkable

from cachedoctor.errors import CachedoctorError
from cachedoctor.storage.files import atomic_file, open_regular
from cachedoctor.storage.urls import SCHEMES, is_url, split_url

T = TypeVar("T")

EXTRA_PACKAGES = {"gcs": "gcsfs", "s3": "s3fs"}
DEFAULT_WORKERS = 16  # concurrent requests per scan: well under any bucket's request-rate limit
READ_BLOCK = 4 << 20  # one ranged GET per 4 MiB; a CPU entry is read in one request

_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "ConditionalRequestConflict",  # S3's 409 while another conditional write is in flight
    "503",
    "429",
    "500",
}
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
_THROTTLE_TEXT = ("SlowDown", "reduce your request rate", "Too Many Requests", "TooManyRequests")
_TRANSIENT_TYPES = {  # dropped or refused connections and timeouts, by class name
    "ProxyError",
    "ReadTimeout",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "ClientConnectionError",
    "ClientConnectorError",
    "ClientOSError",
    "ClientPayloadError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
}


class MissingExtraError(CachedoctorError):
    """A ``gs://`` or ``s3://`` directory without the packages to reach it."""

    slug = "missing-extra"


class StoreError(CachedoctorError):
    """The store kept failing (throttled past the retry budget, or refused us)."""

    slug = "store"


# --- what a store holds ----------------------------------------------------------------------


@dataclass(frozen=True)
class StoreItem:
    """One name directly under the cache prefix.

    ``version`` identifies this exact content: the GCS generation, the S3 ETag, or for a local
    file ``inode:size:mtime_ns``. ``size`` of a directory (a sub-cache prefix) is the total of
    the objects under it on a remote store.
    """

    name: str
    size: int
    mtime_ns: int
    version: str | None
    is_dir: bool = False


class DeleteOutcome(enum.StrEnum):
    DELETED = "deleted"
    CHANGED = "changed"  # rewritten since the plan (generation/ETag differs): kept
    GONE = "gone"  # already deleted by someone else


@dataclass(frozen=True)
class DeleteResult:
    name: str
    outcome: DeleteOutcome
    conditional: bool  # the server itself enforced the version check (not just our pre-check)


@dataclass
class IoStats:
    """Counters for one store, safe to update from the pool's threads."""

    calls: int = 0
    retries: int = 0
    bytes_read: int = 0
    retry_reasons: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_call(self, nbytes: int = 0) -> None:
        with self._lock:
            self.calls += 1
            self.bytes_read += nbytes

    def count_retry(self, reason: str) -> None:
        with self._lock:
            self.retries += 1
            self.retry_reasons[reason] = self.retry_reasons.get(reason, 0) + 1


@runtime_checkable
class Store(Protocol):
    """The operations cachedoctor needs from a cache directory, local or in a bucket."""

    url: str
    is_local: bool
    stats: IoStats

    def list(self, sub: str = "") -> builtins.list[StoreItem]: ...

    def stat(self, name: str) -> StoreItem | None: ...

    def open_read(self, name: str) -> BinaryIO: ...

    def delete_if_unchanged(self, name: str, version: str | None) -> DeleteResult: ...

    def write_atomic(self, name: str, data: bytes, *, create: bool = False) -> None: ...

    def url_of(self, name: str) -> str: ...

    def map(self, fn: Callable[[T], Any], items: Sequence[T]) -> builtins.list[Any]: ...


def open_store(location: str | os.PathLike[str], *, workers: int = DEFAULT_WORKERS) -> Store:
    """A store for a directory or a bucket URL; raises MissingExtraError naming the extra."""
    if is_url(location):
        return RemoteStore(str(location), workers=workers)
    return LocalStore(os.fspath(location), workers=workers)


# --- the one retry policy --------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8  # including the first
    base_s: float = 0.2
    cap_s: float = 10.0

    def delay(self, retry: int) -> float:
        """Exponential backoff with jitter: the 1st retry waits ~base, each next one twice that."""
        ceiling = min(self.cap_s, self.base_s * (2.0**retry))
        return float(ceiling / 2 + random.uniform(0, ceiling / 2))


def _chain(exc: BaseException) -> builtins.list[BaseException]:
    out: builtins.list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out and len(out) < 10:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def transient_reason(exc: BaseException) -> str | None:
    """Why ``exc`` is worth retrying (e.g. "SlowDown", "http-429"), or None when it is not.

    Looks through the exception chain, most specific first: s3fs turns botocore's ClientError
    into an OSError(EBUSY) raised from the original; gcsfs raises HttpError with ``code``.
    """
    chain = _chain(exc)
    for current in chain:
        response = getattr(current, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            code = str((response.get("Error") or {}).get("Code") or "")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in _THROTTLE_CODES:
                return code
            if status in _TRANSIENT_STATUS:
                return f"http-{status}"
            return None  # a definite answer from the server that is not a throttle
    for current in chain:
        for attr in ("code", "status"):
            value = getattr(current, attr, None)
            if isinstance(value, int) and value in _TRANSIENT_STATUS:
                return f"http-{value}"
    for current in chain:
        if isinstance(current, OSError) and current.errno in (errno.EBUSY, errno.EAGAIN):
            return "busy"
        if isinstance(current, (ConnectionError, TimeoutError)):
            return type(current).__name__
        if type(current).__name__ in _TRANSIENT_TYPES:
            return type(current).__name__
        text = str(current)
        for marker in _THROTTLE_TEXT:
            if marker in text:
                return marker
    return None


# Whom to tell, with one line, when a store call first has to wait and retry (an unreachable
# endpoint should not be 20 s of silence). Nobody, unless a caller asks: the CLI passes its
# stderr writer for the duration of a command (``telling_waits``); the API and the hook (inside
# the user's JAX process) stay silent. A context variable, not a module attribute: it holds
# only inside that ``with`` block, and ``bounded_map`` carries it into its threads.
_wait_notice: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "cachedoctor_wait_notice", default=None
)
_waited = threading.Event()  # told once per process


@contextlib.contextmanager
def telling_waits(notice: Callable[[str], None]) -> Iterator[None]:
    """Within the block, the first store call that has to wait says so once through ``notice``."""
    token = _wait_notice.set(notice)
    try:
        yield
    finally:
        _wait_notice.reset(token)


def _say_waiting(what: str, reason: str, policy: RetryPolicy) -> None:
    notice = _wait_notice.get()
    if notice is None or _waited.is_set():
        return
    _waited.set()
    budget = sum(min(policy.cap_s, policy.base_s * 2.0**i) for i in range(policy.attempts - 1))
    notice(
        f"cachedoctor: waiting for {what} ({reason}); retrying with backoff, "
        f"at most {policy.attempts} attempts in about {budget:.0f} s"
    )


def call_with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    stats: IoStats | None = None,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn``; on a throttling or transient error back off and try again.

    The one place that retries store calls. Errors that are not transient propagate at once;
    a transient one that outlasts ``policy.attempts`` becomes a StoreError naming ``what``.
    """
    policy = policy or RetryPolicy()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            reason = transient_reason(exc)
            if reason is None:
                raise
            if attempt == policy.attempts - 1:
                raise StoreError(
                    f"{what}: still failing after {policy.attempts} attempts ({reason}): {exc}"
                ) from exc
            if stats is not None:
                stats.count_retry(reason)
            _say_waiting(what, reason, policy)
            sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


def bounded_map(fn: Callable[[T], Any], items: Sequence[T], workers: int) -> list[Any]:
    """``[fn(i) for i in items]`` on at most ``workers`` threads, results in input order."""
    if workers <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    results: list[Any] = [None] * len(items)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cachedoctor-io") as pool:
        futures = {  # each call in this context (``telling_waits``)
            pool.submit(contextvars.copy_context().run, fn, item): index
            for index, item in enumerate(items)
        }
        for future in as_completed(futures):
            results[futures[future]] = future.result()
    return results


# --- local directories -----------------------------------------------------------------------


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

    def list(self, sub: str = "") -> builtins.list[StoreItem]:
        """Names directly under the root, or under its folder ``sub`` (e.g. the manifests)."""
        items = []
        with os.scandir(self.url_of(sub) if sub else self.root) as it:
            for de in it:
                with contextlib.suppress(OSError):  # vanished: a concurrent JAX eviction
                    items.append(self._item(de.name, de.stat(follow_symlinks=False)))
        return sorted(items, key=lambda i: i.name)

    def stat(self, name: str) -> StoreItem | None:
        try:
            return self._item(name, os.lstat(self.url_of(name)))
        except FileNotFoundError:
            return None

    def open_read(self, name: str) -> BinaryIO:
        return open_regular(self.url_of(name))

    def delete_if_unchanged(self, name: str, version: str | None) -> DeleteResult:
        """Unlink ``name`` if its inode, size and mtime are still those of the plan.

        POSIX has no conditional unlink: the window is one lstat-to-unlink, and JAX never
        rewrites an entry in place (it writes a new file), so a changed file is caught here.
        """
        path = self.url_of(name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return DeleteResult(name, DeleteOutcome.GONE, conditional=False)
        if version is not None and local_version(st) != version:
            return DeleteResult(name, DeleteOutcome.CHANGED, conditional=False)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return DeleteResult(name, DeleteOutcome.GONE, conditional=False)
        return DeleteResult(name, DeleteOutcome.DELETED, conditional=False)

    def write_atomic(self, name: str, data: bytes, *, create: bool = False) -> None:
        """Temp file in the same directory, fsync, rename: readers see old or new, never half.

        ``name`` may name a file in a folder (``cachedoctor-manifests/<key>.json``). With
        ``create``, FileExistsError when it exists (a hard link publishes it, never replacing).
        """
        target = self.url_of(name)
        folder = os.path.dirname(target)
        try:
            os.makedirs(folder, exist_ok=True)
        except FileExistsError as exc:  # a file where the folder should be (not "exists")
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", folder) from exc
        with atomic_file(target, temp_prefix=".cachedoctor-tmp-", create=create) as fh:
            fh.write(data)
        with contextlib.suppress(OSError):
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def map(self, fn: Callable[[T], Any], items: Sequence[T]) -> builtins.list[Any]:
        return bounded_map(fn, items, self.workers)


# --- buckets ---------------------------------------------------------------------------------


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


def _make_filesystem(scheme: str) -> Any:
    """A private instance of the filesystem JAX would use, with the library's retries off.

    Our ``call_with_retry`` owns the retry policy: with the libraries retrying too, attempts
    would multiply (s3fs 5 times botocore 5 times ours) and no retry would be visible to us.
    """
    cls = _import_filesystem(scheme)
    if scheme == "s3":
        fs = cls(skip_instance_cache=True, config_kwargs={"retries": {"total_max_attempts": 1}})
        fs.retries = 1  # s3fs's own loop around botocore
        return fs
    request = getattr(cls, "_request", None)
    unwrapped = getattr(request, "__wrapped__", None)
    if unwrapped is not None:  # gcsfs wraps _request in retry_request(retries=6)
        cls = type("CachedoctorGCSFileSystem", (cls,), {"_request": unwrapped})
    return cls(skip_instance_cache=True)


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

    # reading and writing
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


@contextlib.contextmanager
def one_line_errors(url: str) -> Iterator[None]:
    """Library errors (no credentials, bad endpoint...) become a StoreError naming ``url``.

    OSError (no such bucket, access denied) and cachedoctor's own errors pass through: callers
    already turn those into one line.
    """
    try:
        yield
    except (OSError, CachedoctorError):
        raise
    except Exception as exc:
        raise StoreError(f"cannot read {url}: {type(exc).__name__}: {exc}") from exc
