"""What ``cachedoctor show`` does beyond reading the entry: write its payload to a file."""

from __future__ import annotations

import os

from cachedoctor.cache import reader
from cachedoctor.cache.listdir import DirItem
from cachedoctor.errors import CachedoctorError, path_error
from cachedoctor.storage.files import atomic_file, new_file_mode, open_regular
from cachedoctor.storage.stores import Store


def extract_to_file(
    entry_path: str, target: str, *, store: Store | None = None, item: DirItem | None = None
) -> int:
    """Write the entry's decompressed serialized executable to ``target``; the byte count.

    The file appears whole or not at all (the one atomic write, ``storage/files``), as a new
    file with the mode ``open()`` gives it: an existing ``target`` is never replaced, and a
    damaged entry leaves nothing behind. An entry in a bucket is read through ``store``.
    Errors are one-line ``CachedoctorError``s: ``exists``, ``io``, ``corrupt``.
    """
    if os.path.lexists(target):
        raise CachedoctorError(f"{target} exists; not overwriting it", slug="exists")
    try:
        source = store.open_read(item.name) if store and item else open_regular(entry_path)
    except OSError as exc:
        raise path_error(exc, entry_path, what="file") from None
    try:
        with source, atomic_file(target, mode=new_file_mode(), create=True) as out:
            return reader.extract_payload(entry_path, out, fileobj=source)
    except ValueError as exc:
        raise CachedoctorError(f"cannot extract {entry_path}: {exc}", slug="corrupt") from exc
    except FileExistsError:
        raise CachedoctorError(f"{target} exists; not overwriting it", slug="exists") from None
    except OSError as exc:
        raise path_error(exc, target, what="file", verb="write") from None
