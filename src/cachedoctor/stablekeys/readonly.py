"""Read-only use of a shared cache: lookups hit as before, nothing is written to the cache.

PR builds that read the cache of main, serving hosts that boot from a baked-in cache, many
jobs on one bucket: ccache's ``read_only``, sccache's ``READ_ONLY`` mode. JAX has none; every
process 0 writes. What a JAX process writes into its cache dir, and what read-only does:

- **entries** (``<key>-cache``): JAX's cache object (``LRUCache``, the only one JAX builds,
  0.4.38 .. 0.12) is wrapped where JAX makes it (``compilation_cache.get_file_cache``); its
  ``put`` stores nothing. JAX still compiles a miss and runs it.
- **``-atime`` files and ``.lockfile``** (JAX's LRU, with ``jax_compilation_cache_max_size``
  set; jax 0.4.38 writes ``-atime`` on every hit even without it): JAX's ``get`` takes the lock
  and writes the access time. The wrapped
  ``get`` reads ``<key>-cache`` directly, as JAX's own ``get`` does without a size limit (no
  lock: a write racing the read can tear it; JAX then warns "Error reading persistent
  compilation cache entry" and compiles, as it does without the limit).
- **a missing cache dir** is not made (``LRUCache`` would ``mkdir`` it): JAX runs uncached.
- **cachedoctor's own files**: no key manifest, replay manifest or re-keyed entry
  (``hook.install(manifests=False, migrate=False)``); the stats record goes to the records
  folder the user names (``records_dir``), else to a folder of this user's for that cache
  alone (:func:`default_records_home`), never into the shared cache.
- **XLA's sub-caches** (``jax_persistent_cache_enable_xla_caches``): the autotune sub-cache
  gets the READ mode in every process (``subcache_roles``; JAX clears the mode before hashing,
  so no key changes). XLA's kernel cache file has no read mode: XLA may still write it, which
  :func:`subcache_warnings` says once (turning it off would change the keys on jax 0.12).

Checked, not assumed: JAX must make its cache through ``get_file_cache``; if it does not, the
persistent cache is turned off in this process (nothing read, nothing written) with one line
on stderr: the promise not to write is kept, at the cost of the hits.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
from typing import Any

ENTRY_SUFFIX = "-cache"  # JAX's LRUCache names an entry <key>-cache (0.4.38 .. 0.12)
MARKER = "__cachedoctor_read_only_original__"

_lock = threading.Lock()
_active = False
_records_dir: str | None = None  # where this process's stats record goes (records_home)
_skipped: list[str] = []  # keys JAX would have stored, in order (kept for the record)
_MAX_SKIPPED = 1000


class ReadOnlyCache:
    """JAX's cache object, reading only: ``get`` without the LRU's lock and access time,
    ``put`` a no-op that remembers the key."""

    def __init__(self, base: Any) -> None:
        self._base = base

    def get(self, key: str) -> bytes | None:
        path = getattr(self._base, "path", None)
        if path is None or not hasattr(path, "exists"):  # not JAX's LRUCache: its own get
            return self._base.get(key)  # type: ignore[no-any-return]
        # read as JAX's get reads, without what it writes: the lock and -atime under its LRU,
        # and on jax < 0.5.1 -atime on every hit, limit or not
        entry = path / f"{key}{ENTRY_SUFFIX}"
        if not entry.exists():
            return None
        return entry.read_bytes()  # type: ignore[no-any-return]

    def put(self, key: str, value: bytes) -> None:
        with _lock:
            if len(_skipped) < _MAX_SKIPPED:
                _skipped.append(key)

    def clear(self) -> None:
        """JAX's ``reset_cache`` clears nothing on disk; a read-only cache clears nothing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def active() -> bool:
    """Whether this process uses its cache read-only."""
    return _active


def skipped() -> list[str]:
    """The keys JAX would have stored in this process (at most ``_MAX_SKIPPED``)."""
    with _lock:
        return list(_skipped)


def records_home(cache_dir: str | None = None) -> str:
    """The folder whose ``cachedoctor-stats/`` gets a read-only process's stats record: the
    user's ``records_dir``, else a folder of this user's for ``cache_dir`` alone (never the
    shared cache; :func:`default_records_home`), which ``cachedoctor stats`` reads like a
    cache's."""
    if _records_dir:
        return _records_dir
    return default_records_home(cache_dir)


def default_records_root() -> str:
    """This user's folder of read-only records: a folder in it per cache
    (:func:`default_records_home`). Records written before each cache had one are in its own
    ``cachedoctor-stats/``, every cache's mixed (each record names its cache); they are read
    there, never moved."""
    import platformdirs

    return str(platformdirs.user_cache_path("cachedoctor") / "read-only-records")


def cache_identity(cache_dir: str) -> str:
    """How a record names the cache it was of: a bucket by its URL as cachedoctor spells it, a
    folder by its real path (JAX takes a relative one from the working directory)."""
    from cachedoctor.storage.location import Location

    where = Location.of_setting(cache_dir)
    if where is None:
        return str(cache_dir)
    folder = where.local_path
    return where.spelling if folder is None else os.path.realpath(folder)


def default_records_home(cache_dir: str | None) -> str:
    """The default records folder of one cache: ``<user cache>/cachedoctor/read-only-records/
    <name>-<digest>`` (the cache's last name, and the digest of its :func:`cache_identity`), so
    that two caches' records never mix."""
    root = default_records_root()
    if not cache_dir:
        return root
    ident = cache_identity(cache_dir)
    name = os.path.basename(ident.rstrip("/" + os.sep)) or "cache"
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40].lstrip(".")
    digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(root, f"{name or 'cache'}-{digest}")


def install(records_dir: str | None = None) -> bool:
    """Make JAX's persistent cache read-only in this process; idempotent. ``records_dir``:
    where the stats record goes (:func:`records_home`).

    False when this JAX does not make its cache through ``get_file_cache``: its persistent
    cache is then turned off here (one line on stderr), never left writing.
    """
    global _active, _records_dir
    _records_dir = records_dir
    try:
        from jax._src import compilation_cache as cc

        original = cc.get_file_cache
        initialize = getattr(cc, "_initialize_cache", None)
        code = getattr(initialize, "__code__", None)
        if code is None or "get_file_cache" not in code.co_names:
            raise RuntimeError("compilation_cache._initialize_cache does not call get_file_cache")
    except Exception as exc:
        _turn_cache_off(f"{type(exc).__name__}: {exc}")
        return False
    with _lock:
        if getattr(original, MARKER, None) is None:

            def get_file_cache(path: str, *args: Any, **kwargs: Any) -> Any:
                from cachedoctor.storage.location import Location

                spelled = Location.of_setting(str(path))
                folder = None if spelled is None else spelled.local_path
                if folder is not None and not os.path.isdir(folder):
                    return None  # JAX runs uncached rather than make the folder
                made = original(path, *args, **kwargs)
                if made is None:
                    return None
                cache, where = made
                return ReadOnlyCache(cache), where

            setattr(get_file_cache, MARKER, original)
            get_file_cache.__wrapped__ = original  # type: ignore[attr-defined]
            cc.get_file_cache = get_file_cache
        current = getattr(cc, "_cache", None)
        if current is not None and not isinstance(current, ReadOnlyCache):
            cc._cache = ReadOnlyCache(current)  # type: ignore[assignment]  # made before activation
        _active = True
    return True


def _turn_cache_off(why: str) -> None:
    with contextlib.suppress(Exception):
        import jax

        jax.config.update("jax_enable_compilation_cache", False)  # type: ignore[no-untyped-call]
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"cachedoctor: cannot make JAX's cache read-only on this JAX ({why}): the persistent"
            " cache is off in this process (nothing read, nothing written)\n"
        )


def subcache_warnings(xla_caches: str | None) -> list[str]:
    """What read-only cannot keep from being written, given ``jax_persistent_cache_enable_xla_
    caches``: XLA's kernel cache file, which has no read mode."""
    if xla_caches in ("all", "xla_gpu_kernel_cache_file"):
        return [
            "XLA's kernel cache file (jax_persistent_cache_enable_xla_caches="
            f"{xla_caches}) has no read mode: XLA may still write it on a GPU; set xla_caches"
            " to autotune or none for a cache that stays byte for byte as it was"
        ]
    return []
