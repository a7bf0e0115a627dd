"""Entries to compare, decoded in full from a file or a bucket; unusable ones: one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

from cachedoctor.cache import listdir, locate, reader
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.core.diff.report import EntrySide
from cachedoctor.errors import CachedoctorError, EntryNotFoundError
from cachedoctor.storage import stores, urls


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


def load_from_store(ref: str, cache_dir: str | None) -> EntryDetail:
    """Decode an entry in a bucket: ``ref`` is its URL, or a key/prefix in ``cache_dir`` (a URL)."""
    store, item = locate.locate_in_store(ref, cache_dir)
    return load_item(store, item)


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


def cache_dir_of(path: str) -> str:
    """The cache directory of an entry path or URL (``Path`` would collapse ``gs://``)."""
    if urls.is_url(path):
        return path.rstrip("/").rpartition("/")[0]
    return str(Path(path).parent)


def side_of(info: EntryInfo) -> EntrySide:
    return EntrySide(
        key=info.key,
        module=info.module,
        path=info.path,
        cache_dir=cache_dir_of(info.path),
        format=info.format_label,
        platform=info.platform,
        size=info.size,
        decompressed_size=info.decompressed_size,
        compile_time_s=info.compile_time_s,
        mtime_ns=info.mtime_ns,
        executable_digest=info.executable_digest,
        program_digest=info.program_digest,
    )
