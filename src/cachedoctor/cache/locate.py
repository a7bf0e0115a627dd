"""Turn what a user types (a key, a unique key prefix, or a path) into one entry file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cachedoctor import layout
from cachedoctor.cache import listdir
from cachedoctor.errors import AmbiguousEntryError, EntryNotFoundError, clip, path_error
from cachedoctor.storage.location import Location
from cachedoctor.storage.model import StoreError
from cachedoctor.storage.stores import Store, one_line_errors


def locate_entry(ref: str, cache_dir: Location | None) -> Path:
    """Resolve ``ref`` to an entry path; raises EntryNotFoundError with the candidates."""
    as_path = Path(ref)
    try:
        st: os.stat_result | None = as_path.lstat()
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a name too long for the file system, a folder we cannot enter
        raise path_error(exc, ref, what="file", verb="use", cls=EntryNotFoundError) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise EntryNotFoundError(
            f"{clip(ref)} is a directory, not an entry: `cachedoctor scan {clip(ref)}` "
            "lists its entries; give one of them, or a key with --dir"
        )
    is_file = st is not None and stat.S_ISREG(st.st_mode)
    if os.sep in ref or is_file or (st is not None and ref.endswith(layout.CACHE_SUFFIX)):
        if st is None:
            raise EntryNotFoundError(f"no such file: {clip(ref)}")
        if not (is_file or stat.S_ISLNK(st.st_mode)):
            raise EntryNotFoundError(f"{clip(ref)} is not a regular file (a FIFO, socket, device)")
        return as_path
    if cache_dir is None:
        raise EntryNotFoundError(
            f"{clip(ref)!r} is not a file; give --dir DIR (or set JAX_COMPILATION_CACHE_DIR)"
        )
    try:
        listing = listdir.list_cache(cache_dir.spelling)
    except OSError as exc:
        raise path_error(exc, cache_dir.spelling) from None
    return listing.path(match_entry(ref, listing))


def match_entry(ref: str, listing: listdir.CacheListing) -> listdir.DirItem:
    """The one entry of ``listing`` that ``ref`` (key or unique prefix) names."""
    key = ref.removesuffix(layout.CACHE_SUFFIX)
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
        raise EntryNotFoundError(f"no entry matches {clip(ref)!r} in {listing.root}")
    names = ", ".join(sorted(m.name for m in matches)[:5])
    more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
    raise AmbiguousEntryError(
        f"{clip(ref)!r} matches {len(matches)} entries: {names}{more}; give more of the key"
    )


def locate_in_store(entry: Location, cache_dir: Location | None) -> tuple[Store, listdir.DirItem]:
    """An entry in a bucket: ``entry`` is its URL, or a key/prefix looked up in ``cache_dir``."""
    ref = entry.spelling
    if entry.url is not None:
        parent = entry.parent
        if parent is None:
            raise EntryNotFoundError(f"{ref} names a bucket, not an entry")
        store = parent.store()
        with one_line_errors(ref):
            found = store.stat(entry.name)
        if found is None:
            raise EntryNotFoundError(f"no such object: {ref}")
        return store, listdir.store_item(found)
    if cache_dir is None:
        raise EntryNotFoundError(f"{ref!r} is not an entry URL; give --dir gs://… or s3://…")
    store = cache_dir.store()
    try:
        with one_line_errors(cache_dir.spelling):
            listing = listdir.list_cache(store)
    except FileNotFoundError as exc:
        raise EntryNotFoundError(f"no such bucket or prefix: {cache_dir}") from exc
    except OSError as exc:
        raise path_error(exc, cache_dir.spelling, cls=StoreError) from exc
    return store, match_entry(ref, listing)
