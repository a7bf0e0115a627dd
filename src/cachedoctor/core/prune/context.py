"""What ``prune``'s rules share: the :class:`PruneContext` (listing, manifests, options,
clock, usage records) and each entry as a :class:`PlannedEntry` with what records say of its use.

:func:`cachedoctor.core.prune.planner.plan_prune` makes the context, collects the entries,
decodes them when a rule needs scan's findings, and turns marked entries into removals; the rules
(``rules.py``) mark entries and plan the other files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cachedoctor.cache import listdir, reader
from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.listdir import DirItem, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.prune.actions import (
    Action,
    ManifestFile,
    Op,
    Selector,
    Skip,
    read_manifests,
)
from cachedoctor.core.scan.build import build_report
from cachedoctor.core.scan.report import (
    ProgressCallback,
    ScanReport,
    lru_evidence,
)
from cachedoctor.core.usage import records
from cachedoctor.core.usage.lookups import EntryUse, entry_use
from cachedoctor.core.usage.model import Record
from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX, STATS_DIRNAME
from cachedoctor.stablekeys.manifest import Manifest
from cachedoctor.storage import mounts
from cachedoctor.storage.fileid import FileId, Stat
from cachedoctor.storage.fsops import Folder

if TYPE_CHECKING:
    from cachedoctor.core.prune.options import PruneOptions
    from cachedoctor.storage.location import Location
    from cachedoctor.storage.stores import Store

ORPHAN_ATIME_GRACE_S = 60  # an -atime may briefly precede its entry (the hook's re-keying)
# First jaxlib whose entries carry the pjrt_ifrt header (docs/format.md).
IFRT_HEADER_SINCE = (0, 9, 1)

# Rules whose verdict depends on when the entry was last used: a use since the plan cancels it.
_USE_SENSITIVE = {Selector.OLDER_THAN, Selector.MAX_SIZE, Selector.DUPLICATES}


@dataclass
class PlannedEntry:
    """Everything the planner knows about one key."""

    key: str
    item: DirItem
    cache_id: FileId
    atime_item: DirItem | None = None
    atime_id: FileId | None = None
    last_used_ns: int = 0
    used_from_atime: bool = False
    info: EntryInfo | None = None
    manifest: ManifestFile | None = None
    ir_size: int = 0
    rules: list[tuple[Selector, str]] = field(default_factory=list)
    use: EntryUse | None = None  # what JAX's records say of its use (core/usage/lookups)
    accessed_ns: int | None = None  # st_atime where the mount keeps it and it is evidence
    nlink: int = 1  # the -cache file's names on its filesystem (the hook adopts by hard link)

    @property
    def module(self) -> str | None:
        parsed = listdir.parse_key(self.key)
        return parsed[1] if parsed else None

    @property
    def unit_bytes(self) -> int:
        return (
            self.item.size
            + (self.atime_item.size if self.atime_item else 0)
            + (self.manifest.size if self.manifest else 0)
            + self.ir_size
        )


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def expected_format(jaxlib_version: str | None) -> str | None:
    """The payload layout the installed jaxlib writes: "ifrt" (>= 0.9.1), "pjrt", or None."""
    v = _version_tuple(jaxlib_version)
    if v is None:
        return None
    return "ifrt" if v >= IFRT_HEADER_SINCE else "pjrt"


BUCKET_NOTE = (
    "a bucket has no locks: each object is deleted only if its generation/ETag is still the one "
    "this plan saw (a conditional delete), so an object rewritten after the plan is kept and "
    "reported"
)


def _key_index(store: Store) -> records.KeyIndex:
    """The stats records' per-key counts (``cachedoctor-stats/``); a record that is not sound is
    left out (``stats`` and ``lint`` report it), an unreadable folder gives none."""
    try:
        found = records.read_evidence(store)  # archived by `stats --zero` too: the same history
    except (OSError, ValueError):
        return {}
    return records.index_keys(found)


class PruneContext:
    """What every rule reads (the listing, manifests, options, clock, JAX) and what it adds to
    the plan (actions, skips, notes)."""

    def __init__(
        self,
        cd: Folder,
        options: PruneOptions,
        now: float,
        jax_info: JaxInfo,
        where: Location,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.cd = cd
        self.where = where  # the directory as the user spelled it (cd.path is real)
        self.progress = progress
        self.options = options
        self.now = now
        self.jax = jax_info
        self.actions: list[Action] = []
        self.skipped: list[Skip] = []
        self.notes: list[str] = []
        if cd.is_remote:
            self.listing = listdir.list_cache(where.store())
            cd.remember(
                (i.name, i.size, i.mtime_ns, i.version, i.is_dir) for i in self.listing.items
            )
            self.notes.append(BUCKET_NOTE)
        else:
            self.listing = listdir.list_cache(cd.path)
        self.manifests, self.manifest_others = read_manifests(cd)
        lru = lru_evidence(self.listing)  # as scan judges it
        self.eviction_in_use = lru.in_use
        self.lru_lockfile = lru.lockfile
        # access times are evidence only where the mount keeps them (None on a bucket)
        self.mount = None if cd.is_remote else mounts.mount_of(cd.path)
        # the stats records' per-key counts, read once, and only for the selectors that weigh
        # use (a bucket pays a listing and a GET per record for them)
        weighs_use = options.duplicates or options.older_than_s is not None
        weighs_use = weighs_use or options.max_size is not None
        weighs_use = weighs_use or options.stale_jax or options.relocated
        # (a folder's store by its real path, as ``cd`` reads it; a bucket's is ``cd``'s own)
        self.key_index = _key_index(where.resolved().store()) if weighs_use else {}

    def read_atime(self, name: str) -> int | None:
        if not self.cd.is_remote:
            return listdir.read_atime(os.path.join(self.cd.path, name))
        data = self.cd.read_small(name, 9)  # the reader's layout: 8 bytes, little-endian ns
        return int.from_bytes(data, "little") if data is not None and len(data) == 8 else None

    def age_s(self, mtime_ns: int) -> float:
        return self.now - mtime_ns / 1e9

    def remove_file(
        self, item_name: str, st: Stat, rule: Selector, reason: str, folder: str = ""
    ) -> None:
        self.actions.append(
            Action(
                op=Op.REMOVE_FILE,
                name=os.path.join(folder, item_name) if folder else item_name,
                rules=(rule,),
                reason=reason,
                bytes=st.st_size,
                files=(FileId.of(item_name, st),),
                folder=folder,
            )
        )

    def manifest_data(self) -> list[dict[str, object] | None]:
        return [m.data for m in self.manifests if not m.is_symlink]


@dataclass
class PlanState:
    """What a rule hands the rules after it (``rules.RULES``): the entries in scope (``--module``
    narrows them), scan's report once they are decoded, the order ``--max-size`` evicts in, and
    the keys planned for removal."""

    entries: dict[str, PlannedEntry]
    report: ScanReport | None = None
    removed: set[str] = field(default_factory=set)
    # --max-size's evictions in its order: each file's keys (a hard-linked file has several)
    evicted: list[tuple[str, ...]] = field(default_factory=list)


# --- entries and the rules that mark them -------------------------------------------------------


def collect_entries(ctx: PruneContext) -> dict[str, PlannedEntry]:
    """Every regular ``-cache`` file with its ``-atime`` (the last use JAX records, else the
    file time), manifest and module text; entry links are skipped, never followed."""
    atimes = {i.key: i for i in ctx.listing.of_kind(FileKind.ATIME) if i.key}
    manifests = {m.key: m for m in ctx.manifests}
    irs = {}
    folder = ctx.cd.subdir(MANIFEST_DIRNAME)
    if folder is not None:
        with folder:
            for key in manifests:
                st = folder.regular(key + MANIFEST_IR_SUFFIX)
                if st is not None:
                    irs[key] = st.st_size
    out: dict[str, PlannedEntry] = {}
    for item in ctx.listing.entries:
        assert item.key is not None
        if item.is_symlink:
            ctx.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
            continue
        st = ctx.cd.regular(item.name)
        if st is None:
            continue  # vanished (JAX's eviction) or not a regular file
        e = PlannedEntry(item.key, item, FileId.of(item.name, st), last_used_ns=st.st_mtime_ns)
        e.nlink = max(1, getattr(st, "st_nlink", 1))
        atime = atimes.get(item.key)
        if atime is not None and not atime.is_symlink:
            ast = ctx.cd.regular(atime.name)
            if ast is not None:
                e.atime_item = atime
                e.atime_id = FileId.of(atime.name, ast)
                value = ctx.read_atime(atime.name)
                if value is not None:
                    e.last_used_ns, e.used_from_atime = value, True
        m = manifests.get(item.key)
        if m is not None and not m.is_symlink:
            e.manifest = m
            e.ir_size = irs.get(item.key, 0)
        e.use = _use_of(ctx, e, st)
        if not e.used_from_atime and e.use.last_use_ns is not None:  # JAX's -atime first
            e.last_used_ns = e.use.last_use_ns
        out[item.key] = e
    return out


def _use_of(ctx: PruneContext, e: PlannedEntry, st: Stat) -> EntryUse:
    """The entry's use from its -atime, its access time, its manifest and the stats records'
    hits of its key (by processes that ended after its write). Access times count
    only where cachedoctor's own reads leave them alone (O_NOATIME: root or the file's owner)."""
    accessed = getattr(st, "st_atime_ns", None)
    if accessed is not None and os.geteuid() not in (0, st.st_uid):
        accessed = None
    if ctx.mount is not None and ctx.mount.tells_reads:
        e.accessed_ns = accessed
    data = e.manifest.data if e.manifest is not None else None
    manifest = None
    if data is not None:
        with contextlib.suppress(TypeError, ValueError):
            manifest = Manifest.from_dict(data)
    return entry_use(
        e.key,
        written_ns=st.st_mtime_ns,
        accessed_ns=accessed,
        lru_atime_ns=e.last_used_ns if e.used_from_atime else None,
        mount=ctx.mount,
        manifest=manifest,
        now_ns=int(ctx.now * 1e9),
        lru_in_use=ctx.lru_lockfile,
        recorded=records.key_use(ctx.key_index, e.key, ended_after=st.st_mtime_ns / 1e9),
    )


def decode_for_rules(ctx: PruneContext, entries: dict[str, PlannedEntry]) -> ScanReport:
    """Decode entries and build scan's report, so rules reuse scan's findings verbatim (only
    for the rules that need it: ``rules.PruneRule.decodes``)."""
    infos: list[EntryInfo] = []
    if ctx.cd.is_remote:  # concurrent ranged reads, the same decoder
        decoded = reader.decode_store_entries(
            ctx.where.store(), [e.item for e in entries.values()], progress=ctx.progress
        )
        for e, done in zip(entries.values(), decoded, strict=True):
            e.info = done
            infos.append(done)
    else:
        for n, e in enumerate(entries.values(), 1):
            info = reader.decode_entry(ctx.cd.path + os.sep + e.item.name, key=e.key)
            assert isinstance(info, EntryInfo)
            e.info = info
            infos.append(info)
            if ctx.progress is not None:
                ctx.progress(n, len(entries))
    return build_report(
        ctx.listing,
        infos,
        ctx.jax,
        ctx.now,
        manifests=ctx.manifest_data(),
        root_as_given=ctx.options.jobs_cache_dir or ctx.where.spelling,
        evidence_records=_evidence_records(ctx),  # scan's `corrupt` by JAX's failed loads
    )


def _evidence_records(ctx: PruneContext) -> list[Record]:
    """The stats records and archives, as scan reads them for JAX's failed loads; none on a
    bucket (no file identity to hold a failure to) or when the folder cannot be read."""
    if ctx.cd.is_remote or not any(i.name == STATS_DIRNAME for i in ctx.listing.items):
        return []
    try:
        return records.read_evidence(ctx.where.resolved().store())
    except (OSError, ValueError):
        return []


def file_units(entries: list[PlannedEntry]) -> list[list[PlannedEntry]]:
    """The entries grouped by the file they name: a hard-linked ``-cache`` file (the stable
    hook adopts a plain entry by a link) is one file under several keys, its bytes counted
    once (a bucket's objects, inode 0, are each their own)."""
    units: dict[int, list[PlannedEntry]] = {}
    alone: list[list[PlannedEntry]] = []
    for e in entries:
        if e.cache_id.ino and e.nlink > 1:
            units.setdefault(e.cache_id.ino, []).append(e)
        else:
            alone.append([e])
    return alone + list(units.values())


def remove_entries(marked: list[PlannedEntry]) -> list[Action]:
    """The removals of the marked entries; a hard-linked file's bytes count once, and only
    when every name it has goes (else removing a name frees nothing)."""
    actions = []
    for unit in file_units(marked):
        frees = len(unit) >= unit[0].nlink
        actions += [remove_entry(e, frees and n == 0) for n, e in enumerate(unit)]
    return actions


def remove_entry(e: PlannedEntry, frees_file: bool = True) -> Action:
    """The removal of a marked entry; its -atime goes too when a use since the plan would
    cancel the verdict (apply then compares it). ``frees_file``: the -cache file's bytes come
    back (not for a hard link whose file keeps another name)."""
    files = [e.cache_id]
    sensitive = any(r in _USE_SENSITIVE for r, _ in e.rules)
    if sensitive and e.accessed_ns is not None:  # a read since the plan cancels the removal
        files[0] = dataclasses.replace(e.cache_id, atime_ns=e.accessed_ns)
    if e.atime_id is not None and sensitive:
        files.append(e.atime_id)
    return Action(
        op=Op.REMOVE_ENTRY,
        name=e.key,
        rules=tuple(r for r, _ in e.rules),
        reason="; ".join(reason for _, reason in e.rules),
        bytes=e.unit_bytes - (0 if frees_file else e.item.size),
        module=e.module,
        last_used_ns=last_use(e)[0] if recorded_use(e) else None,  # never the file time
        files=tuple(files),
    )


def recorded_use(e: PlannedEntry) -> bool:
    return e.used_from_atime or (e.use is not None and e.use.last_use_ns is not None)


def latest_use(e: PlannedEntry) -> tuple[int | None, str]:
    """The latest moment the entry's last use can be, by every record together, and how that
    is known; (None, why not) when no record can tell (then the entry is kept)."""
    use = e.use
    if use is None or use.latest_use_ns is None:
        evidence = use.evidence if use is not None else "no record"
        return None, (
            f"cannot tell when it was last used ({evidence}); what would tell it: JAX's LRU "
            "(-atime files, jax_compilation_cache_max_size), a local relatime or strictatime "
            "mount, or cachedoctor's stats records (CACHEDOCTOR_HOOK=stats)"
        )
    return use.latest_use_ns, use.latest_use_why


def last_use(e: PlannedEntry) -> tuple[int, str]:
    """The latest use any record shows (JAX's -atime, a read's access time), else the file
    time, and which it is."""
    if e.use is not None and e.use.last_use_ns is not None and e.use.last_use_source:
        return e.use.last_use_ns, e.use.last_use_source
    if e.used_from_atime:
        return e.last_used_ns, "-atime"
    if e.use is not None and e.use.read_since_written is False:
        return e.last_used_ns, "its write: not read since"
    return e.last_used_ns, "file time: no record of a use"
