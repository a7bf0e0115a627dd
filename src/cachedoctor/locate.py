"""Turn what a user types (a key, a unique key prefix, or a path) into one entry file."""

from __future__ import annotations

import os
from pathlib import Path

from cachedoctor import reader
from cachedoctor.errors import CachedoctorError, EntryNotFoundError


def locate_entry(ref: str, cache_dir: str | None) -> Path:
    """Resolve ``ref`` to an entry path; raises EntryNotFoundError with the candidates."""
    as_path = Path(ref)
    looks_like_path = os.sep in ref or (ref.endswith(reader.CACHE_SUFFIX) and as_path.exists())
    if looks_like_path or as_path.is_file():
        if not as_path.exists() and not as_path.is_symlink():
            raise EntryNotFoundError(f"no such file: {ref}")
        return as_path
    if cache_dir is None:
        raise EntryNotFoundError(
            f"{ref!r} is not a file; give --dir DIR (or set JAX_COMPILATION_CACHE_DIR)"
        )
    try:
        listing = reader.list_cache(cache_dir)
    except OSError as exc:
        raise CachedoctorError(f"cannot read {cache_dir}: {exc.strerror or exc}") from exc
    return listing.path(match_entry(ref, listing))


def match_entry(ref: str, listing: reader.CacheListing) -> reader.DirItem:
    """The one entry of ``listing`` that ``ref`` (key or unique prefix) names."""
    key = ref.removesuffix(reader.CACHE_SUFFIX)
    exact = [i for i in listing.entries if i.key == key]
    if exact:
        return exact[0]
    matches = [
        i
        for i in listing.entries
        if i.key and (i.key.startswith(key) or i.key.split("-")[-1].startswith(key))
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise EntryNotFoundError(f"no entry matches {ref!r} in {listing.root}")
    names = ", ".join(sorted(m.name for m in matches)[:5])
    more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
    raise EntryNotFoundError(f"{ref!r} matches {len(matches)} entries: {names}{more}")
