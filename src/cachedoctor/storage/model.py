"""The plain values a store hands back, its I/O counters and its errors.

What every store (local folder or bucket) answers in: an item under the cache prefix, the outcome
of a conditional delete, the per-store call and retry counters. Kept apart from
:mod:`.stores` so that the retry policy and both store implementations can use them while
``stores`` (the protocol and ``open_store``) imports those implementations, without a cycle;
it imports no thread pool and no bucket client.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field

from cachedoctor.errors import CachedoctorError


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

    def counts(self) -> tuple[int, int, int, dict[str, int]]:
        """The counters as plain data (a worker elsewhere sends them back with its results)."""
        with self._lock:
            return self.calls, self.retries, self.bytes_read, dict(self.retry_reasons)

    def merge(self, counts: tuple[int, int, int, dict[str, int]]) -> None:
        """Add another store's ``counts()`` (the same bucket, read by a worker) to these."""
        calls, retries, nbytes, reasons = counts
        with self._lock:
            self.calls += calls
            self.retries += retries
            self.bytes_read += nbytes
            for reason, n in reasons.items():
                self.retry_reasons[reason] = self.retry_reasons.get(reason, 0) + n
