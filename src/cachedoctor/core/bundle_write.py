"""``unpack --apply``'s writes: each staged file copied into the target whole, a chunk at a
time, never over another file, and after the first write nothing raises.

Kept apart from ``bundle.py`` because it is the one part of unpack that changes the target:
every file it writes goes through the store (a temp file linked into place; on a bucket a
create-only upload in parts, aborted on failure), streamed from the staged copy so that no
member is ever held whole in memory. Once one file is written, a failure (a full disk, a
permission, a bucket that refuses) is said of that file and the rest are still tried: the
caller reports exactly what is there. An entry's ``-atime`` file, written before it where JAX's
LRU runs, is taken back when the entry then fails: nothing is left under a JAX key name
without its entry, and a key manifest is written only beside an entry this unpack wrote.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachedoctor import layout
from cachedoctor.errors import os_reason


@dataclass
class Written:
    """What the writes did: per entry key its action (``written``, ``present``: another
    process wrote it meanwhile, ``failed: <why>``), the names of the companion files written,
    and each file that could not be written (or taken back) with why."""

    actions: dict[str, str] = field(default_factory=dict)
    manifests: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    atime_files: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def lru_in_use(store: Any) -> bool:
    """Whether JAX's LRU eviction runs on the target: its ``.lockfile``, or ``-atime`` files
    (JAX writes them only with eviction on). A target not there yet (a new bucket prefix)
    runs none."""
    try:
        if store.stat(layout.LOCKFILE) is not None:
            return True
        return any(i.name.endswith(layout.ATIME_SUFFIX) for i in store.list())
    except FileNotFoundError:
        return False


def write_members(
    stage: Path, header: dict[str, Any], store: Any, keys: Sequence[str], *, lru: bool
) -> Written:
    """The entries ``keys`` of the staged bundle, each whole and none over an existing file,
    then the key manifests of those written, then the bundle's stats records. Into a cache
    where JAX's LRU eviction runs (``lru``), each entry's ``-atime`` file is written first (JAX's
    eviction pass fails on an entry without one, jax <= 0.10, and then every later put fails).
    Never raises: what failed is in the result."""
    mode = 0o666 & ~_umask()
    done = Written()
    manifests: dict[str, list[str]] = {}  # key -> its manifest and module text
    for f in header["files"]:
        base = f["name"].removeprefix(layout.MANIFEST_DIRNAME + "/")
        for suffix in (layout.MANIFEST_SUFFIX, layout.MANIFEST_IR_SUFFIX):
            if base != f["name"] and base.endswith(suffix):
                manifests.setdefault(base[: -len(suffix)], []).append(f["name"])
    for key in keys:
        done.actions[key] = _write_entry(stage, store, key, lru, mode, done)
        if done.actions[key] == "written":
            for name in manifests.get(key, ()):
                _write_companion(stage, store, name, mode, done, done.manifests)
    for f in header["files"]:
        if f["name"].startswith(layout.STATS_DIRNAME + "/"):
            _write_companion(stage, store, f["name"], mode, done, done.records)
    return done


def _write_entry(stage: Path, store: Any, key: str, lru: bool, mode: int, done: Written) -> str:
    """One entry (its -atime file first where JAX's LRU runs): what became of it."""
    atime = f"{key}{layout.ATIME_SUFFIX}"
    ours = None  # the version of the -atime file this call wrote
    try:
        if lru and store.stat(atime) is None:
            # as JAX's LRU writes it on a put: the time of use, ns, 8 bytes little-endian
            stamp = time.time_ns().to_bytes(8, "little")
            if _create(store, atime, stamp, mode):
                item = store.stat(atime)
                ours = item.version if item is not None else None
                done.atime_files.append(atime)
        entry = f"{key}{layout.CACHE_SUFFIX}"
        store.write_atomic(entry, stage / entry, create=True, mode=mode)
        return "written"
    except FileExistsError:
        return "present"  # another process wrote it meanwhile (its -atime file stays with it)
    except Exception as exc:  # after the first write nothing raises: said, and the rest tried
        if atime in done.atime_files:
            _take_back(store, atime, ours, done)
        return f"failed: {_reason(exc)}"


def _take_back(store: Any, atime: str, version: str | None, done: Written) -> None:
    """Remove the -atime file written for an entry that then failed, if it is still ours."""
    try:
        store.delete_if_unchanged(atime, version)
        done.atime_files.remove(atime)
    except Exception as exc:
        done.failed.append((atime, f"left without its entry: {_reason(exc)}"))


def _write_companion(
    stage: Path, store: Any, name: str, mode: int, done: Written, written: list[str]
) -> None:
    """A staged manifest or record written where none is (kept in ``written``)."""
    try:
        if _create(store, name, stage / name, mode):
            written.append(name)
    except Exception as exc:
        done.failed.append((name, _reason(exc)))


def _create(store: Any, name: str, data: bytes | Path, mode: int) -> bool:
    """``name`` created whole: True, or False where a file stands (never replaced)."""
    try:
        store.write_atomic(name, data, create=True, mode=mode)
    except FileExistsError:
        return False
    return True


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return str(os_reason(exc))
    return str(exc) or type(exc).__name__


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
