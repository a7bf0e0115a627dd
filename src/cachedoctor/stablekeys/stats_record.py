"""A process's stats record: what it holds (:func:`snapshot`), where it goes, and writing it at
exit (``stats.py`` counts what goes in).

The record goes into ``cachedoctor-stats/`` of the cache dir, or, when the cache is used
read-only (``readonly.py``), of the records folder the user chose: never into a read-only cache.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.stablekeys import readonly, stats
from cachedoctor.stablekeys.entry_files import jax_cache_dir
from cachedoctor.stablekeys.stats import RECORD_SUFFIX, warn_once
from cachedoctor.storage.fsops import CacheDir
from cachedoctor.storage.location import Location


def recording() -> dict[str, str | None] | None:
    """In which mode this process records, and where its record will go (for ``status``).

    None when it does not record (the hook is off, or JAX lacks the listener API).
    """
    mode = stats.recording_mode()
    if mode is None:
        return None
    try:
        cache_dir = _records_home()
    except Exception:
        cache_dir = None
    where = f"{cache_dir.rstrip('/')}/{STATS_DIRNAME}/" if cache_dir else None
    return {"mode": mode, "records": where}


def _records_home() -> str | None:
    """The folder whose ``cachedoctor-stats/`` gets this process's record: the cache dir, or
    when the cache is read-only the records folder the user chose (``readonly.records_home``)."""
    if readonly.active():
        return readonly.records_home(jax_cache_dir())
    return jax_cache_dir()


def record_name(record: dict[str, Any]) -> str:
    """A file name no other process picks: host, pid, start time and a random tag."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(record["host"]))[:64]
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(float(record["start"])))
    return f"{stamp}-{host}-{record['pid']}-{uuid.uuid4().hex[:8]}{RECORD_SUFFIX}"


def _write_local(cache_dir: str, name: str, data: bytes) -> str:
    """Write the record ``cachedoctor-stats/<name>`` as a new file, relative to the folder opened
    without following a link (``CacheDir``): a link planted at ``cachedoctor-stats/`` is
    refused (OSError ELOOP), never written through."""
    folder_name, _, base = name.rpartition("/")
    with contextlib.suppress(FileExistsError):  # made by JAX, usually; a file there: ENOTDIR
        os.makedirs(cache_dir, exist_ok=True)
    with CacheDir.open(cache_dir) as root, root.walk(folder_name, create=True) as folder:
        # no fsync: JAX writes its own entries without one, and each process's exit would wait
        # on the disk (an NFS cache: milliseconds); a record a power cut leaves empty is read
        # as a damaged record, a finding
        if not folder.write_new(base, data, mode=0o600, durable=False):
            raise FileExistsError(errno.EEXIST, "File exists", os.path.join(cache_dir, name))
    return os.path.join(cache_dir, name)


def write_at_exit() -> None:
    """Write this process's record as the program ends (:func:`write_record`), while thread
    pools still take work when it goes to a bucket (:func:`keep_ahead_of_the_pools`)."""
    _at_exit(write_record)
    keep_ahead_of_the_pools()  # the cache dir as the environment and the config file set it


_asked = [False]  # whether the pools' exit hook is known to run after the writer


def keep_ahead_of_the_pools() -> None:
    """A record bound for a bucket is written through thread pools (aiobotocore opens its
    connection through ``asyncio.to_thread``), which Python shuts down as the program ends:
    "cannot schedule new futures after shutdown", and no record ever reached S3. Exit hooks
    (``threading._register_atexit``, which ``concurrent.futures`` uses itself) run in the
    reverse order of registration, so the writer is registered again after the pools' own
    hook (made when ``concurrent.futures.thread`` is first imported): it runs first, and
    writes once. Asked at start-up and at the first compile that asks the cache (JAX opens
    its cache then, after a program's own ``jax.config.update`` of the cache dir), so a local
    cache's process never imports the pools."""
    if _asked[0]:
        return
    try:
        home = _records_home()
    except Exception:
        return
    where = Location.of_setting(home)
    if where is None or where.url is None:
        return
    _asked[0] = True
    import concurrent.futures.thread  # noqa: F401 - registers the pools' exit hook (once)

    _at_exit(write_record)


def _at_exit(fn: Callable[[], object]) -> None:
    """Run ``fn`` as the program ends, with Python's hook that runs before the thread pools stop
    when registered after theirs (:func:`keep_ahead_of_the_pools`); else plain ``atexit``."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(fn)
    except RuntimeError:
        atexit.register(fn)


def write_record() -> str | None:
    """At exit: write this process's record into the cache dir; never raises.

    Nothing is written when no compile asked the cache (a process that merely imported JAX).
    """
    try:
        record = snapshot()
        where = Location.of_setting(_records_home())
        if record is None or where is None or stats.record_written() is not None:
            return None
        if not any(c["requests"] for c in record["modules"].values()):
            return None
        name = f"{STATS_DIRNAME}/{record_name(record)}"
        data = json.dumps(record, sort_keys=True).encode()
        folder = where.local_path
        if folder is None:  # a bucket
            from cachedoctor.stablekeys.entry_files import share_jax_filesystem
            from cachedoctor.stablekeys.manifest import store_for

            share_jax_filesystem()
            store = store_for(where)  # JAX's own filesystem (the hook's store): no client
            store.write_atomic(name, data)
            written = store.url_of(name)
        else:  # no store: importing one at exit would register exit handlers after shutdown
            written = _write_local(folder, name, data)
        stats.mark_record_written(written)
        return written
    except Exception as exc:
        warn_once(f"could not write the stats record ({type(exc).__name__}: {exc})")
        return None


def snapshot() -> dict[str, Any] | None:
    """This process's record so far (None when not recording): the recorder's counts (``stats``)
    and what the process was."""
    counts = stats.recorded()
    if counts is None:
        return None
    import jax

    load_failures = counts["load_failures"]
    return {
        "format": stats.RECORD_FORMAT,
        "missed": counts["missed"],
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start": counts["start"],
        "end": counts["end"],
        "jax": str(getattr(jax, "__version__", "")),
        "hook": counts["mode"],
        "config": counts["config"],
        "modules": counts["modules"],
        **({"load_failures": load_failures} if load_failures else {}),
        **({"read_only": True, "cache_dir": _cache_named()} if readonly.active() else {}),
    }


def _cache_named() -> str | None:
    """The cache a read-only record is of, as ``readonly.cache_identity`` names it."""
    folder = jax_cache_dir()
    return None if folder is None else readonly.cache_identity(folder)
