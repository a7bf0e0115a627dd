"""Entries decoded in full from a file or a bucket: ``resolve_entry`` (what ``show`` and ``diff``
name by key, prefix, path or URL) and the loaders of ``diff``; unusable ones: one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

from cachedoctor.cache import listdir, locate, reader
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.core.diff.report import EntrySide
from cachedoctor.errors import CachedoctorError, EntryNotFoundError
from cachedoctor.storage import stores
from cachedoctor.storage.location import Location


def load_detail(path: str | os.PathLike[str]) -> EntryDetail:
    """Decode one entry for diffing; raises CachedoctorError (one line) when it is unusable."""
    p = Path(path)
    if p.is_symlink():
        raise CachedoctorError(f"{p} is a symbolic link; not followed", slug="symlink")
    if not p.is_file():
        raise EntryNotFoundError(f"not a cache entry file: {p}")
    detail = reader.decode_entry(os.path.abspath(p), detail=True)
    assert isinstance(detail, EntryDetail)
    return _usable(detail, str(p))


def resolve_entry(
    ref: Location, cache_dir: Location | None, *, to_compare: bool = False
) -> tuple[EntryDetail, Location]:
    """The entry ``ref`` names, decoded in full, and where it is (its file or object).

    ``ref`` (a Location made at the edge from what the user typed) is a key or a unique prefix
    of one (looked up in ``cache_dir``), a path to a ``-cache`` file, or the URL of an object.
    With a bucket ``cache_dir``, a ref that is no local file is looked up in the bucket.
    ``to_compare`` (``diff``): the entry must be usable (a one-line error otherwise), a symbolic
    link is refused, and a file is named by its absolute path; without it (``show``) the detail
    says what is wrong with the entry.
    """
    in_bucket = cache_dir is not None and cache_dir.url is not None
    if ref.local_path is None or (in_bucket and not ref.exists_locally()):
        store, item = locate.locate_in_store(ref, cache_dir)
        where = store.url_of(item.name)
        with stores.one_line_errors(where):
            detail = reader.decode_item(store, item, detail=True)
        assert isinstance(detail, EntryDetail)
        return (_usable(detail, where) if to_compare else detail), Location.of_store(store).child(
            item.name
        )
    path = locate.locate_entry(ref.spelling, cache_dir)
    if to_compare:
        return load_detail(path), Location.local(os.path.abspath(path))
    detail = reader.decode_entry(str(path), detail=True)
    assert isinstance(detail, EntryDetail)
    return detail, Location.local(str(path))


def load_item(store: stores.Store, item: listdir.DirItem) -> EntryDetail:
    url = store.url_of(item.name)
    with stores.one_line_errors(url):
        detail = reader.decode_item(store, item, detail=True)
    assert isinstance(detail, EntryDetail)
    return _usable(detail, url)


def _usable(detail: EntryDetail, where: str) -> EntryDetail:
    if detail.info.problems:
        problem = detail.info.problems[0]
        slug = problem.kind if problem.kind in ("unsupported", "unreadable") else "corrupt"
        raise CachedoctorError(f"cannot diff {where}: {problem.kind}: {problem.message}", slug=slug)
    return detail


def cache_dir_of(entry: Location, path: str) -> Location:
    """The cache directory of the entry ``entry`` (``path``: the path or URL its detail was
    read from): a bucket's prefix, or the folder ``Path(path).parent`` names."""
    parent = entry.parent
    if parent is None or parent.local_path is not None:
        return Location.local(str(Path(path).parent))
    return parent


def side_of(info: EntryInfo, entry: Location) -> EntrySide:
    """One side of a diff: the entry ``info`` read from ``entry`` (its file or object)."""
    return EntrySide(
        key=info.key,
        module=info.module,
        path=info.path,
        cache_dir=cache_dir_of(entry, info.path),
        format=info.format_label,
        platform=info.platform,
        size=info.size,
        decompressed_size=info.decompressed_size,
        compile_time_s=info.compile_time_s,
        mtime_ns=info.mtime_ns,
        executable_digest=info.executable_digest,
        program_digest=info.program_digest,
    )
