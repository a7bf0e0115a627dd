"""The entry files of JAX's cache dir as this process names it: whether one exists after a
write, and one's identity after a load JAX failed (the stats recorder's only I/O before exit).
"""

from __future__ import annotations

import os

from cachedoctor.storage.location import Location

ENTRY_SUFFIX = "-cache"  # JAX's LRUCache names an entry <key>-cache (0.4.38 .. 0.12)


def jax_cache_dir() -> str | None:
    """The cache dir JAX's config names in this process (None: no persistent cache)."""
    from jax._src import config

    value = config.compilation_cache_dir.value
    return str(value) if value else None


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
