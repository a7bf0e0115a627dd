"""The scan: read a cache directory and turn what it holds into a report with findings.

``scan_directory`` returns a frozen ``ScanReport``; it never prints. Renderers (``render/``)
turn the report into a table, JSON or CI formats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cachedoctor import layout
from cachedoctor.cache import listdir, model, reader
from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.cache.listdir import CacheListing, DirItem, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.scan import memo as scanmemo
from cachedoctor.core.scan.build import build_report, other_files
from cachedoctor.core.scan.report import ProgressCallback, ScanReport
from cachedoctor.core.usage.records import Record
from cachedoctor.storage import stores
from cachedoctor.storage.location import Location, Where
from cachedoctor.xla import subcaches


def scan_directory(
    cache_dir: Where,
    *,
    progress: ProgressCallback | None = None,
    max_decompressed: int = reader.DEFAULT_MAX_DECOMPRESSED,
    jax_info: JaxInfo | None = None,
    now: float | None = None,
    use_index: bool = True,
    workers: int | None = None,
    entries: bool = True,
) -> ScanReport:
    """Scan ``cache_dir``. Raises OSError only when the directory itself cannot be listed.

    ``entries=False`` leaves the report's ``entries`` and ``other_files`` out (None): for
    callers that use only the summary, modules and findings (the text report, ``lint``,
    ``stats``), whose repeated scan of an unchanged cache then reads only the listing and the
    memo.

    A bucket (``gs://``/``s3://``) is listed and read through its Location's store, the
    entries decoded concurrently (a bounded pool) by the same reader. A local directory's
    unchanged entries come from the scan index (``index.py``); the rest are decoded on
    ``workers`` processes (default: every core, see ``parallel.py``). The report of a cache in
    which nothing changed comes whole from the scan memo (``memo.py``).
    """
    jax_info = jax_info or installed_jax()
    now = time.time() if now is None else now
    scan = _Scan(jax_info, now, max_decompressed, use_index, progress, entries)
    where = Location.parse(cache_dir)
    with _cyclic_gc_paused():
        if not where.is_local:
            store = where.store()
            with stores.one_line_errors(store.url):
                return scan.bucket(store)
        return scan.local(where, workers)  # the plain directory scan: modes, owners, symlinks


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while the scan runs (reference counting still frees).

    A scan makes tens of thousands of listing items, rows and findings, none in a cycle; each
    700 new objects the collector runs, and every so often it walks all of the process's
    objects: about a tenth of a repeated scan. Pool workers turn it back on
    (``parallel.py``).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(frozen=True)
class _Scan:
    """One scan's settings, and its two paths: a local directory and a bucket. Each first asks
    the scan memo (``memo``) for the report of an unchanged cache; its entries and other
    files are then read (without progress) only when ``with_entries``."""

    jax_info: JaxInfo
    now: float
    max_decompressed: int
    use_index: bool
    progress: ProgressCallback | None
    with_entries: bool

    def _rest(self, read: scanmemo.Rest) -> scanmemo.Rest | None:
        return read if self.with_entries else None

    def _finished(self, report: ScanReport) -> ScanReport:
        if self.with_entries:
            return report
        return dataclasses.replace(report, entries=None, other_files=None)

    def local(self, where: Location, workers: int | None) -> ScanReport:
        snapshot = listdir.read_dir(where.spelling)
        args = (self.jax_info, self.max_decompressed, self.now)
        inputs = scanmemo.local_inputs(snapshot, *args) if self.use_index else None
        memo = scanmemo.Memo(inputs, snapshot.root, self.max_decompressed)
        rest = functools.partial(self._local_rest, snapshot, workers)
        served = memo.served(self.now, self._rest(rest))
        if served is not None:
            return served
        listing = listdir.listing_of(snapshot)
        del snapshot  # its facts are the listing's now: 100,000 names hold ~25 MB
        entries = self._local_entries(listing, workers, self.progress)
        sub = None
        kinds = (FileKind.AUTOTUNE_SUBCACHE, FileKind.KERNEL_SUBCACHE)
        if any(i.kind in kinds for i in listing.items):
            sub = subcaches.scan_subcaches(Path(listing.root))
        manifests = _read_manifests(listing, listing.root)
        records = _read_records(listing, manifests, where)
        report = build_report(
            listing, entries, self.jax_info, self.now, sub, manifests=manifests, records=records
        )
        return self._finished(memo.kept(report))

    def _local_entries(
        self, listing: CacheListing, workers: int | None, progress: ProgressCallback | None
    ) -> list[EntryInfo]:
        from cachedoctor.cache import parallel

        return _decode_entries(
            listing,
            lambda todo, advance: parallel.decode_items(
                listing,
                todo,
                max_decompressed=self.max_decompressed,
                workers=workers,
                progress=advance,
            ),
            _local_path_of(listing),
            progress,
            self.max_decompressed if self.use_index else None,
        )

    def _local_rest(
        self, snapshot: listdir.DirSnapshot, workers: int | None
    ) -> tuple[list[EntryInfo], tuple[DirItem, ...]]:
        """A served report's entries and other files, when asked for (no progress)."""
        listing = listdir.listing_of(snapshot)
        return self._local_entries(listing, workers, None), other_files(listing)

    def bucket(self, store: stores.Store) -> ScanReport:
        listing = listdir.list_cache(store)
        args = (self.jax_info, self.max_decompressed, self.now)
        inputs = scanmemo.bucket_inputs(listing, *args) if self.use_index else None
        memo = scanmemo.Memo(inputs, listing.root, self.max_decompressed)

        def decoded(progress: ProgressCallback | None) -> list[EntryInfo]:
            with stores.one_line_errors(store.url):
                return _decode_entries(
                    listing,
                    functools.partial(_decode_from_store, store, self.max_decompressed),
                    lambda item: store.url_of(item.name),
                    progress,
                    self.max_decompressed if self.use_index else None,
                )

        served = memo.served(self.now, self._rest(lambda: (decoded(None), other_files(listing))))
        if served is not None:
            return served
        entries = decoded(self.progress)
        manifests = _read_manifests(listing, store.url)
        records = _read_records(listing, manifests, Location.of_store(store))
        report = build_report(
            listing, entries, self.jax_info, self.now, manifests=manifests, records=records
        )
        return self._finished(memo.kept(report))


def _local_path_of(listing: CacheListing) -> Callable[[DirItem], str]:
    """``str(listing.path(item))`` (the decoder's spelling of an entry's path), without a
    ``Path`` per entry."""
    base = str(Path(listing.root))
    if base == ".":
        return lambda item: item.name
    return lambda item: os.path.join(base, item.name)


Decoder = Callable[[list[DirItem], Callable[[int], None] | None], Iterable[EntryInfo]]


def _decode_from_store(
    store: stores.Store,
    max_decompressed: int,
    todo: list[DirItem],
    advance: Callable[[int], None] | None,
) -> list[EntryInfo]:
    """Decode objects concurrently through the store, reporting one step per object."""
    step = None if advance is None else (lambda _done, _total: advance(1))
    return reader.decode_store_entries(
        store, todo, progress=step, max_decompressed=max_decompressed
    )


def _decode_entries(
    listing: CacheListing,
    decode: Decoder,
    path_of: Callable[[DirItem], str],
    progress: ProgressCallback | None,
    index_options: int | None,
) -> list[EntryInfo]:
    """Every entry of the listing, in order: from the index (when ``index_options`` is given)
    when unchanged, else decoded by ``decode`` (which reports its progress by increments)."""
    from cachedoctor.cache import index as index_mod

    items = listing.entries
    idx = None if index_options is None else index_mod.load(listing.root, (index_options,))
    strings: dict[str, str] = {}  # one object per repeated string (model.share_strings)
    served = {} if idx is None else idx.serve(items, path_of, strings)
    found: list[EntryInfo | None] = [None] * len(items)
    todo: list[int] = []
    for n, item in enumerate(items):
        if item.is_symlink:
            found[n] = EntryInfo(
                key=item.key or item.name,
                module=listdir.module_of(item.key) if item.key else None,
                path=path_of(item),
                size=item.size,
                mtime_ns=item.mtime_ns,
                problems=(model.Problem("symlink", "is a symbolic link; not followed"),),
            )
        elif (hit := served.pop(item.name, None)) is not None:
            found[n] = hit
        else:
            todo.append(n)
    done = len(items) - len(todo)
    if progress is not None and done:
        progress(done, len(items))

    def advance(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, len(items))

    decoded = decode([items[n] for n in todo], advance if progress is not None else None)
    for n, info in zip(todo, decoded, strict=True):
        found[n] = model.share_strings(info, strings, items[n].key)
    entries = [e for e in found if e is not None]
    if idx is not None:
        idx.update(items, {items[n].name: found[n] for n in todo}, time.time())  # type: ignore[misc]
        idx.save()
    return entries


def _read_manifests(listing: CacheListing, root: str) -> list[Mapping[str, object]]:
    """The cache's key manifests as JSON data; none are read when it has no manifests folder."""
    from cachedoctor.stablekeys import manifest

    if not any(i.name == layout.MANIFEST_DIRNAME for i in listing.items):
        return []
    try:
        return [m.to_dict() for m in manifest.iter_manifests(root)]
    except OSError:
        return []


def _read_records(
    listing: CacheListing, manifests: list[Mapping[str, object]], where: Location
) -> list[Record]:
    """The stats records, read only when key manifests may name modules without an entry
    (``not-stored`` explains them from the records); unreadable ones are left out here."""
    from cachedoctor.core.usage.records import read_records

    if not manifests or not any(i.name == layout.STATS_DIRNAME for i in listing.items):
        return []
    try:
        return read_records(where.store())[0]
    except OSError:
        return []
