"""Where a cache lives: a local directory, or a prefix in a GCS or S3 bucket.

JAX reaches a URL cache directory through ``etils.epath``, which hands ``gs://`` and ``s3://``
to fsspec's ``gcsfs`` and ``s3fs``. ``RemoteStore`` uses the same fsspec filesystems, configured
by the same environment (credentials, ``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``,
``FSSPEC_*``), so cachedoctor sees the bucket exactly as JAX does.

This module is the front: the ``Store`` protocol the rest of cachedoctor programs against,
``open_store`` (a folder or a bucket URL to its store) and ``one_line_errors``. The parts live
beside it: the values and errors in :mod:`.model`, the one retry policy in :mod:`.retry`,
the folder in :mod:`.local_store`, the bucket in :mod:`.remote_store` (each service's part in
:mod:`.backends`).

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
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, TypeVar, runtime_checkable

from cachedoctor.errors import CachedoctorError
from cachedoctor.storage import backends
from cachedoctor.storage.local_store import LocalStore
from cachedoctor.storage.model import DeleteResult, IoStats, StoreError, StoreItem
from cachedoctor.storage.remote_store import DEFAULT_WORKERS, RemoteStore
from cachedoctor.storage.urls import is_url

T = TypeVar("T")


@runtime_checkable
class Store(Protocol):
    """The operations cachedoctor needs from a cache directory, local or in a bucket."""

    url: str
    is_local: bool
    stats: IoStats

    def list(self, sub: str = "") -> builtins.list[StoreItem]: ...

    def stat(self, name: str) -> StoreItem | None: ...

    def fresh_version(self, name: str) -> str | None: ...

    def open_read(self, name: str) -> BinaryIO: ...

    def reading_as_listed(
        self, listed: Iterable[tuple[str, int, str | None]]
    ) -> contextlib.AbstractContextManager[None]: ...

    def delete_if_unchanged(self, name: str, version: str | None) -> DeleteResult: ...

    def write_atomic(
        self, name: str, data: bytes | os.PathLike[str], *, create: bool = False, mode: int = 0o600
    ) -> None: ...

    def url_of(self, name: str) -> str: ...

    def map(self, fn: Callable[[T], Any], items: Sequence[T]) -> builtins.list[Any]: ...


def open_store(location: str | os.PathLike[str], *, workers: int = DEFAULT_WORKERS) -> Store:
    """A store for a directory or a bucket URL; raises MissingExtraError naming the extra."""
    if is_url(location):
        return RemoteStore(str(location), workers=workers)
    return LocalStore(os.fspath(location), workers=workers)


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


# --- the same store, opened by a worker elsewhere (``--executor``) -----------------------------


@dataclass(frozen=True)
class StoreSpec:
    """What a worker in another process or on another host needs to open the same store: its URL,
    its request concurrency and this process's endpoint settings (each backend's
    ``endpoint_variables``: where the bucket is, as this process sees it; never a credential,
    each worker has its own, as each JAX process does)."""

    url: str
    workers: int
    endpoint: tuple[tuple[str, str], ...]


def spec_of(store: Store) -> StoreSpec:
    """A picklable description of ``store``, from which ``reopen`` makes the same store."""
    variables = backends.endpoint_variables()
    endpoint = tuple((k, os.environ[k]) for k in variables if k in os.environ)
    return StoreSpec(store.url, int(getattr(store, "workers", DEFAULT_WORKERS)), endpoint)


_FILESYSTEMS: dict[tuple[int, StoreSpec], Any] = {}  # by process: a forked child makes its own
_FILESYSTEMS_LOCK = threading.Lock()


def reopen(spec: StoreSpec) -> Store:
    """The store ``spec`` describes, with counters of its own; its connections are kept for the
    next call in this process (one filesystem per description).

    The endpoint settings of the process that made ``spec`` are set in this one first: a worker
    reads the bucket that the scan listed, not one its own environment might name.
    """
    if not is_url(spec.url):
        return LocalStore(spec.url, workers=spec.workers)
    with _FILESYSTEMS_LOCK:
        fs = _FILESYSTEMS.get((os.getpid(), spec))
        if fs is None:
            os.environ.update(dict(spec.endpoint))
            fs = RemoteStore(spec.url, workers=spec.workers).fs
            _FILESYSTEMS[os.getpid(), spec] = fs
    return RemoteStore(spec.url, workers=spec.workers, fs=fs)
