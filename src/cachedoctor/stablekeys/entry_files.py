"""The entry files of JAX's cache dir as this process names it: whether one exists after a
write, and one's identity after a load JAX failed (the stats recorder's only I/O before exit);
its place in a multi-process job (what the hook asks on every lookup: here, so that a single
process never imports the comparison of a job's processes); and whether buckets are reached
through JAX's own filesystem.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from cachedoctor.storage.location import Location

ENTRY_SUFFIX = "-cache"  # JAX's LRUCache names an entry <key>-cache (0.4.38 .. 0.12)
_SHARE_JAX_FILESYSTEM = False


def share_jax_filesystem() -> None:
    """In a JAX process (the hook, stats recording): reach buckets through the filesystem
    instance JAX itself uses (``etils.epath``'s fsspec one) rather than a client of our own,
    which costs ~100 ms of CPU to create. That instance keeps its library's own retries, so our
    retry loop makes one attempt: a bucket that keeps failing gives a miss, not a stall.
    (Here, not beside the manifests' stores: a warm start never imports those.)"""
    global _SHARE_JAX_FILESYSTEM
    _SHARE_JAX_FILESYSTEM = True


def shares_jax_filesystem() -> bool:
    """Whether :func:`share_jax_filesystem` was called in this process."""
    return _SHARE_JAX_FILESYSTEM


def jax_cache_dir() -> str | None:
    """The cache dir JAX's config names in this process (None: no persistent cache)."""
    from jax._src import config

    value = config.compilation_cache_dir.value
    return str(value) if value else None


def current_process() -> tuple[int, int] | None:
    """(JAX's process_id, num_processes) in a multi-process job; None in a single process."""
    try:
        distributed: Any = sys.modules.get("jax._src.distributed")  # asked on every lookup
        if distributed is None:
            distributed = importlib.import_module("jax._src.distributed")
        state = distributed.global_state
        count = int(getattr(state, "num_processes", 1) or 1)
        index = int(getattr(state, "process_id", 0) or 0)
    except Exception:
        return None
    return (index, count) if count > 1 else None


def entry_exists(key: str) -> bool:
    """Whether JAX's entry ``key`` exists: one ``stat`` in a local cache dir; on a bucket, True
    (JAX's put returned: no request per compile)."""
    where = Location.of_setting(jax_cache_dir())
    folder = None if where is None else where.local_path
    if folder is None:
        return True
    return os.path.exists(os.path.join(folder, key + ENTRY_SUFFIX))


def file_identity(key: str) -> dict[str, int] | None:
    """The entry file's size, modification time and inode (one ``stat``); None on a bucket or
    when it cannot be stat'ed."""
    where = Location.of_setting(jax_cache_dir())
    folder = None if where is None else where.local_path
    if folder is None:
        return None
    try:
        st = os.stat(os.path.join(folder, key + ENTRY_SUFFIX))
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
