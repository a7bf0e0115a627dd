"""The cache folder a command works on, made once at the edge from what the user typed, and
where its entries are decoded (``--executor``: ``cache/executors.py``, handed on as it is).

The CLI's parameters and the Python API call these; below them every function is handed the
``Location`` (``storage/location.py``) and asks it what it can do. The CLI imports nothing of
``cache``, ``storage`` or ``xla`` (a contract in pyproject.toml): what it needs of them is here,
``Location``, ``telling_waits`` (whom the store layer tells when it waits for a bucket) and the
executor choice (``parse_executor``, ``open_executor``) as they are.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from cachedoctor.cache.listdir import CacheListing, list_cache
from cachedoctor.errors import NoCacheDirError, NotACacheError, path_error
from cachedoctor.stablekeys.settings import resolve_cache_dir
from cachedoctor.storage.location import Location
from cachedoctor.storage.retry import telling_waits

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from cachedoctor.cache.executors import ExecutorChoice as ExecutorChoice

__all__ = [
    "Location",
    "cache_location",
    "default_location",
    "open_cache_dir",
    "open_executor",
    "parse_executor",
    "telling_waits",
]


def cache_location(explicit: Location | str | os.PathLike[str] | None) -> Location:
    """The folder named, else ``$JAX_COMPILATION_CACHE_DIR``, else the one ``enable``
    configured; raises ``NoCacheDirError`` when there is none, ``bad-url`` for a scheme that is
    neither gs:// nor s3://."""
    if isinstance(explicit, Location):
        return explicit
    return Location.parse(resolve_cache_dir(None if explicit is None else os.fspath(explicit)))


def default_location(explicit: Location | str | None) -> Location | None:
    """Like :func:`cache_location`, for commands that also take a path: None when unset."""
    try:
        return cache_location(explicit)
    except NoCacheDirError:
        return None


def open_cache_dir(where: Location) -> CacheListing | None:
    """Check what the user named before a command works on it: a readable directory that is
    empty or holds a JAX cache. Raises the one-line error of each condition (``no-such-dir``,
    ``not-a-dir``, ``permission-denied``, ``symlink-loop``, ``io``, ``not-a-cache``).

    A bucket is not listed here (None): the store reports its own errors.
    """
    if not where.is_local:
        return None
    try:
        listing = list_cache(where.spelling)
    except OSError as exc:
        raise path_error(exc, where.spelling) from None
    if not listing.looks_like_cache:
        raise NotACacheError(where.spelling, len(listing.items))
    return listing


def parse_executor(text: str) -> ExecutorChoice:
    """``--executor``'s value (``cache/executors.parse_executor``), imported only when given:
    every command's start-up would otherwise load the pool and store code."""
    from cachedoctor.cache import executors

    return executors.parse_executor(text)


@contextlib.contextmanager
def open_executor(choice: ExecutorChoice) -> Iterator[Executor | None]:
    """The executor ``choice`` names, open for the command (``cache/executors.open_executor``)."""
    from cachedoctor.cache import executors

    with executors.open_executor(choice) as pool:
        yield pool
