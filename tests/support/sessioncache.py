"""Folders that JAX programs fill once per test session, shared by every xdist worker.

Each worker is its own pytest process, so a session fixture runs once per worker: two workers
used to write every JAX cache twice. Here the first worker that asks for a folder builds it
under a lock (``filelock``) in a folder of the whole session; the others wait for it and reuse
it. A build that died half-way (no ``<key>.complete`` beside it) is thrown away and built again. The
folder is built where it stays: JAX hashes the cache path into some keys, so a cache built
elsewhere and moved would be a relocated cache.

Each build is named by its key: the name the test gives and a digest of what it is made from
(the programs and their environment, the interpreter, the installed jax and jaxlib, and the
source of the programs it runs), so two different builds never share a folder, and a folder
kept across sessions (``CACHEDOCTOR_PREBUILT_CACHES``) is never reused once what it was made
from changes.

The shared folders must not change. ``record`` notes what each one holds when a worker first
uses it (``caches.snapshot``: every file's bytes, mode and mtime) and ``changed`` says which of
them a test changed since; conftest fails the session on one (a test must copy a session cache
before changing it: ``copy_of``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pickle
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import filelock
import pytest

from cachedoctor.programs import program_path
from tests.support.caches import SUPPORT_DIR, ProgramSpec, snapshot

T = TypeVar("T")

# shared_builds(name, make, *parts) -> (folder, what make(folder) returned): tests/conftest.py
SharedBuilds = Callable[..., tuple[Path, Any]]

COMPLETE = "complete"  # <key>.complete beside the folder: what the build returned, written last


def session_root(factory: pytest.TempPathFactory) -> Path:
    """The folder of this whole test session: each xdist worker's base temp folder is
    ``<session folder>/popen-gwN`` (``PYTEST_XDIST_WORKER`` is set there); without xdist the
    base temp folder is the session's own."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_key(name: str, *parts: object, sources: Iterable[Path] = ()) -> str:
    """``name`` and a digest of what the build is made from (see the module docstring)."""
    h = hashlib.sha256()
    versions: dict[str, str | None] = {}
    for dist in ("jax", "jaxlib"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    h.update(json.dumps([name, parts, sys.executable, versions], default=repr).encode())
    for path in sources:
        h.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return f"{name}-{h.hexdigest()[:8]}"


def program_sources(programs: Iterable[ProgramSpec]) -> list[Path]:
    """The files the programs of a ``make_cache`` spec run (bundled or the tests' own)."""
    names = sorted({name for name, _ in programs})
    return [SUPPORT_DIR / n if n.endswith(".py") else program_path(n) for n in names]


def build_once(root: Path, key: str, make: Callable[[Path], T]) -> tuple[Path, T]:
    """``(folder, value)``: ``make(folder)`` run once for ``key`` under ``root`` by whichever
    process asks first; ``value`` (what ``make`` returned) is pickled for the others."""
    root.mkdir(parents=True, exist_ok=True)
    folder, done = root / key, root / f"{key}.{COMPLETE}"
    with filelock.FileLock(str(root / f"{key}.lock")):
        if done.exists():
            value: T = pickle.loads(done.read_bytes())
            return folder, value
        shutil.rmtree(folder, ignore_errors=True)  # a build that died half-way
        folder.mkdir()
        value = make(folder)
        done.write_bytes(pickle.dumps(value))
        return folder, value


class Watch:
    """What each shared folder held when this process first used it."""

    def __init__(self) -> None:
        self._seen: dict[Path, dict[str, tuple[Any, ...]]] = {}

    def record(self, folder: Path) -> None:
        if folder not in self._seen:
            self._seen[folder] = snapshot(folder)

    def changed(self) -> list[str]:
        """Each shared folder that differs now, with the first paths that differ."""
        out = []
        for folder, before in self._seen.items():
            now = snapshot(folder) if folder.exists() else {}
            paths = sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))
            if paths:
                out.append(f"{folder}: {', '.join(paths[:5])}")
        return out


# --- a cache's times as JAX left them -----------------------------------------------------------
#
# Whether an entry was read since it was written is usage evidence (its access time, on a
# relatime mount): a test that copies a shared cache must see the times JAX left, not those of
# whatever read the shared copy since (another test, a plain copy). The builder records them
# before any test runs; copies get them back.

TIMES_SUFFIX = ".times.json"


def record_times(cache: Path) -> None:
    """Keep every file's (atime_ns, mtime_ns) beside ``cache`` (``<cache>.times.json``)."""
    times = {}
    for dirpath, _dirs, files in os.walk(cache):
        for name in files:
            path = Path(dirpath, name)
            st = path.lstat()
            times[str(path.relative_to(cache))] = [st.st_atime_ns, st.st_mtime_ns]
    cache.with_name(cache.name + TIMES_SUFFIX).write_text(json.dumps(times))


def copy_as_written(src: Path, dst: Path) -> None:
    """Copy a cache without moving the source's access times (``O_NOATIME`` reads), giving each
    copied file the times recorded when the cache was built (else the source's own)."""
    recorded_file = src.with_name(src.name + TIMES_SUFFIX)
    recorded = json.loads(recorded_file.read_text()) if recorded_file.exists() else {}
    shutil.copytree(src, dst, symlinks=True, copy_function=_copy_noatime)
    for rel, (atime_ns, mtime_ns) in recorded.items():
        target = dst / rel
        if target.exists() and not target.is_symlink():
            os.utime(target, ns=(atime_ns, mtime_ns))


def _copy_noatime(src: str, dst: str) -> None:
    st = os.lstat(src)
    flags = os.O_RDONLY | getattr(os, "O_NOATIME", 0)
    try:
        fd = os.open(src, flags)
    except PermissionError:
        fd = os.open(src, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    shutil.copymode(src, dst)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
