"""``prune``'s rules, one function each, over a shared :class:`PruneContext`.

:func:`cachedoctor.core.prune.planner.plan_prune` runs them in order: collect the entries, decode
them when a rule needs scan's findings, mark entries (each rule appends its rule and reason to
``PlannedEntry.rules``), then plan the other files. Rules only read the cache; they add actions,
skips and notes to the context.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cachedoctor import layout
from cachedoctor.cache import listdir, reader
from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.listdir import DirItem, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.findings import FindingKind, Severity
from cachedoctor.core.prune.actions import (
    WRITE_BITS,
    Action,
    Dir,
    ManifestFile,
    Op,
    Rule,
    Skip,
    read_manifests,
)
from cachedoctor.core.scan.build import build_report, tree_size
from cachedoctor.core.scan.report import (
    ProgressCallback,
    ScanReport,
    lru_evidence,
    real_problems,
)
from cachedoctor.core.scan.rules.keys import unstable_groups
from cachedoctor.core.usage import records
from cachedoctor.core.usage.lookups import EntryUse, entry_use
from cachedoctor.errors import count
from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX
from cachedoctor.stablekeys.manifest import Manifest
from cachedoctor.storage import fsops, mounts
from cachedoctor.storage.fsops import FileId, Stat, StoreDir
from cachedoctor.storage.stores import open_store
from cachedoctor.units import format_age, format_bytes
from cachedoctor.xla import subcaches

if TYPE_CHECKING:
    from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.layout import STATS_DIRNAME

ORPHAN_ATIME_GRACE_S = 60  # an -atime may briefly precede its entry (the hook's re-keying)
# First jaxlib whose entries carry the pjrt_ifrt header (docs/format.md).
IFRT_HEADER_SINCE = (0, 9, 1)

# Rules whose verdict depends on when the entry was last used: a use since the plan cancels it.
_USE_SENSITIVE = {Rule.OLDER_THAN, Rule.MAX_SIZE, Rule.DUPLICATES}


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
    rules: list[tuple[Rule, str]] = field(default_factory=list)
    use: EntryUse | None = None  # what JAX's records say of its use (core/usage/lookups)

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


def _key_index(cd: Dir) -> records.KeyIndex:
    """The stats records' per-key counts (``cachedoctor-stats/``); a record that is not sound is
    left out (``stats`` and ``lint`` report it), an unreadable folder gives none."""
    try:
        store = cd.store if isinstance(cd, StoreDir) and not cd.rel else open_store(cd.path)
        found, _problems = records.read_records(store)
    except (OSError, ValueError):
        return {}
    return records.index_keys(found)


class PruneContext:
    """What every rule reads (the listing, manifests, options, clock, JAX) and what it adds to
    the plan (actions, skips, notes)."""

    def __init__(
        self,
        cd: Dir,
        options: PruneOptions,
        now: float,
        jax_info: JaxInfo,
        as_given: str,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.cd = cd
        self.as_given = as_given  # the user's spelling of the directory (cd.path is real)
        self.progress = progress
        self.options = options
        self.now = now
        self.jax = jax_info
        self.actions: list[Action] = []
        self.skipped: list[Skip] = []
        self.notes: list[str] = []
        if isinstance(cd, StoreDir):
            self.listing = listdir.list_cache(cd.store)
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
        self.key_index = _key_index(cd)  # the stats records' per-key counts, read once

    def read_atime(self, name: str) -> int | None:
        if not isinstance(self.cd, StoreDir):
            return listdir.read_atime(os.path.join(self.cd.path, name))
        data = self.cd.read_small(name, 9)  # the reader's layout: 8 bytes, little-endian ns
        return int.from_bytes(data, "little") if data is not None and len(data) == 8 else None

    def age_s(self, mtime_ns: int) -> float:
        return self.now - mtime_ns / 1e9

    def remove_file(
        self, item_name: str, st: Stat, rule: Rule, reason: str, folder: str = ""
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


def decode_for_rules(ctx: PruneContext, entries: dict[str, PlannedEntry]) -> ScanReport | None:
    """Decode entries and build scan's report, so rules reuse scan's findings verbatim.

    Only ``--corrupt``, ``--relocated``, ``--stale-jax`` and ``--duplicates`` need it."""
    o = ctx.options
    if not (o.duplicates or o.corrupt or o.relocated or o.stale_jax):
        return None
    infos: list[EntryInfo] = []
    if isinstance(ctx.cd, StoreDir):  # concurrent ranged reads, the same decoder
        decoded = reader.decode_store_entries(
            ctx.cd.store, [e.item for e in entries.values()], progress=ctx.progress
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
        root_as_given=ctx.as_given,
    )


def remove_entry(e: PlannedEntry) -> Action:
    """The removal of a marked entry; its -atime goes too when a use since the plan would
    cancel the verdict (apply then compares it)."""
    files = [e.cache_id]
    if e.atime_id is not None and any(r in _USE_SENSITIVE for r, _ in e.rules):
        files.append(e.atime_id)
    return Action(
        op=Op.REMOVE_ENTRY,
        name=e.key,
        rules=tuple(r for r, _ in e.rules),
        reason="; ".join(reason for _, reason in e.rules),
        bytes=e.unit_bytes,
        module=e.module,
        last_used_ns=_last_use(e)[0] if _recorded_use(e) else None,  # never the file time
        files=tuple(files),
    )


def rule_corrupt(ctx: PruneContext, entries: dict[str, PlannedEntry], report: ScanReport) -> None:
    """``--corrupt``: exactly scan's ``corrupt`` errors (the decoder's evidence); a truncation
    under a minute old and unreadable files are skipped, as scan says."""
    for f in report.findings:
        if f.kind is FindingKind.UNREADABLE:  # scan says the same: never removed
            ctx.skipped.extend(
                Skip(k, f.message.partition(": ")[2], Rule.CORRUPT)
                for k in f.entries
                if k in entries
            )
            continue
        if f.kind is not FindingKind.CORRUPT:
            continue
        for key in f.entries:
            if key not in entries:
                continue
            if f.severity < Severity.ERROR:  # scan's "may be a write in progress"
                ctx.skipped.append(
                    Skip(
                        key,
                        "truncated but written under a minute ago: may be a JAX write in progress",
                        Rule.CORRUPT,
                    )
                )
                continue
            problem = real_problems(entries[key].info)[0]  # type: ignore[arg-type]
            entries[key].rules.append((Rule.CORRUPT, f"{problem.kind}: {problem.message}"))


def rule_relocated(ctx: PruneContext, entries: dict[str, PlannedEntry], report: ScanReport) -> None:
    """``--relocated``: exactly scan's ``relocated`` finding (compile options naming a cache path
    other than the one JAX builds from the directory as spelled here, in an option JAX hashes,
    with no stable-key manifest)."""
    from cachedoctor.storage.urls import jax_spelling

    spelled = jax_spelling(ctx.as_given)
    found = [f for f in report.findings if f.kind is FindingKind.RELOCATED]
    if found:
        ctx.notes.append(
            f"--relocated is judged for the cache dir spelled {spelled}, as given: JAX hashes the "
            "spelling, not the directory, so if your runs spell it otherwise, plan with theirs"
        )
    for f in found:
        kernel = "xla_gpu_kernel_cache_file" in f.message  # the option this finding is about
        for key in f.entries:
            if key in entries:
                e = entries[key]
                where = (
                    (e.info.kernel_cache_file if kernel else e.info.autotune_dir) if e.info else ""
                )
                where_dir = os.path.dirname(where or "") or "."
                e.rules.append(
                    (
                        Rule.RELOCATED,
                        f"written for a cache spelled {where_dir}; JAX hashes the spelling, "
                        f"so it misses with the cache dir spelled {spelled}",
                    )
                )


def rule_stale_jax(ctx: PruneContext, entries: dict[str, PlannedEntry]) -> None:
    """``--stale-jax``: the jaxlib a manifest records, else the entry's payload layout, against
    the installed jaxlib."""
    installed = ctx.jax.jaxlib_version
    if installed is None:
        ctx.notes.append("--stale-jax: jaxlib is not installed here, so nothing is stale")
        return
    want = expected_format(installed)
    for e in entries.values():
        if e.manifest is not None and e.manifest.jaxlib:
            if e.manifest.jaxlib != installed:
                e.rules.append(
                    (
                        Rule.STALE_JAX,
                        f"manifest: written by jaxlib {e.manifest.jaxlib}, "
                        f"installed is {installed}",
                    )
                )
            continue
        info = e.info
        if info is None or any(p.kind != "unsupported" for p in info.problems):
            continue
        era = info.payload_format
        if want is not None and era is not None and era != want:
            e.rules.append(
                (
                    Rule.STALE_JAX,
                    f"format {info.format_label}: jaxlib {installed} writes {want} entries",
                )
            )
    ctx.notes.append(
        "--stale-jax decides from manifests (their jaxlib version) when present, else from the "
        "entry's layout (pjrt_ifrt header since jaxlib 0.9.1); entries of another jaxlib with "
        "the same layout are not detected without a manifest"
    )


def rule_older_than(
    ctx: PruneContext, entries: dict[str, PlannedEntry], older_than_s: float
) -> None:
    """``--older-than``: the last use a record shows (JAX's ``-atime``, or a read's access
    time), else the file time."""
    limit_ns = (ctx.now - older_than_s) * 1e9
    for e in entries.values():
        last, source = _last_use(e)
        if last < limit_ns:
            age = ctx.now - last / 1e9
            e.rules.append((Rule.OLDER_THAN, f"last used {format_age(age)} ago ({source})"))


def _recorded_use(e: PlannedEntry) -> bool:
    return e.used_from_atime or (e.use is not None and e.use.last_use_ns is not None)


def _last_use(e: PlannedEntry) -> tuple[int, str]:
    """The latest use any record shows (JAX's -atime, a read's access time), else the file
    time, and which it is."""
    if e.use is not None and e.use.last_use_ns is not None and e.use.last_use_source:
        return e.use.last_use_ns, e.use.last_use_source
    if e.used_from_atime:
        return e.last_used_ns, "-atime"
    return e.last_used_ns, "file time: no record of a use"


def rule_duplicates(ctx: PruneContext, entries: dict[str, PlannedEntry]) -> None:
    """``--duplicates``: in scan's unstable-key groups (the stored HLO shows a per-run key
    input), remove only the entries that records show no process will look up again; an entry
    with a record of use, or a stable-key manifest, is always kept (``core/usage/lookups``)."""
    infos = [e.info for e in entries.values() if e.info is not None]
    for group, _evidence in unstable_groups(infos):
        members = [entries[i.key] for i in group]
        removed = 0
        for m in members:
            why = _not_looked_up(m, members)
            if why is not None:
                if m.use is not None and m.use.read_since_written is False:
                    m.cache_id = dataclasses.replace(m.cache_id, unread=True)
                m.rules.append((Rule.DUPLICATES, why))
                removed += 1
        if not removed:
            module = members[0].module or "(unnamed)"
            uses = "; ".join(f"{m.key[-12:]}: {m.use.evidence}" for m in members if m.use)
            ctx.skipped.append(
                Skip(
                    module,
                    f"{len(members)} entries of one program kept: cannot tell which key runs "
                    f"use ({uses})",
                    Rule.DUPLICATES,
                )
            )
    ctx.notes.append(
        "--duplicates removes a copy of a program whose key changes between runs only on a "
        "record that no run looks it up again: its manifest shows a pointer in the key, it was "
        "never read while a later run wrote another key, or it has no manifest beside the "
        "stable key hooked runs look up; a copy with a record of use (-atime, access time, a "
        "hit in a stats record) or a stable-key manifest is kept"
    )


def _not_looked_up(m: PlannedEntry, group: list[PlannedEntry]) -> str | None:
    """The record that no process will look ``m`` up again, or None (then it is kept)."""
    use = m.use
    if use is None or use.looked_up_by_hook or use.read_since_written is True:
        return None
    same = "same program as " + ", ".join(o.key for o in group if o is not m)
    if use.pointer_key is not None:
        return f"{same}; {use.pointer_key}"
    written = m.cache_id.mtime_ns
    later = [o for o in group if o is not m and o.cache_id.mtime_ns > written]
    if use.read_since_written is False and later:
        after = min(later, key=lambda o: o.cache_id.mtime_ns)
        gap = format_age((after.cache_id.mtime_ns - written) / 1e9)
        return (
            f"{same}; {use.evidence}, while a later run wrote {after.key} {gap} after it "
            "instead of reading it"
        )
    stable = [o for o in group if o.use is not None and o.use.looked_up_by_hook]
    if stable and m.manifest is None:
        return (
            f"{same}; no manifest: a plain run's key, beside the stable key {stable[0].key} "
            f"that hooked runs look up ({use.evidence})"
        )
    return None


def rule_max_size(entries: dict[str, PlannedEntry], budget: int) -> None:
    """JAX's ``_evict_if_needed``: pop the smallest (atime, key) until the total fits."""
    remaining = sorted(
        (e for e in entries.values() if not e.rules), key=lambda e: (e.last_used_ns, e.key)
    )
    total = sum(e.item.size for e in remaining)
    for e in remaining:
        if total <= budget:
            break
        e.rules.append(
            (
                Rule.MAX_SIZE,
                f"least recently used while the cache is over {budget} bytes ({total} bytes)",
            )
        )
        total -= e.item.size


# --- the files beside the entries ---------------------------------------------------------------


def orphan_atimes(ctx: PruneContext) -> None:
    """``-atime`` files whose entry is gone: JAX ignores them, every run removes them.

    They are what an interrupted removal leaves (the ``-cache`` file goes first), so the
    next run finishes the job whatever its selectors; ``--module`` still limits it.
    """
    entry_keys = {i.key for i in ctx.listing.entries}
    for item in ctx.listing.of_kind(FileKind.ATIME):
        if item.key in entry_keys:
            continue
        parsed = listdir.parse_key(item.key or "")
        module = parsed[1] if parsed else None
        if ctx.options.module is not None and not fnmatch.fnmatchcase(
            module or "", ctx.options.module
        ):
            continue
        st = ctx.cd.regular(item.name)
        if st is None:
            continue
        if ctx.age_s(st.st_mtime_ns) < ORPHAN_ATIME_GRACE_S:
            ctx.skipped.append(
                Skip(item.name, "-atime without entry, but under a minute old", Rule.ORPHANS)
            )
            continue
        ctx.remove_file(item.name, st, Rule.ORPHANS, "-atime file without its entry")


def rule_orphans(ctx: PruneContext) -> None:
    """``--orphans``: stale temporary files, manifests and module text without their entry, and
    interrupted manifest writes, each older than ``--stale-after`` (a write may be in progress)."""
    entry_keys = {i.key for i in ctx.listing.entries}
    stale_temps(ctx, Rule.ORPHANS)
    folder_name = MANIFEST_DIRNAME
    folder = ctx.cd.subdir(folder_name)
    if folder is None:
        return
    with folder:
        for m in ctx.manifests:
            if m.key in entry_keys or m.is_symlink:
                continue
            st = folder.regular(m.file)
            if st is None:
                continue
            age = ctx.age_s(st.st_mtime_ns)
            if age < ctx.options.stale_after_s:
                ctx.skipped.append(
                    Skip(
                        f"{folder_name}/{m.file}",
                        f"manifest without entry, only "
                        f"{format_age(age)} old (the hook writes it before JAX compiles)",
                        Rule.ORPHANS,
                    )
                )
                continue
            ctx.remove_file(m.file, st, Rule.ORPHANS, "manifest without its entry", folder_name)
            ir = folder.regular(m.key + MANIFEST_IR_SUFFIX)
            if ir is not None:
                ctx.remove_file(
                    m.key + MANIFEST_IR_SUFFIX,
                    ir,
                    Rule.ORPHANS,
                    "module text of a manifest without entry",
                    folder_name,
                )
        manifest_keys = {m.key for m in ctx.manifests}
        for item in ctx.manifest_others:
            st = folder.regular(item.name)
            if st is None:
                continue
            stale = ctx.age_s(st.st_mtime_ns) >= ctx.options.stale_after_s
            if item.name.startswith(".") and item.name.endswith(".tmp") and stale:
                ctx.remove_file(
                    item.name, st, Rule.ORPHANS, "interrupted manifest write", folder_name
                )
            elif (
                item.name.endswith(MANIFEST_IR_SUFFIX)
                and stale
                and (
                    item.name[: -len(MANIFEST_IR_SUFFIX)] not in manifest_keys
                    and item.name[: -len(MANIFEST_IR_SUFFIX)] not in entry_keys
                )
            ):
                ctx.remove_file(
                    item.name,
                    st,
                    Rule.ORPHANS,
                    "module text without manifest or entry",
                    folder_name,
                )


def stale_temps(ctx: PruneContext, rule: Rule) -> None:
    """JAX's and cachedoctor's temporary files older than ``--stale-after``."""
    for item in ctx.listing.items:
        own = item.kind is FileKind.CACHEDOCTOR and fsops.is_own_temp(item.name)
        if item.kind is not FileKind.TEMP and not own:
            continue
        st = ctx.cd.regular(item.name)
        if st is None:
            continue
        age = ctx.age_s(st.st_mtime_ns)
        limit = ctx.options.stale_after_s
        if age < limit:
            ctx.skipped.append(
                Skip(
                    item.name,
                    f"temporary file only {format_age(age)} old (a write may be in progress)",
                    rule,
                )
            )
            continue
        who = "cachedoctor" if own else "JAX"
        ctx.remove_file(item.name, st, rule, f"{who} temporary file, {format_age(age)} old")


def rule_repair(ctx: PruneContext, entries: dict[str, PlannedEntry], removed: set[str]) -> None:
    """``--repair``: missing ``-atime`` files while eviction is in use (recreated from the
    mtime), group/other write bits on files the user owns, stale temporary files."""
    if not ctx.eviction_in_use:
        ctx.notes.append(
            "--repair: LRU eviction is not in use (no entry has an -atime file, no .lockfile), "
            "so missing -atime files are not recreated"
        )
    me = os.getuid()
    for e in entries.values():
        if e.key in removed:
            continue
        if ctx.eviction_in_use and e.atime_item is None:
            ctx.actions.append(
                Action(
                    op=Op.RECREATE_ATIME,
                    name=e.key,
                    rules=(Rule.REPAIR,),
                    reason="missing while eviction is on (jax-ml/jax#39880); "
                    "from the entry's mtime",
                    module=e.module,
                    last_used_ns=e.item.mtime_ns,
                    files=(e.cache_id,),
                )
            )
        for item, fid in ((e.item, e.cache_id), (e.atime_item, e.atime_id)):
            if item is None or fid is None or not item.mode & WRITE_BITS:
                continue
            if item.uid != me:
                ctx.skipped.append(
                    Skip(
                        item.name,
                        f"writable by group/others but owned by uid {item.uid}",
                        Rule.REPAIR,
                    )
                )
                continue
            ctx.actions.append(
                Action(
                    op=Op.FIX_MODE,
                    name=item.name,
                    rules=(Rule.REPAIR,),
                    reason=f"{stat.filemode(item.mode)}: writable by group/others",
                    module=e.module,
                    files=(fid,),
                )
            )
    if not ctx.options.orphans:
        stale_temps(ctx, Rule.REPAIR)
    if ctx.eviction_in_use:
        blockers = [
            i.name
            for i in ctx.listing.items
            if i.name.endswith(layout.CACHE_SUFFIX)
            and (i.is_symlink or i.kind is not FileKind.ENTRY)
            and ctx.cd.lstat(i.name[: -len(layout.CACHE_SUFFIX)] + layout.ATIME_SUFFIX) is None
        ]
        if blockers:
            ctx.notes.append(
                "--repair: JAX's eviction (jax <= 0.10) fails on names that match "
                f"'*-cache' without an -atime file: {', '.join(blockers)}; cachedoctor never "
                "removes links or files it does not recognise, so move them out yourself"
            )


def rule_xla_subcaches(ctx: PruneContext) -> None:
    """``--xla-subcaches``: XLA's autotune and kernel sub-caches, by their names; without the
    flag, a note of their size."""
    subs = [
        i
        for i in ctx.listing.items
        if i.kind in (FileKind.AUTOTUNE_SUBCACHE, FileKind.KERNEL_SUBCACHE)
    ]
    if not subs:
        return
    if not ctx.options.xla_subcaches:
        total = sum(
            tree_size(ctx.listing.path(i))
            if i.is_dir and not ctx.listing.remote
            else i.size  # a bucket's listing gives a prefix's total
            for i in subs
        )
        ctx.notes.append(
            f"XLA sub-caches ({', '.join(i.name for i in subs)}, {format_bytes(total)}) are not "
            "touched without --xla-subcaches"
        )
        return
    for item in subs:
        if item.is_symlink:
            ctx.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
        elif item.kind is FileKind.KERNEL_SUBCACHE and not item.is_dir:
            st = ctx.cd.regular(item.name)
            if st is not None:
                ctx.remove_file(item.name, st, Rule.XLA_SUBCACHES, "XLA kernel cache file")
        elif item.kind is FileKind.AUTOTUNE_SUBCACHE and item.is_dir:
            _autotune_dir(ctx, item.name)
        else:
            ctx.skipped.append(Skip(item.name, "unexpected sub-cache layout; not touched"))


def _autotune_dir(ctx: PruneContext, name: str) -> None:
    """Autotune results by XLA's file name pattern, and interrupted autotune writes."""
    folder = ctx.cd.subdir(name)
    if folder is None:
        return
    with folder:
        for child in folder.listdir():
            st = folder.lstat(child)
            if st is None:
                continue
            rel = f"{name}/{child}"
            if stat.S_ISLNK(st.st_mode):
                ctx.skipped.append(Skip(rel, "symbolic link: never followed or removed"))
            elif stat.S_ISREG(st.st_mode) and subcaches.is_autotune_file_name(child):
                ctx.remove_file(child, st, Rule.XLA_SUBCACHES, "per-fusion autotune result", name)
            elif child == "tmp" and stat.S_ISDIR(st.st_mode):
                tmp = folder.subdir("tmp")
                if tmp is None:
                    continue
                with tmp:
                    for t in tmp.listdir():
                        tst = tmp.regular(t)
                        if (
                            tst is not None
                            and subcaches.is_autotune_tmp_name(t)
                            and (ctx.age_s(tst.st_mtime_ns) >= ctx.options.stale_after_s)
                        ):
                            ctx.remove_file(
                                t,
                                tst,
                                Rule.XLA_SUBCACHES,
                                "interrupted autotune write",
                                f"{rel}",
                            )
            else:
                ctx.skipped.append(Skip(rel, "not recognised: never removed"))


def report_foreign(ctx: PruneContext) -> None:
    """Links and unrecognised files: reported as skipped, never removed."""
    for item in ctx.listing.items:
        if item.kind is FileKind.ENTRY:
            continue  # entry links are reported in _entries
        if item.is_symlink:
            ctx.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
        elif item.kind is FileKind.UNKNOWN:
            what = "folder" if item.is_dir else "file"
            ctx.skipped.append(Skip(item.name, f"{what} not recognised: never removed"))
    for m in ctx.manifests:
        if m.is_symlink:
            ctx.skipped.append(
                Skip(f"{MANIFEST_DIRNAME}/{m.file}", "symbolic link: never followed")
            )
    for item in ctx.manifest_others:
        if item.is_symlink:
            ctx.skipped.append(
                Skip(f"{MANIFEST_DIRNAME}/{item.name}", "symbolic link: never followed")
            )


MAX_FOLDER_BYTES = 32 << 20  # prune keeps cachedoctor-stats/ under this (oldest files go first)


def plan_folder_bound(
    cd: Dir, max_bytes: int = MAX_FOLDER_BYTES
) -> tuple[list[Action], str | None]:
    """``prune``'s rule for ``cachedoctor-stats/``: the oldest records and archives go until
    the folder fits in ``max_bytes``. Returns the actions and a note counting the folder."""
    folder = cd.subdir(STATS_DIRNAME)
    if folder is None:
        return [], None
    with folder:
        files = []
        for name in folder.listdir():
            st = folder.regular(name)
            if st is not None:
                files.append((st.st_mtime_ns, name, st))
    total = sum(st.st_size for _, _, st in files)
    actions = []
    over = total - max_bytes
    for _, name, st in sorted(files, key=lambda f: (f[0], f[1])):
        if over <= 0:
            break
        over -= st.st_size
        actions.append(
            Action(
                op=Op.REMOVE_FILE,
                name=f"{STATS_DIRNAME}/{name}",
                rules=(Rule.STATS_BOUND,),
                reason=(
                    f"oldest stats file while {STATS_DIRNAME}/ is over {format_bytes(max_bytes)}"
                ),
                bytes=st.st_size,
                files=(FileId.of(name, st),),
                folder=STATS_DIRNAME,
            )
        )
    note = (
        f"{STATS_DIRNAME}/: {count(len(files), 'file')}, {format_bytes(total)} (kept under "
        f"{format_bytes(max_bytes)}; "
        "`cachedoctor stats --zero` archives the records)"
    )
    return actions, note
