"""The scan: read a cache directory and turn what it holds into a report with findings.

``scan_directory`` returns a frozen ``ScanReport``; it never prints. Renderers (``render/``)
turn the report into a table, JSON or CI formats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import gc
import os
import stat
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cachedoctor import layout
from cachedoctor.cache import listdir, model, reader
from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.cache.listdir import CacheListing, DirItem, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.commands.plaindata import ToDict
from cachedoctor.errors import count
from cachedoctor.storage import stores, urls
from cachedoctor.xla import subcaches

SCHEMA_VERSION = 1
RECENT_WRITE_S = 60  # JAX writes entries in place; a very young truncated file may be mid-write


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


class FindingKind(enum.StrEnum):
    UNSTABLE_KEY = "unstable-key"
    RELOCATED = "relocated"
    MISSING_ATIME = "missing-atime"
    CORRUPT = "corrupt"
    UNREADABLE = "unreadable"
    ORPHAN = "orphan"
    INSECURE = "insecure"
    MIXED_VERSIONS = "mixed-versions"
    MIXED_PLATFORMS = "mixed-platforms"
    UNKNOWN_FILE = "unknown-file"
    SUBCACHE = "subcache"
    NEVER_HIT = "never-hit"  # from the stats records (commands/stats.py)
    STATS_RECORD = "stats-record"  # an unreadable file in cachedoctor-stats/
    SAME_PROGRAM = "same-program"
    NOT_STORED = "not-stored"


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    severity: Severity
    message: str  # what is wrong, naming the module or file
    advice: str  # one line: what the user should do
    evidence: str  # what the verdict rests on: files, stored bytes, manifests, times
    entries: tuple[str, ...] = ()  # keys (or file names for non-entries) involved
    module: str | None = None


@dataclass(frozen=True)
class KeyModeUse:
    """How the stable hasher keyed some of a module's entries, and why (from their manifests)."""

    mode: str  # static, replay, declared or fallback (stablekeys.manifest.KEY_MODES)
    reason: str
    entries: int


@dataclass(frozen=True)
class ModuleStats:
    module: str
    entries: int
    programs: int  # distinct programs (modulo volatile fields) among the entries
    bytes_on_disk: int
    compile_seconds: int
    key_modes: tuple[KeyModeUse, ...] = ()  # empty: no entry has a key manifest


@dataclass(frozen=True)
class ScanSummary:
    entries: int
    bytes_on_disk: int
    decompressed_bytes: int
    compile_seconds: int
    modules: int
    platforms: tuple[tuple[str, int], ...]
    formats: tuple[tuple[str, int], ...]
    corrupt: int
    atime_files: int
    eviction_in_use: bool
    subcaches: tuple[tuple[str, int], ...]  # name, bytes on disk


@dataclass(frozen=True)
class ScanReport(ToDict):
    cache_dir: str
    scanned_at: float
    jax: JaxInfo
    summary: ScanSummary
    modules: tuple[ModuleStats, ...]
    entries: Sequence[EntryInfo]  # a tuple, or made when first used (scanmemo.Deferred)
    findings: tuple[Finding, ...]
    other_files: Sequence[DirItem] = field(default=())
    subcaches: subcaches.SubcacheReport | None = None

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    @property
    def looks_like_cache(self) -> bool:
        """Empty, or holding something only a JAX cache holds (an entry, -atime, sub-cache)."""
        own = {FileKind.ATIME, FileKind.LOCKFILE, FileKind.AUTOTUNE_SUBCACHE}
        own |= {FileKind.KERNEL_SUBCACHE, FileKind.CACHEDOCTOR}
        return (
            bool(self.entries)
            or not self.other_files
            or any(i.kind in own for i in self.other_files)
        )

    def without(self, kinds: Iterable[str]) -> ScanReport:
        """This report with the findings of ``kinds`` left out (``--ignore``)."""
        drop = set(kinds)
        return dataclasses.replace(
            self, findings=tuple(f for f in self.findings if f.kind not in drop)
        )

    def fails(self, threshold: Severity, ignore: Iterable[str] = ()) -> bool:
        ignored = set(ignore)
        return any(f.severity >= threshold and f.kind not in ignored for f in self.findings)


ProgressCallback = Callable[[int, int], None]


def scan_directory(
    cache_dir: str | os.PathLike[str] | stores.Store,
    *,
    progress: ProgressCallback | None = None,
    max_decompressed: int = reader.DEFAULT_MAX_DECOMPRESSED,
    jax_info: JaxInfo | None = None,
    now: float | None = None,
    use_index: bool = True,
    workers: int | None = None,
) -> ScanReport:
    """Scan ``cache_dir``. Raises OSError only when the directory itself cannot be listed.

    A ``gs://``/``s3://`` URL or a ``stores.Store`` is listed and read through the store, the
    entries decoded concurrently (a bounded pool) by the same reader. A local directory's
    unchanged entries come from the scan index (``index.py``); the rest are decoded on
    ``workers`` processes (default: every core, see ``parallel.py``). The report of a cache in
    which nothing changed comes whole from the scan memo (``scanmemo.py``).
    """
    jax_info = jax_info or installed_jax()
    now = time.time() if now is None else now
    scan = _Scan(jax_info, now, max_decompressed, use_index, progress)
    if isinstance(cache_dir, stores.Store) and cache_dir.is_local:
        cache_dir = cache_dir.url  # the plain directory scan: modes, owners, symlinks
    with _cyclic_gc_paused():
        if isinstance(cache_dir, stores.Store) or urls.is_url(cache_dir):
            store = (
                cache_dir if isinstance(cache_dir, stores.Store) else stores.open_store(cache_dir)
            )
            with stores.one_line_errors(store.url):
                return scan.bucket(store)
        return scan.local(os.fspath(cache_dir), workers)


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
    the scan memo (``scanmemo``) for the report of an unchanged cache; its entries and other
    files are then made (without progress) only if a caller reads them."""

    jax_info: JaxInfo
    now: float
    max_decompressed: int
    use_index: bool
    progress: ProgressCallback | None

    def local(self, root: str, workers: int | None) -> ScanReport:
        from cachedoctor.commands import scanmemo

        snapshot = listdir.read_dir(root)
        args = (self.jax_info, self.max_decompressed, self.now)
        inputs = scanmemo.local_inputs(snapshot, *args) if self.use_index else None
        memo = scanmemo.Memo(inputs, snapshot.root, self.max_decompressed)
        served = memo.served(self.now, functools.partial(self._local_rest, snapshot, workers))
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
        report = build_report(listing, entries, self.jax_info, self.now, sub, manifests=manifests)
        return memo.kept(report)

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
        """A served report's entries and other files, when first read (no progress)."""
        listing = listdir.listing_of(snapshot)
        return self._local_entries(listing, workers, None), _other_files(listing)

    def bucket(self, store: stores.Store) -> ScanReport:
        from cachedoctor.commands import scanmemo

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

        served = memo.served(self.now, lambda: (decoded(None), _other_files(listing)))
        if served is not None:
            return served
        entries = decoded(self.progress)
        manifests = _read_manifests(listing, store.url)
        report = build_report(listing, entries, self.jax_info, self.now, manifests=manifests)
        return memo.kept(report)


def _other_files(listing: CacheListing) -> tuple[DirItem, ...]:
    return tuple(i for i in listing.items if i.kind is not FileKind.ENTRY)


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


def build_report(
    listing: CacheListing,
    entries: list[EntryInfo],
    jax_info: JaxInfo,
    now: float,
    sub: subcaches.SubcacheReport | None = None,
    *,
    manifests: Sequence[Mapping[str, object] | None] = (),
    root_as_given: str | None = None,
) -> ScanReport:
    """Findings and statistics from decoded entries (pure: no I/O).

    ``manifests``: the cache's key manifests as JSON data (``stablekeys.manifest``): they say
    which entries are under the stable hasher, and which modules JAX compiled but never stored.
    ``root_as_given``: the directory as the user spelled it, when the listing's root is its
    real path (``relocated`` compares paths as JAX hashes them: as spelled).
    """
    findings: list[Finding] = []
    findings += _subcache_findings(sub)
    findings += _same_program_findings(entries)
    stable_keys = stable_hasher_keys(manifests)
    findings += _relocated(root_as_given or listing.root, entries, jax_info, stable_keys)
    findings += _not_stored(listing, manifests)
    findings += _atime_findings(listing)
    findings += _corrupt(entries, now)
    findings += _insecure(listing)
    findings += _mixtures(entries)
    findings += _unknown(listing)
    findings.sort(key=lambda f: (-f.severity, f.kind, f.module or "", f.entries))
    return ScanReport(
        cache_dir=listing.root,
        scanned_at=now,
        jax=jax_info,
        summary=_summary(listing, entries),
        modules=_module_stats(entries, manifests),
        entries=tuple(entries),
        findings=tuple(findings),
        other_files=_other_files(listing),
        subcaches=sub,
    )


def _subcache_findings(sub: subcaches.SubcacheReport | None) -> list[Finding]:
    if sub is None:
        return []
    findings = []
    if sub.autotune.exists and sub.autotune.problems:
        findings.append(
            Finding(
                kind=FindingKind.SUBCACHE,
                severity=Severity.WARNING,
                entries=(layout.AUTOTUNE_DIR,),
                message="autotune sub-cache: " + "; ".join(sub.autotune.problems),
                evidence="the autotune sub-cache's files, read and parsed",
                advice="XLA rebuilds it; `cachedoctor prune --xla-subcaches --apply` clears it",
            )
        )
    if sub.kernel_cache is not None and sub.kernel_cache.problems:
        findings.append(
            Finding(
                kind=FindingKind.SUBCACHE,
                severity=Severity.ERROR if not sub.kernel_cache.parsed else Severity.WARNING,
                entries=(layout.KERNEL_CACHE_FILE,),
                message="kernel cache: " + "; ".join(sub.kernel_cache.problems),
                evidence="the kernel cache file, read and parsed",
                advice=(
                    "XLA cannot reuse a damaged kernel cache; "
                    "`cachedoctor prune --xla-subcaches --apply` removes it"
                ),
            )
        )
    return findings


def _summary(listing: CacheListing, entries: list[EntryInfo]) -> ScanSummary:
    atimes = listing.of_kind(FileKind.ATIME)
    subcaches: dict[str, int] = {}
    for item in listing.items:
        if item.kind in (FileKind.AUTOTUNE_SUBCACHE, FileKind.KERNEL_SUBCACHE):
            local_dir = item.is_dir and not listing.remote  # a bucket lists totals already
            subcaches[item.name] = _tree_size(listing.path(item)) if local_dir else item.size
    return ScanSummary(
        entries=len(entries),
        bytes_on_disk=sum(e.size for e in entries),
        decompressed_bytes=sum(e.decompressed_size or 0 for e in entries),
        compile_seconds=sum(e.compile_time_s or 0 for e in entries),
        modules=len({e.module for e in entries}),
        platforms=tuple(Counter(e.platform for e in entries if e.ok).most_common()),
        formats=tuple(Counter(e.format_label for e in entries if e.ok).most_common()),
        corrupt=sum(1 for e in entries if _real_problems(e)),
        atime_files=len(atimes),
        eviction_in_use=bool(atimes) or any(i.kind is FileKind.LOCKFILE for i in listing.items),
        subcaches=tuple(sorted(subcaches.items())),
    )


def _tree_size(path: os.PathLike[str] | str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _module_stats(
    entries: list[EntryInfo], manifests: Sequence[Mapping[str, object] | None] = ()
) -> tuple[ModuleStats, ...]:
    by_module: dict[str, list[EntryInfo]] = defaultdict(list)
    for e in entries:
        by_module[e.module or "(unnamed)"].append(e)
    modes = key_modes_by_entry(manifests)
    stats = [
        ModuleStats(
            module=module,
            entries=len(group),
            programs=len({e.program_digest or e.key for e in group}),
            bytes_on_disk=sum(e.size for e in group),
            compile_seconds=sum(e.compile_time_s or 0 for e in group),
            key_modes=_count_modes(modes[e.key] for e in group if e.key in modes),
        )
        for module, group in by_module.items()
    ]
    stats.sort(key=lambda s: (-s.bytes_on_disk, s.module))
    return tuple(stats)


def duplicate_groups(entries: Iterable[EntryInfo]) -> list[list[EntryInfo]]:
    """Groups of entries holding the same program (modulo volatile fields) under several keys.

    Entries are grouped by ``program_digest`` (see ``hlo.canonicalize``); within a group the
    most recently written entry comes first. The same program under two keys is not by itself
    evidence of an unstable key: JAX hashes the module before optimisation, and different
    inputs (a result name, a no-op convert, a static argument) optimise to one program.
    """
    groups: dict[tuple[str | None, str], list[EntryInfo]] = defaultdict(list)
    for e in entries:
        if e.program_digest is not None:
            groups[(e.module, e.program_digest)].append(e)
    out = [sorted(g, key=lambda e: -e.mtime_ns) for g in groups.values() if len(g) > 1]
    out.sort(key=lambda g: (g[0].module or "", g[0].key))
    return out


def unstable_key_evidence(group: list[EntryInfo]) -> str | None:
    """What shows that a group's keys changed between runs, or None when nothing does.

    Only a key input that the stored HLO itself shows to change per process counts: a
    backend_config holding an address, or the output of a ``custom_partitioning`` op (its
    ``CustomSPMDPartitioning`` config is a Python object address that JAX hashes).
    """
    for e in sorted(group, key=lambda e: e.key):  # the same words for a copy of the cache
        for v in e.volatile:
            if v.category in reader.KEY_VOLATILE_CATEGORIES:
                return f"stored HLO of {e.key}, {v.where}: {v.detail}"
    return None


def unstable_groups(entries: Iterable[EntryInfo]) -> list[tuple[list[EntryInfo], str]]:
    """Same-program groups with evidence that their key is unstable, and that evidence.

    Shared by ``scan`` (``unstable-key``) and ``prune --duplicates``: nothing else is removed.
    Groups whose compile options name different cache paths are the ``relocated`` finding's.
    """
    out = []
    for group in duplicate_groups(entries):
        if _names_other_cache_paths(group):
            continue
        evidence = unstable_key_evidence(group)
        if evidence is not None:
            out.append((group, evidence))
    return out


def _names_other_cache_paths(group: list[EntryInfo]) -> bool:
    return len({e.autotune_dir for e in group}) > 1 or len({e.kernel_cache_file for e in group}) > 1


def _same_program_findings(entries: list[EntryInfo]) -> list[Finding]:
    """``unstable-key`` where evidence shows it, else the information "same program, N keys"."""
    findings = []
    for group in duplicate_groups(entries):
        if _names_other_cache_paths(group):
            continue  # one cause, one finding: see _relocated
        module = group[0].module or "(unnamed)"
        identical = len({e.executable_digest for e in group}) == 1
        how = "identical executables" if identical else "the same program (modulo volatile fields)"
        keys = tuple(e.key for e in group)
        evidence = unstable_key_evidence(group)
        if evidence is not None:
            findings.append(
                Finding(
                    kind=FindingKind.UNSTABLE_KEY,
                    severity=Severity.WARNING,
                    module=module,
                    entries=keys,
                    message=(
                        f"{module}: {len(group)} entries hold {how} under different keys, and "
                        "a key input changes from run to run"
                    ),
                    advice=(
                        "the key is not stable across runs, so every run recompiles; run "
                        f"`cachedoctor diff --module {module}` to see why, "
                        "`cachedoctor enable` to fix"
                    ),
                    evidence=evidence,
                )
            )
            continue
        findings.append(
            Finding(
                kind=FindingKind.SAME_PROGRAM,
                severity=Severity.INFO,
                module=module,
                entries=keys,
                message=f"{module}: the same program under {len(group)} keys",
                advice=(
                    "usually harmless: JAX hashes the module before optimisation, so inputs "
                    "that optimise to one program (a result name, a no-op convert, a static "
                    "argument) get keys of their own, each hit run after run; "
                    f"`cachedoctor diff --module {module}` shows what differs"
                ),
                evidence=(
                    f"{how} (program digest); nothing stored shows a key input that changes "
                    "between runs, so this is not evidence of an unstable key"
                ),
            )
        )
    return findings


def _same_dir(path_in_entry: str, root: str) -> bool:
    parent = os.path.normpath(os.path.dirname(path_in_entry.rstrip("/")))
    return parent in _root_spellings(root)


@functools.lru_cache(maxsize=8)
def _root_spellings(root: str) -> frozenset[str]:
    """The ways an entry may name ``root``: as given, or made absolute.

    Not its real path: JAX hashes the path as spelled, so a cache reached through a symbolic
    link gets other keys than the same files reached directly (JAX misses there). For a bucket,
    its sub-caches live at a local path (`enable`), which counts as ``root`` too.
    """
    from cachedoctor.storage.urls import subcache_dir_for

    spellings = {os.path.normpath(root), os.path.abspath(root)}
    local = subcache_dir_for(root)
    if local is not None:
        spellings.add(os.path.normpath(local))
    return frozenset(spellings)


def stable_hasher_keys(manifests: Iterable[Mapping[str, object] | None]) -> frozenset[str]:
    """Keys of entries stored under cachedoctor's stable hasher, from their manifests.

    The stable hasher makes cache-dir paths relative before hashing (``stablekeys.keys``), so
    such an entry hits wherever the cache is: its stored paths are not evidence of a move.
    """
    return frozenset(
        str(m["key"])
        for m in manifests
        if m is not None and m.get("mode") == "stable" and isinstance(m.get("key"), str)
    )


def key_modes_by_entry(
    manifests: Iterable[Mapping[str, object] | None],
) -> dict[str, tuple[str, str]]:
    """Entry key -> (key mode, why), from the manifests (``key_mode_reason`` says why)."""
    from cachedoctor.stablekeys.manifest import Manifest, key_mode_reason

    modes = {}
    for m in manifests:
        if m is None or not isinstance(m.get("key"), str):
            continue
        try:
            found = Manifest.from_dict(dict(m))
            modes[found.key] = (found.key_mode, key_mode_reason(found))
        except (TypeError, ValueError, KeyError, AttributeError):
            continue  # a manifest of another schema: no key mode to show
    return modes


def _count_modes(modes: Iterable[tuple[str, str]]) -> tuple[KeyModeUse, ...]:
    counted = Counter(modes)
    return tuple(KeyModeUse(mode, reason, n) for (mode, reason), n in sorted(counted.items()))


def _read_manifests(listing: CacheListing, root: str) -> list[Mapping[str, object]]:
    """The cache's key manifests as JSON data; none are read when it has no manifests folder."""
    from cachedoctor.stablekeys import manifest

    if not any(i.name == layout.MANIFEST_DIRNAME for i in listing.items):
        return []
    try:
        return [m.to_dict() for m in manifest.iter_manifests(root)]
    except OSError:
        return []


def _not_stored(
    listing: CacheListing, manifests: Sequence[Mapping[str, object] | None]
) -> list[Finding]:
    """Modules whose key manifest has no entry beside it: JAX compiled them, holds nothing.

    JAX refuses to write modules that use host callbacks (pure_callback, io_callback,
    jax.debug.print, equinox's runtime checks in diffrax), and ones below its minimum compile
    time or entry size; such a module recompiles on every run.
    """
    entry_keys = {i.key for i in listing.entries}
    missing: dict[str, list[str]] = defaultdict(list)
    for m in manifests:
        if m is None or not isinstance(m.get("key"), str) or m["key"] in entry_keys:
            continue
        missing[str(m.get("module_name") or "(unnamed)")].append(str(m["key"]))
    if not missing:
        return []
    return [
        Finding(
            kind=FindingKind.NOT_STORED,
            severity=Severity.INFO,
            entries=tuple(k for keys in missing.values() for k in keys),
            message=(
                f"{len(missing)} modules were compiled with this cache but have no entry: "
                + ", ".join(sorted(missing))
            ),
            advice=(
                "JAX never stores modules with host callbacks (pure_callback, io_callback, "
                "jax.debug.print, equinox checks) nor ones under its minimum compile time or "
                "entry size, so they recompile every run; `cachedoctor check -- CMD` names "
                "which (JAX_EXPLAIN_CACHE_MISSES=1 logs it)"
            ),
            evidence="key manifests (cachedoctor enable) without an entry of the same key",
        )
    ]


def _relocated(
    root: str, entries: list[EntryInfo], jax_info: JaxInfo, stable_keys: frozenset[str]
) -> list[Finding]:
    checks = (
        ("autotune_dir", "xla_gpu_per_fusion_autotune_cache_dir", jax_info.hashes_autotune_dir),
        ("kernel_cache_file", "xla_gpu_kernel_cache_file", jax_info.hashes_kernel_cache_file),
    )
    moved: dict[str, list[tuple[EntryInfo, str]]] = defaultdict(list)
    elsewhere_by_path: dict[str, bool] = {}  # entries name few distinct paths: judge each once
    for e in entries:
        if e.key in stable_keys:
            continue  # its key hashes the paths relative to the cache: see stable_hasher_keys
        for attr, option, hashed in checks:
            value = getattr(e, attr)
            if not value or hashed is False:
                continue
            other_dir = elsewhere_by_path.get(value)
            if other_dir is None:
                # a relative path (JAX_COMPILATION_CACHE_DIR=.jax_cache) is hashed as written:
                # JAX hits it from any working directory where it names this cache
                other_dir = os.path.isabs(value) and not _same_dir(value, root)
                elsewhere_by_path[value] = other_dir
            if other_dir:
                moved[option].append((e, value))
    findings = []
    for option, pairs in moved.items():
        hashed = dict((c[1], c[2]) for c in checks)[option]
        elsewhere = sorted({os.path.dirname(v.rstrip("/")) for _, v in pairs})
        certainty = "will never" if hashed else "may never"
        modules = len({e.module for e, _ in pairs})
        findings.append(
            Finding(
                kind=FindingKind.RELOCATED,
                severity=Severity.WARNING,
                entries=tuple(e.key for e, _ in pairs),
                message=(
                    f"{len(pairs)} entries ({modules} modules) were written for a cache at "
                    f"{', '.join(elsewhere)}; their keys hash {option} and JAX "
                    f"{jax_info.jax_version or '?'} {certainty} hit them in {root}"
                ),
                advice=(
                    f"run JAX with JAX_COMPILATION_CACHE_DIR={elsewhere[0]} (the path as spelled "
                    "then) to use them, or let JAX recompile and free the space with "
                    "`cachedoctor prune --relocated --apply`; entries recorded with the hook in "
                    "observe mode (a key manifest each) can instead move to their stable key, "
                    "which does not hash the cache's path: `cachedoctor rekey --relocated "
                    "--apply`, then `cachedoctor enable`; `cachedoctor enable` makes new "
                    "entries independent of the cache's path"
                ),
                evidence=(
                    f"compile options stored in each entry name {option} under "
                    f"{', '.join(elsewhere)}; "
                    + (
                        f"JAX {jax_info.jax_version} hashes that option into the key"
                        if hashed
                        else "whether this JAX hashes that option is unknown"
                    )
                    + "; no stable-key manifest (cachedoctor enable) covers these keys"
                ),
            )
        )
    return findings


def _atime_findings(listing: CacheListing) -> list[Finding]:
    entry_keys = {i.key for i in listing.entries}
    atime_keys = {i.key for i in listing.of_kind(FileKind.ATIME)}
    findings = []
    if atime_keys:
        missing = sorted(k for k in entry_keys - atime_keys if k)
        # JAX's LRU cache takes <dir>/.lockfile around every get/put: the evidence that eviction
        # runs here. -atime files without it may be strays (a copy, an old run).
        locked = any(i.kind is FileKind.LOCKFILE for i in listing.items)
        if missing and locked:
            findings.append(
                Finding(
                    kind=FindingKind.MISSING_ATIME,
                    severity=Severity.ERROR,
                    entries=tuple(missing),
                    message=(
                        f"{count(len(missing), 'entry has', 'entries have')} no "
                        "-atime file while LRU eviction is in use (.lockfile present); "
                        "JAX's eviction pass fails on them and stops all cache writes"
                    ),
                    evidence="the listing: -cache files without -atime, and JAX's .lockfile",
                    advice="run `cachedoctor prune --repair --apply` to recreate the -atime files",
                )
            )
        elif missing:
            n = len(atime_keys)
            findings.append(
                Finding(
                    kind=FindingKind.MISSING_ATIME,
                    severity=Severity.WARNING,
                    entries=tuple(missing),
                    message=(
                        f"{count(len(missing), 'entry has', 'entries have')} no "
                        f"-atime file, {count(n, 'entry has', 'entries have')} one and "
                        "there is no .lockfile: LRU eviction does not seem to run here, but "
                        "turning it on (a max size) would fail on these entries"
                    ),
                    advice="run `cachedoctor prune --repair --apply` to recreate the -atime files",
                    evidence="the listing: -atime files beside other entries, none beside these",
                )
            )
    orphans = sorted(k for k in atime_keys - entry_keys if k)
    if orphans:
        findings.append(
            Finding(
                kind=FindingKind.ORPHAN,
                severity=Severity.INFO,
                entries=tuple(f"{k}{layout.ATIME_SUFFIX}" for k in orphans),
                message=f"{count(len(orphans), '-atime file has', '-atime files have')} no entry",
                evidence="the directory listing: no -cache file of the same key",
                advice="harmless; `cachedoctor prune --orphans --apply` removes them",
            )
        )
    temps = listing.of_kind(FileKind.TEMP)
    if temps:
        findings.append(
            Finding(
                kind=FindingKind.ORPHAN,
                severity=Severity.INFO,
                entries=tuple(i.name for i in temps),
                message=f"{count(len(temps), 'leftover temporary file')}",
                evidence="the directory listing: temporary file names of JAX's writers",
                advice="left by interrupted writers; `cachedoctor prune --orphans --apply`",
            )
        )
    return findings


# Problems that mean the bytes are damaged. "unreadable" (permissions) and "too-large" (over the
# decode cap) say nothing about the bytes: such an entry is reported unreadable, never corrupt.
DAMAGE = frozenset({"truncated", "decompress", "not-compressed", "header", "protobuf"})


def _real_problems(e: EntryInfo) -> list[model.Problem]:
    """Problems that make an entry unusable (a symlink or an unsupported layout is not damage)."""
    return [p for p in e.problems if p.kind not in ("symlink", "unsupported")]


def judged_by_age_until(entry: EntryInfo, now: float) -> float | None:
    """Until when ``entry`` counts as a write in progress: a truncated file written less than
    ``RECENT_WRITE_S`` ago (JAX writes entries in place); None when its verdict is final."""
    real = _real_problems(entry)
    if not real or real[0].kind != "truncated":
        return None
    until = entry.mtime_ns / 1e9 + RECENT_WRITE_S
    return until if now < until else None


def _corrupt(entries: list[EntryInfo], now: float) -> list[Finding]:
    findings = []
    for e in entries:
        real = _real_problems(e)
        if not real:
            continue
        if real[0].kind not in DAMAGE:
            findings.append(
                Finding(
                    kind=FindingKind.UNREADABLE,
                    severity=Severity.WARNING,
                    module=e.module,
                    entries=(e.key,),
                    message=f"{e.key}: not checked: {real[0].kind}: {real[0].message}",
                    evidence=f"the reader could not read the bytes ({real[0].kind})",
                    advice=(
                        "cachedoctor could not read its bytes, so it says nothing about them and "
                        "never removes it; fix its permissions (or owner) to have it checked"
                    ),
                )
            )
            continue
        young = judged_by_age_until(e, now) is not None
        findings.append(
            Finding(
                kind=FindingKind.CORRUPT,
                severity=Severity.WARNING if young else Severity.ERROR,
                module=e.module,
                entries=(e.key,),
                message=f"{e.key}: {real[0].message}"
                + (" (written under a minute ago: may be a write in progress)" if young else ""),
                advice=(
                    "JAX fails to load this entry and recompiles; "
                    "`cachedoctor prune --corrupt --apply` removes it"
                ),
                evidence=f"decoding the file: {real[0].kind}",
            )
        )
    return findings


def _insecure(listing: CacheListing) -> list[Finding]:
    if listing.remote:
        return []  # a bucket has no modes or owners; who may write it is IAM's business
    findings = []
    me = os.getuid()
    if listing.root_mode & (stat.S_IWGRP | stat.S_IWOTH) and not listing.root_mode & stat.S_ISVTX:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.ERROR,
                entries=(listing.root,),
                message=f"the cache directory is writable by {_who(listing.root_mode)}",
                evidence=f"the directory's mode {stat.filemode(listing.root_mode)}",
                advice=(
                    "whoever can write the cache can run code in your JAX processes; "
                    f"`chmod go-w {listing.root}`"
                ),
            )
        )
    if listing.root_uid != me:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.ERROR,
                entries=(listing.root,),
                message=f"the cache directory is owned by uid {listing.root_uid}, not you ({me})",
                evidence="the directory's owner (lstat)",
                advice="use a cache directory you own, or make sure its owner is trusted",
            )
        )
    writable = [
        i.name
        for i in listing.items
        if not i.is_symlink and i.kind is FileKind.ENTRY and i.mode & (stat.S_IWGRP | stat.S_IWOTH)
    ]
    if writable:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.ERROR,
                entries=tuple(writable),
                message=count(len(writable), "entry is", "entries are")
                + " writable by group or others",
                evidence="the entries' modes (lstat)",
                advice="`cachedoctor prune --repair --apply` removes group/other write bits",
            )
        )
    foreign = [i.name for i in listing.items if i.kind is FileKind.ENTRY and i.uid != me]
    if foreign:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.ERROR,
                entries=tuple(foreign),
                message=f"{count(len(foreign), 'entry is', 'entries are')} owned by another user",
                evidence="the entries' owners (lstat)",
                advice="another user's entries run in your process: remove them or trust that user",
            )
        )
    links = [i.name for i in listing.items if i.is_symlink]
    if links:
        findings.append(
            Finding(
                kind=FindingKind.INSECURE,
                severity=Severity.WARNING,
                entries=tuple(links),
                message=count(len(links), "symbolic link")
                + " in the cache directory (not followed)",
                evidence="the directory listing (lstat)",
                advice="a link can make JAX load or overwrite a file outside the cache; remove it",
            )
        )
    return findings


def _who(mode: int) -> str:
    return " and ".join(
        w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit
    )


def _mixtures(entries: list[EntryInfo]) -> list[Finding]:
    findings = []
    ok = [e for e in entries if e.ok]
    formats = Counter(e.format_label for e in ok)
    if len(formats) > 1:
        findings.append(
            Finding(
                kind=FindingKind.MIXED_VERSIONS,
                severity=Severity.INFO,
                message="entries in several JAX formats: "
                + ", ".join(f"{n}× {f}" for f, n in formats.most_common()),
                evidence="each entry's payload layout (decoded)",
                advice=(
                    "entries from other JAX versions never hit after an upgrade; "
                    "`cachedoctor prune --stale-jax` lists them"
                ),
                entries=tuple(e.key for e in ok if e.format_label != formats.most_common(1)[0][0]),
            )
        )
    platforms = Counter(e.platform for e in ok)
    if len(platforms) > 1:
        findings.append(
            Finding(
                kind=FindingKind.MIXED_PLATFORMS,
                severity=Severity.INFO,
                message="entries for several platforms: "
                + ", ".join(f"{n}× {p}" for p, n in platforms.most_common()),
                evidence="each entry's executable (decoded)",
                advice="fine for a shared cache; size budgets count all of them",
            )
        )
    return findings


def _unknown(listing: CacheListing) -> list[Finding]:
    unknown = [i.name for i in listing.of_kind(FileKind.UNKNOWN)]
    if not unknown:
        return []
    return [
        Finding(
            kind=FindingKind.UNKNOWN_FILE,
            severity=Severity.INFO,
            entries=tuple(unknown),
            message=count(len(unknown), "file that is", "files that are")
            + " not part of a JAX cache",
            evidence="the directory listing: names JAX never writes",
            advice="cachedoctor never touches them; move them out if they do not belong here",
        )
    ]
