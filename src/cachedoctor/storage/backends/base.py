"""What a bucket service must say for ``RemoteStore`` to reach it, and the one translation of
its errors.

A ``Backend`` holds everything that differs between services: its fsspec filesystem (imported
only when a store is opened), how a listing entry names its version, the conditional delete,
the environment that points it at an endpoint, and a table from its error codes to the few
answers the store acts on (``Failure``). Imports no bucket client: the registry, and through it
``urls``, loads at JAX start-up in the hook.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any, Protocol


class Failure(enum.Enum):
    """What a refused request means to the store; anything else is raised to the caller."""

    GONE = "gone"  # no such object
    CHANGED = "changed"  # a precondition (generation, ETag) failed: another write came first
    UNSUPPORTED = "unsupported"  # the server rejects the precondition itself: check, then plain


class Op(enum.Enum):
    """The requests whose refusals the store tells apart, each with its own table."""

    HEAD = "head"  # the version asked of the server (``fresh_version``)
    CREATE = "create"  # a create-only PUT (``write_atomic(create=True)``)
    DELETE = "delete"  # a conditional delete (``delete_if_unchanged``)


class Backend(Protocol):
    """One bucket service behind a URL scheme (``gs``, ``s3``), as the store needs it."""

    scheme: str  # the URL scheme: ``scheme://bucket/prefix``
    article: str  # "a" or "an", as the scheme is read aloud in messages ("an s3://…")
    package: str  # the fsspec implementation's distribution (``s3fs``), named when missing
    extra: str  # cachedoctor's extra that installs it (``pip install '.[extra]'``)
    endpoint_variables: tuple[str, ...]  # where the service is (never a credential)
    strip_listed_names: bool  # the library finds a name in a listing without its trailing /
    failures: Mapping[Op, Mapping[str, Failure]]  # an error code, per request, to its meaning

    def filesystem_class(self) -> Any:
        """The library's filesystem class, as JAX's etils.epath gets it; raises ImportError."""
        ...

    def adapt(self, cls: Any) -> Any:
        """``cls`` with the library's own retries off and its lookups of one object in a cached
        listing served by the filesystem's ``_cachedoctor_index`` (a ``ListingIndex``)."""
        ...

    def new_filesystem(self, cls: Any) -> Any:
        """A private instance of ``cls`` (no instance cache), its remaining retries at one."""
        ...

    def version_of(self, info: Mapping[str, Any]) -> str | None:
        """An entry's version (generation, ETag) from a listing or a metadata read."""
        ...

    def listed_fields(self, path: str, size: int, version: str) -> dict[str, Any]:
        """The fields, beyond name, size and type, the library reads of an object it listed."""
        ...

    def head_version(self, fs: Any, bucket: str, key: str) -> str | None:
        """The object's version asked of the server now (one request)."""
        ...

    def delete(self, fs: Any, bucket: str, key: str, version: str | None) -> None:
        """One delete request; with ``version``, conditional on it (the server refuses else)."""
        ...

    def error_code(self, exc: BaseException) -> str | None:
        """The service's code for one exception of a chain; "" when it answers without one
        (the walk stops), None when it says nothing (the walk goes on to its cause)."""
        ...


def _chain(exc: BaseException) -> Iterator[BaseException]:
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def failure_of(exc: BaseException, backend: Backend, op: Op) -> Failure | None:
    """What ``exc``, raised by ``op`` on ``backend``, means to the store; None: nothing it handles.

    The one translation of a service's errors: the first exception of the chain (cause, else
    context) that names a code decides, looked up in the backend's table for ``op``.
    """
    for current in _chain(exc):
        code = backend.error_code(current)
        if code is not None:
            return backend.failures[op].get(code) if code else None
    return None
