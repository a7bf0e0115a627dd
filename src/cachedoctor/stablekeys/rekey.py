"""Re-keying one local entry: the same bytes under a second key, published atomically.

The hook uses it when a cache warmed without it holds the entry under JAX's own key: the entry
becomes available under the stable key too, and processes without the hook keep theirs.
"""

from __future__ import annotations

import os
from pathlib import Path

from cachedoctor.layout import ATIME_SUFFIX, CACHE_SUFFIX
from cachedoctor.storage.fsops import CacheDir


def rekey_entry(cache_dir: str | os.PathLike[str], old_key: str, new_key: str) -> bool:
    """Make the entry ``old_key`` also available as ``new_key``, atomically; keeps the old one.

    Hard-links (or copies) ``<old>-cache`` and its ``-atime`` file, if any, to temp names that
    JAX ignores, then renames them into place. Returns False when ``old_key`` has no entry.
    """
    return _rekey_entry(Path(cache_dir), old_key, new_key)


def _rekey_entry(cache_dir: Path, old_key: str, new_key: str) -> bool:
    """The files are looked up and linked relative to the cache folder, never through a link
    (``CacheDir``): an entry name that is a symbolic link is not re-keyed."""
    try:
        with CacheDir.open(cache_dir) as cd:
            if cd.regular(f"{old_key}{CACHE_SUFFIX}") is None:
                return False
            # the -cache file last: its presence means "complete"
            for suffix in (ATIME_SUFFIX, CACHE_SUFFIX):
                if cd.regular(f"{old_key}{suffix}") is None:
                    continue
                try:
                    cd.link_replacing(f"{old_key}{suffix}", f"{new_key}{suffix}")
                except OSError:
                    if suffix == CACHE_SUFFIX:
                        return False
    except OSError:
        return False
    return True
