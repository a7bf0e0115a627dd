"""Which cache directory a command works on, when the user does not name one."""

from __future__ import annotations

import os

from cachedoctor.errors import NoCacheDirError


def resolve_cache_dir(explicit: str | None) -> str:
    """The DIR argument, else ``$JAX_COMPILATION_CACHE_DIR``, else cachedoctor's configured dir."""
    if explicit:
        return explicit
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if env:
        return env
    configured = _configured_dir()
    if configured:
        return configured
    raise NoCacheDirError(
        "no cache directory given: pass DIR, set JAX_COMPILATION_CACHE_DIR, "
        "or configure one with `cachedoctor enable --dir DIR`"
    )


def default_cache_dir(explicit: str | None) -> str | None:
    """Like :func:`resolve_cache_dir`, for commands that also take a path: None when unset."""
    try:
        return resolve_cache_dir(explicit)
    except NoCacheDirError:
        return None


def _configured_dir() -> str | None:
    from cachedoctor.stablekeys.settings import configured_cache_dir

    return configured_cache_dir()
