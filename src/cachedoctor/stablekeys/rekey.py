"""Re-keying one local entry: the same bytes under a second key, published atomically.

The hook uses it when a cache warmed without it holds the entry under JAX's own key: the entry
becomes available under the stable key too, and processes without the hook keep theirs.
"""

from __future__ import annotations

import os
from pathlib import Path

from cachedoctor.storage.files import replace_with_link


def rekey_entry(cache_dir: str | os.PathLike[str], old_key: str, new_key: str) -> bool:
    """Make the entry ``old_key`` also available as ``new_key``, atomically; keeps the old one.

    Hard-links (or copies) ``<old>-cache`` and its ``-atime`` file, if any, to temp names that
    JAX ignores, then renames them into place. Returns False when ``old_key`` has no entry.
    """
    return _rekey_entry(Path(cache_dir), old_key, new_key)


def _rekey_entry(cache_dir: Path, old_key: str, new_key: str) -> bool:
    src = cache_dir / f"{old_key}-cache"
    if not src.exists():
        return False
    for suffix in ("-atime", "-cache"):  # the -cache file last: its presence means "complete"
        s = cache_dir / f"{old_key}{suffix}"
        if not s.exists():
            continue
        try:
            replace_with_link(
                s, cache_dir / f"{new_key}{suffix}", temp_prefix=".cachedoctor-rekey-"
            )
        except OSError:
            if suffix == "-cache":
                return False
    return True
