"""The ``check --verify`` run: read the cache, trust none of it, keep each fresh compile.

Active only in a process started with ``CACHEDOCTOR_VERIFY_FRESH=DIR`` (``cachedoctor check``
sets it for its verify run). It wraps the cache object JAX's ``compilation_cache._get_cache``
returns (its ``CacheInterface``: ``get``/``put`` by key, the same in jax 0.4.38 .. 0.12), so that

- ``get(key)`` notes the key and whether the cache holds it, and returns None: JAX compiles the
  module afresh, under the key it computed for the real cache directory (JAX hashes that path
  into the compile options, so a run against another, empty directory computes other keys);
- ``put(key, value)`` writes ``value`` (JAX's own entry bytes) to ``DIR/<key>-cache``, never
  to the cache.

The cache is only read. ``DIR/requested-<pid>.txt`` lists each key looked up and ``1`` when the
cache held it. Without ``_get_cache`` (a JAX this does not know) nothing is wrapped, nothing is
written to DIR, and ``check`` reports every module as not checked.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from cachedoctor.layout import CACHE_SUFFIX

VERIFY_FRESH_ENV = "CACHEDOCTOR_VERIFY_FRESH"
REQUESTED_PREFIX = "requested-"


class _FreshCache:
    """A JAX cache object that reads through to ``inner`` for the record only."""

    def __init__(self, inner: Any, fresh_dir: str) -> None:
        self._inner = inner
        self._dir = fresh_dir
        self._lock = threading.Lock()
        self._log = os.path.join(fresh_dir, f"{REQUESTED_PREFIX}{os.getpid()}.txt")

    def get(self, key: str) -> None:
        held = False
        with contextlib.suppress(Exception):
            held = self._inner.get(key) is not None
        with self._lock, contextlib.suppress(OSError), open(self._log, "a") as f:
            f.write(f"{key} {int(held)}\n")
        return None  # JAX compiles afresh

    def put(self, key: str, value: bytes) -> None:
        path = os.path.join(self._dir, f"{key}{CACHE_SUFFIX}")
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, path)

    def __getattr__(self, name: str) -> Any:  # anything else JAX asks of its cache
        return getattr(self._inner, name)


def install(fresh_dir: str) -> bool:
    """Wrap JAX's cache object for this process; False when this JAX has no ``_get_cache``."""
    from jax._src import compilation_cache

    original = getattr(compilation_cache, "_get_cache", None)
    if original is None or getattr(original, "__cachedoctor_verify__", False):
        return original is not None
    os.makedirs(fresh_dir, exist_ok=True)
    wrapped: dict[int, _FreshCache] = {}

    def _get_cache(*args: Any, **kwargs: Any) -> Any:
        cache = original(*args, **kwargs)
        if cache is None:
            return None
        fresh = wrapped.get(id(cache))
        if fresh is None:
            fresh = wrapped[id(cache)] = _FreshCache(cache, fresh_dir)
        return fresh

    _get_cache.__cachedoctor_verify__ = True  # type: ignore[attr-defined]
    compilation_cache._get_cache = _get_cache
    return True
