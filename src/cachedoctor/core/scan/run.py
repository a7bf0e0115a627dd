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
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cachedoctor import layout
from cachedoctor.cache import listdir, model, reader
from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.cache.listdir import CacheListing, DirItem, FileKind
from cachedoctor.cache.memostore import KeptText
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.core.scan import memo as scanmemo
from cachedoctor.core.scan.build import build_report, other_files
from cachedoctor.core.scan.report import JsonScan, PartWriters, ProgressCallback, ScanReport
from cachedoctor.core.usage.model import Record
from cachedoctor.storage import stores
from cachedoctor.storage.location import Location
from cachedoctor.xla import subcaches

if TYPE_CHECKING:
    from cachedoctor.cache import parallel


def scan_directory(
    cache_dir: Location,
    *,
    progress: ProgressCallback | None = None,
    max_decompressed: int = reader.DEFAULT_MAX_DECOMPRESSED,
    jax_info: JaxInfo | None = None,
    now: float | None = None,
    use_index: bool = True,
    workers: int | None = None,
    entries: bool = True,
    all_tiers: bool | None = None,
    executor: Executor | None = None,
) -> ScanReport:
    """Scan ``cache_dir``. Raises OSError only when the directory itself cannot be listed.

    ``entries=False`` leaves the report's ``entries`` and ``other_files`` out (None): for
    callers that use only the summary, modules and findings (the text report, ``lint``,
    ``stats``), whose repeated scan of an unchanged cache then reads only the listing and the
    memo.

    ``all_tiers`` (default: ``entries``): decode every entry's HLO facts (summary, program
    digest, volatile fields). Otherwise they are decoded only where a verdict needs them, in a
    module with several entries whose program signatures tie (``cache/tiers.py``): the report's
    summary, modules and findings are the same either way.

    A bucket (``gs://``/``s3://``) is listed and read through its Location's store, the
    entries decoded concurrently (a bounded pool) by the same reader. A local directory's
    unchanged entries come from the scan index (``index.py``); the rest are decoded on
    ``workers`` processes (default: every core, see ``parallel.py``). The report of a cache in
    which nothing changed comes whole from the scan memo (``memo.py``).

    ``executor`` (a ``concurrent.futures.Executor``: a thread or process pool, a Dask client's
    ``get_executor()``) decodes the entries to read instead, in chunks, results in listing order
    (``cache/executors.py``): the report is the same.
    """
    scan = _Scan(
        jax_info or installed_jax(),
        time.time() if now is None else now,
        max_decompressed,
        use_index,
        progress,
        entries,
        entries if all_tiers is None else all_tiers,
        executor=executor,
    )
    return scan.run(cache_dir, workers)[0]


def scan_json(
    cache_dir: Location,
    writers: PartWriters,
    *,
    progress: ProgressCallback | None = None,
    max_decompressed: int = reader.DEFAULT_MAX_DECOMPRESSED,
    jax_info: JaxInfo | None = None,
    now: float | None = None,
    use_index: bool = True,
    workers: int | None = None,
    executor: Executor | None = None,
) -> JsonScan:
    """``scan_directory`` for a document that holds every entry (``scan --json``): the text of
    its long parts (entries, files...) as ``writers`` make it, kept beside the scan memo and
    served with it (``memostore.py``), so that a repeated scan of an unchanged cache reads no
    entry. Where no memo is kept, the report with its entries instead (``JsonScan``)."""
    scan = _Scan(
        jax_info or installed_jax(),
        time.time() if now is None else now,
        max_decompressed,
        use_index,
        progress,
        True,
        True,  # every tier: the document shows every entry's HLO facts
        writers,
        executor,
    )
    return JsonScan(*scan.run(cache_dir, workers))


_Outcome = tuple[ScanReport, KeptText | None]  # the report, and its kept document text


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
    files are then read (without progress) only when ``with_entries``, and not even then when
    ``writers`` is given and the memo holds their JSON text."""

    jax_info: JaxInfo
    now: float
    max_decompressed: int
    use_index: bool
    progress: ProgressCallback | None
    with_entries: bool
    all_tiers: bool
    writers: PartWriters | None = None  # scan_json: keep and serve the document text
    executor: Executor | None = None  # decodes the entries to read (``cache/executors.py``)

    def run(self, where: Location, workers: int | None) -> _Outcome:
        with _cyclic_gc_paused():
            if where.local_path is None:  # a bucket: listed and read through its store
                with stores.one_line_errors(where.spelling):
                    return self.bucket(where)
            return self.local(where, workers)  # the plain directory scan: modes, owners, symlinks

    def _served(self, memo: scanmemo.Memo, rest: scanmemo.Rest) -> _Outcome | None:
        """The memo's report, with what this scan asks for, or None when it serves none."""
        if self.writers is None:
            report = memo.served(self.now, rest if self.with_entries else None)
            return None if report is None else (report, None)
        report = memo.served(self.now, None)
        if report is None:
            return None
        kept = memo.kept_text(self.writers)
        if kept is not None:
            return report, kept
        entries, others = rest()  # kept by a scan that did not ask for them: keep them now
        whole = dataclasses.replace(report, entries=tuple(entries), other_files=tuple(others))
        return self._finished(memo, whole)

    def _finished(self, memo: scanmemo.Memo, report: ScanReport) -> _Outcome:
        """A report made (and kept by ``memo.kept``) or served whole, as this scan asks for
        it: without entries for the text report, with them or with their kept JSON text."""
        if self.writers is not None:
            kept = memo.keep_text(report, self.writers)
            if kept is None:
                return report, None
        elif self.with_entries:
            return report, None
        else:
            kept = None
        return dataclasses.replace(report, entries=None, other_files=None), kept

    def local(self, where: Location, workers: int | None) -> _Outcome:
        from cachedoctor.cache import index, parallel

        early = None
        if self.use_index and index.travelled(where.spelling, (self.max_decompressed,)):
            early = parallel.start_hashing_dir(where.spelling, workers=workers)
        try:
            return self._local(where, workers, early)
        finally:
            if early is not None:
                early.close()

    def _local(
        self, where: Location, workers: int | None, early: parallel.EarlyDigests | None
    ) -> _Outcome:
        snapshot = listdir.read_dir(where.spelling)
        args = (self.jax_info, self.max_decompressed, self.now)
        inputs = scanmemo.local_inputs(snapshot, *args) if self.use_index else None
        memo = scanmemo.Memo(inputs, snapshot.root, self.max_decompressed)
        served = self._served(memo, functools.partial(self._local_rest, snapshot, workers))
        if served is not None:
            return served
        listing = listdir.listing_of(snapshot)
        del snapshot  # its facts are the listing's now: 100,000 names hold ~25 MB
        entries = self._local_entries(listing, workers, self.progress, early)
        sub = None
        kinds = (FileKind.AUTOTUNE_SUBCACHE, FileKind.KERNEL_SUBCACHE)
        if any(i.kind in kinds for i in listing.items):
            sub = subcaches.scan_subcaches(Path(listing.root))
        manifests = _read_manifests(listing, where)
        records, archived = _read_records(listing, where)
        report = build_report(
            listing,
            entries,
            self.jax_info,
            self.now,
            sub,
            manifests=manifests,
            records=records,
            evidence_records=[*records, *archived],
        )
        return self._finished(memo, memo.kept(report))

    def _local_entries(
        self,
        listing: CacheListing,
        workers: int | None,
        progress: ProgressCallback | None,
        early: parallel.EarlyDigests | None = None,
    ) -> list[EntryInfo]:
        from cachedoctor.cache import parallel

        path_of = _local_path_of(listing)

        def digests_of(todo: list[DirItem]) -> Callable[[], list[str | None]]:
            if early is not None:  # hashing since before the listing (a restored copy)
                return early.of(todo, path_of)
            paths, sizes = [path_of(i) for i in todo], [i.size for i in todo]
            return parallel.start_digests(paths, sizes, workers=workers)

        return _decode_entries(
            listing,
            lambda todo, advance, defer: parallel.decode_items_digested(
                listing,
                todo,
                max_decompressed=self.max_decompressed,
                workers=workers,
                progress=advance,
                defer_hlo=defer,
                executor=self.executor,
            ),
            path_of,
            progress,
            self.max_decompressed if self.use_index else None,
            self.all_tiers,
            digests_of,
            lambda item: reader.decode_entry(path_of(item), key=item.key, detail=True),
        )

    def _local_rest(
        self, snapshot: listdir.DirSnapshot, workers: int | None
    ) -> tuple[list[EntryInfo], tuple[DirItem, ...]]:
        """A served report's entries and other files, when asked for (no progress)."""
        listing = listdir.listing_of(snapshot)
        return self._local_entries(listing, workers, None), other_files(listing)

    def bucket(self, where: Location) -> _Outcome:
        store = where.store()
        listing = listdir.list_cache(store)
        args = (self.jax_info, self.max_decompressed, self.now)
        inputs = scanmemo.bucket_inputs(where, listing, *args) if self.use_index else None
        memo = scanmemo.Memo(inputs, listing.root, self.max_decompressed, listing.remote)

        def decoded(progress: ProgressCallback | None) -> list[EntryInfo]:
            with stores.one_line_errors(store.url):
                return _decode_entries(
                    listing,
                    functools.partial(
                        _decode_from_store, store, self.max_decompressed, self.executor
                    ),
                    lambda item: store.url_of(item.name),
                    progress,
                    self.max_decompressed if self.use_index else None,
                    self.all_tiers,
                    read_detail=lambda item: reader.decode_item(store, item, detail=True),
                )

        served = self._served(memo, lambda: (decoded(None), other_files(listing)))
        if served is not None:
            return served
        entries = decoded(self.progress)
        manifests = _read_manifests(listing, where)
        records, archived = _read_records(listing, where)
        report = build_report(
            listing,
            entries,
            self.jax_info,
            self.now,
            manifests=manifests,
            records=records,
            evidence_records=[*records, *archived],
        )
        return self._finished(memo, memo.kept(report))


def _local_path_of(listing: CacheListing) -> Callable[[DirItem], str]:
    """``str(listing.path(item))`` (the decoder's spelling of an entry's path), without a
    ``Path`` per entry."""
    base = str(Path(listing.root))
    if base == ".":
        return lambda item: item.name
    prefix = os.path.join(base, "")  # os.path.join(base, name) for a name without a slash
    return lambda item: prefix + item.name


# (items, progress by increments, defer_hlo) -> their entries, in order, each with the digest
# of its bytes when known (local files)
Decoder = Callable[
    [list[DirItem], Callable[[int], None] | None, bool], Iterable[tuple[EntryInfo, str | None]]
]


def _decode_from_store(
    store: stores.Store,
    max_decompressed: int,
    executor: Executor | None,
    todo: list[DirItem],
    advance: Callable[[int], None] | None,
    defer_hlo: bool,
) -> list[tuple[EntryInfo, str | None]]:
    """Decode objects concurrently through the store (or in chunks on ``executor``, each
    worker reading through the same store), reporting one step per object (no digests: an
    object is known by its generation or ETag)."""
    if executor is not None:
        from cachedoctor.cache import executors

        decoded = executors.decode_store_items(
            store,
            todo,
            executor,
            max_decompressed=max_decompressed,
            defer_hlo=defer_hlo,
            progress=advance,
        )
        return [(info, None) for info in decoded]
    step = None if advance is None else (lambda _done, _total: advance(1))
    decoded = reader.decode_store_entries(
        store, todo, progress=step, max_decompressed=max_decompressed, defer_hlo=defer_hlo
    )
    return [(info, None) for info in decoded]


def _decode_entries(
    listing: CacheListing,
    decode: Decoder,
    path_of: Callable[[DirItem], str],
    progress: ProgressCallback | None,
    index_options: int | None,
    all_tiers: bool = True,
    digests_of: Callable[[list[DirItem]], Callable[[], list[str | None]]] | None = None,
    read_detail: Callable[[DirItem], EntryDetail | EntryInfo] | None = None,
) -> list[EntryInfo]:
    """Every entry of the listing, in order: from the index (when ``index_options`` is given)
    when unchanged (by identity, or by the digests of a local file's bytes that ``digests_of``
    starts), else decoded by ``decode`` (which reports its progress by increments).
    Without ``all_tiers``, the HLO facts only where a verdict needs them (``cache/tiers.py``);
    with it, an index row that lacks them is decoded again."""
    from cachedoctor.cache import index as index_mod

    items = listing.entries
    idx = None
    if index_options is not None:
        idx = index_mod.load(
            listing.root, (index_options,), entries=bool(items), remote=listing.remote
        )
    strings: dict[str, str] = {}  # one object per repeated string (model.share_strings)
    served = {} if idx is None else idx.serve(items, path_of, strings, digests_of)
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
        elif (hit := served.pop(item.name, None)) is not None and (
            not all_tiers or not hit.hlo_deferred
        ):
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

    decoded = decode(
        [items[n] for n in todo], advance if progress is not None else None, not all_tiers
    )
    digests: dict[str, str | None] = {}
    for n, (info, digest) in zip(todo, decoded, strict=True):
        found[n] = model.share_strings(info, strings, items[n].key)
        digests[items[n].name] = digest
    entries = [e for e in found if e is not None]
    changed = set(todo)
    if not all_tiers:
        changed.update(_tied_completed(entries, items, decode, strings, digests))
    if read_detail is not None:
        changed.update(_kernels_read(entries, items, read_detail))
    if idx is not None:
        fresh = {items[n].name: entries[n] for n in changed}
        idx.update(items, fresh, time.time(), digests)
        idx.save()
    return entries


def _tied_completed(
    entries: list[EntryInfo],
    items: list[DirItem],
    decode: Decoder,
    strings: dict[str, str],
    digests: dict[str, str | None],
) -> list[int]:
    """Every tier for the entries a verdict needs them of (``tiers.tied``), decoded again in
    place (their digests into ``digests``); their positions."""
    from cachedoctor.cache import tiers

    def again(positions: list[int]) -> list[EntryInfo]:
        decoded = decode([items[n] for n in positions], None, False)
        out = []
        for n, (e, digest) in zip(positions, decoded, strict=True):
            digests[items[n].name] = digest
            out.append(model.share_strings(e, strings, items[n].key))
        return out

    return tiers.complete(entries, tiers.tied(entries), again)


def _kernels_read(
    entries: list[EntryInfo],
    items: list[DirItem],
    read_detail: Callable[[DirItem], EntryDetail | EntryInfo],
) -> list[int]:
    """The kernel tier (``tiers.kernel_candidates``): the Pallas kernels of the entries whose
    verdict needs their bodies, read in place; their positions."""
    from cachedoctor.cache import tiers

    positions = tiers.kernel_candidates(entries)
    for n in positions:
        known = tiers.with_known_kernels_read(entries[n])
        if known is not None:
            entries[n] = known
            continue
        detail = read_detail(items[n])
        if isinstance(detail, EntryDetail) and detail.info.key == entries[n].key:
            entries[n] = tiers.with_kernels_read(entries[n], detail.hlo_module)
    return positions


def _read_manifests(listing: CacheListing, root: Location) -> list[Mapping[str, object]]:
    """The cache's key manifests as JSON data; none are read when it has no manifests folder."""
    from cachedoctor.stablekeys import manifest

    if not any(i.name == layout.MANIFEST_DIRNAME for i in listing.items):
        return []
    try:
        return [m.to_dict() for m in manifest.iter_manifests(root)]
    except OSError:
        return []


def _read_records(listing: CacheListing, where: Location) -> tuple[list[Record], list[Record]]:
    """The stats records, and those ``stats --zero`` archived, where the cache has them:
    ``not-stored`` explains from the first the modules key manifests name without an entry,
    and ``corrupt`` from both the loads JAX failed on the files there now
    (``usage/load_failures``); unreadable ones are left out here."""
    from cachedoctor.core.usage.records import read_archived, read_records

    if not any(i.name == layout.STATS_DIRNAME for i in listing.items):
        return [], []
    try:
        store = where.store()
        return read_records(store)[0], read_archived(store)
    except OSError:
        return [], []
