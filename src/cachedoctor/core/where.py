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
import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from cachedoctor.cache.listdir import CacheListing, DirItem, list_cache
from cachedoctor.errors import NoCacheDirError, NotACacheError, path_error
from cachedoctor.layout import (
    ATIME_SUFFIX,
    CACHE_SUFFIX,
    MANIFEST_DIRNAME,
    MANIFEST_SUFFIX,
    OWN_LOCKFILE,
    STATS_DIRNAME,
)
from cachedoctor.stablekeys.settings import resolve_cache_dir
from cachedoctor.storage.location import Location
from cachedoctor.storage.retry import telling_waits

# 2018-01-01 in nanoseconds: before JAX's persistent cache, so no -atime JAX wrote holds less
EARLIEST_ATIME_NS = 1_514_764_800 * 10**9

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
    "proof_of_cache",
    "telling_waits",
]


def cache_location(explicit: Location | str | os.PathLike[str] | None) -> Location:
    """The folder named, else ``$JAX_COMPILATION_CACHE_DIR``, else the one ``enable``
    configured; raises ``NoCacheDirError`` when there is none, ``bad-url`` for a scheme that is
    neither gs:// nor s3://."""
    if isinstance(explicit, Location):
        return explicit
    return Location.parse(resolve_cache_dir(None if explicit is None else os.fspath(explicit)))


def job_spelling(where: Location, spelled_as: str | None) -> str:
    """How a job here will spell ``where`` to JAX (the sub-cache paths under it are hashed into
    its compile options): ``spelled_as`` when given, else the cache dir this environment
    configures (``$JAX_COMPILATION_CACHE_DIR``, ``enable``'s) when it is that same folder, else
    ``where`` as given, made absolute for a folder."""
    if spelled_as:
        return spelled_as
    folder = where.local_path
    if folder is None:
        return where.spelling
    with contextlib.suppress(Exception):  # no configured dir, a broken config: not this one
        configured = resolve_cache_dir(None)
        if os.path.samefile(configured, folder):
            return configured
    return os.path.abspath(folder)


def default_location(explicit: Location | str | None) -> Location | None:
    """Like :func:`cache_location`, for commands that also take a path: None when unset."""
    try:
        return cache_location(explicit)
    except NoCacheDirError:
        return None


def open_cache_dir(where: Location, *, changes: str | None = None) -> CacheListing | None:
    """Check what the user named before a command works on it: a readable directory that is
    empty or holds a JAX cache. Raises the one-line error of each condition (``no-such-dir``,
    ``not-a-dir``, ``permission-denied``, ``symlink-loop``, ``io``, ``not-a-cache``).

    ``changes``: the command (``prune --apply``...) removes or moves files, so a name is not
    evidence enough; the folder must hold what no stray file fakes (:func:`proof_of_cache`).

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
    if changes is not None and _holds_files(listing) and proof_of_cache(listing) is None:
        raise NotACacheError(where.spelling, len(listing.items), unproven=changes)
    return listing


def _holds_files(listing: CacheListing) -> bool:
    """Whether the folder holds anything a command could change: lock files and empty folders
    of cachedoctor's own are what a finished prune leaves of a cache, with nothing to prove."""
    from cachedoctor.cache.listdir import FileKind

    for item in listing.items:
        if item.is_symlink or item.kind not in (FileKind.LOCKFILE, FileKind.CACHEDOCTOR):
            return True
        if item.is_dir:
            with contextlib.suppress(OSError):
                if not os.listdir(listing.path(item)):
                    continue
            return True
        if item.kind is FileKind.CACHEDOCTOR and item.name != OWN_LOCKFILE:
            return True
    return False


PROOF_DECODES = 8  # entries tried, smallest first, before the folder is judged on the rest


def proof_of_cache(listing: CacheListing) -> str | None:
    """What shows that a local folder is a JAX cache (or cachedoctor's records beside one),
    by content rather than by name, or None. A file named like an entry may be anybody's; the
    evidence is what JAX or cachedoctor wrote, each read without following a link:

    - an entry that decodes as a JAX cache entry (``cache/reader``, first tier);
    - an entry with its ``-atime`` file of 8 bytes, the pair JAX's LRU writes together;
    - an ``-atime`` file alone whose 8 bytes are a time JAX could have written (2018 to a day from
      now): what JAX's LRU leaves when an entry's removal was cut short;
    - a stats record the hook wrote (its ``format``) or a manifest that parses.
    """
    from cachedoctor.cache.listdir import FileKind
    from cachedoctor.cache.model import EntryInfo
    from cachedoctor.cache.reader import decode_entry

    regular = {i.name: i for i in listing.items if not i.is_symlink and not i.is_dir}
    entries = sorted(
        (i for i in regular.values() if i.kind is FileKind.ENTRY), key=lambda i: i.size
    )
    for item in entries:
        atime = regular.get(f"{item.key}{ATIME_SUFFIX}")
        if atime is not None and atime.size == 8 and item.name.endswith(CACHE_SUFFIX):
            return f"{item.name} and its -atime file"
    for item in entries[:PROOF_DECODES]:
        info = decode_entry(listing.path(item), defer_hlo=True)
        if isinstance(info, EntryInfo) and not info.problems:
            return f"{item.name} decodes as a JAX cache entry"
    return _orphan_atime(listing, regular.values()) or _own_records(listing.root)


def _orphan_atime(listing: CacheListing, items: Iterable[DirItem]) -> str | None:
    """An ``-atime`` file whose content is a time in nanoseconds JAX could have written."""
    from cachedoctor.cache.listdir import FileKind, read_atime

    latest = time.time_ns() + 86_400 * 10**9
    for item in items:
        if item.kind is FileKind.ATIME and item.size == 8:
            value = read_atime(listing.path(item))
            if value is not None and EARLIEST_ATIME_NS <= value <= latest:
                return f"{item.name}, a time JAX's LRU wrote"
    return None


def _own_records(root: str) -> str | None:
    """A stats record or a manifest in ``root`` that parses as cachedoctor's, or None."""
    from cachedoctor.stablekeys.manifest import iter_manifests
    from cachedoctor.stablekeys.stats import RECORD_FORMAT, RECORD_SUFFIX
    from cachedoctor.storage.fsops import CacheDir

    with contextlib.suppress(StopIteration):
        found = next(iter(iter_manifests(Location.local(root))))
        return f"{MANIFEST_DIRNAME}/{found.key}{MANIFEST_SUFFIX}"
    try:
        with CacheDir.open(root) as top, top.walk(STATS_DIRNAME) as folder:
            for name in folder.listdir():
                if not name.endswith(RECORD_SUFFIX):
                    continue
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    if json.loads(folder.read_small(name) or b"").get("format") == RECORD_FORMAT:
                        return f"{STATS_DIRNAME}/{name}"
    except OSError:
        pass
    return None


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
