"""``prune``: plan which entries and files to remove, and why (applied by :mod:`commands.apply`).

The rules choose; :mod:`cachedoctor.commands.plan` holds the plan model and its safety rules.
"""

from __future__ import annotations

import fnmatch
import math
import os
import stat
import time
from dataclasses import dataclass, field

from cachedoctor import layout
from cachedoctor.cache import listdir, reader
from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.cache.listdir import DirItem, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.commands import scan
from cachedoctor.commands.plan import (
    WRITE_BITS,
    Action,
    Dir,
    ManifestFile,
    Op,
    Plan,
    Rule,
    Skip,
    open_dir,
    read_manifests,
)
from cachedoctor.commands.stats import plan_folder_bound
from cachedoctor.errors import CachedoctorError
from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX
from cachedoctor.storage import fsops, stores
from cachedoctor.storage.fsops import FileId, Stat, StoreDir
from cachedoctor.xla import subcaches

ORPHAN_ATIME_GRACE_S = 60  # an -atime may briefly precede its entry (the hook's re-keying)
DEFAULT_STALE_AFTER_S = 24 * 3600  # temp files, manifests without entry (a compile may take hours)
# First jaxlib whose entries carry the pjrt_ifrt header (docs/format.md).
IFRT_HEADER_SINCE = (0, 9, 1)


# Rules whose verdict depends on when the entry was last used: a use since the plan cancels it.
_USE_SENSITIVE = {Rule.OLDER_THAN, Rule.MAX_SIZE}


@dataclass(frozen=True)
class PruneOptions:
    """What ``prune`` selects. Entry rules combine: an entry goes when any selected rule matches."""

    older_than_s: float | None = None
    max_size: int | None = None
    duplicates: bool = False
    corrupt: bool = False
    orphans: bool = False
    relocated: bool = False
    stale_jax: bool = False
    module: str | None = None  # alone: a rule; with other rules: limits them to these modules
    xla_subcaches: bool = False
    repair: bool = False
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    selectors: tuple[str, ...] = ()  # the user's spelling, for the report

    @property
    def entry_rules(self) -> bool:
        return any(
            (
                self.older_than_s is not None,
                self.max_size is not None,
                self.duplicates,
                self.corrupt,
                self.relocated,
                self.stale_jax,
            )
        )

    @property
    def anything(self) -> bool:
        return self.entry_rules or any(
            (self.orphans, self.module is not None, self.xla_subcaches, self.repair)
        )


# --- parsing user values -------------------------------------------------------------------------

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` -> seconds. Raises ValueError."""
    t = text.strip().lower()
    unit = t[-1:] if t[-1:] in _DURATION_UNITS else "s"
    number = t[:-1] if t[-1:] in _DURATION_UNITS else t
    value = float(number)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m)")
    return value * _DURATION_UNITS[unit]


def parse_size(text: str) -> int:
    """``50GB`` (10^9), ``50GiB`` (2^30), ``800M``, ``1024`` -> bytes. Raises ValueError."""
    t = text.strip().lower().replace(" ", "")
    i = len(t)
    while i and not (t[i - 1].isdigit() or t[i - 1] == "."):
        i -= 1
    number, unit = t[:i], t[i:]
    if unit not in _SIZE_UNITS or not number:
        raise ValueError(f"not a size: {text!r} (use e.g. 50GB, 800MiB, 1000000)")
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a size: {text!r} (use e.g. 50GB, 800MiB, 1000000)")
    return int(value)


# --- planning ------------------------------------------------------------------------------------


@dataclass
class _Entry:
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


def _is_autotune_tmp(name: str) -> bool:
    """XLA's in-flight autotune write: ``tmp/tmp_per_fusion_cache_<hash>_<ns>.textproto``."""
    return name.startswith("tmp_per_fusion_cache_") and name.endswith(".textproto")


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


def _fmt_age(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} hours"
    if seconds >= 120:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:.0f} s"


BUCKET_NOTE = (
    "a bucket has no locks: each object is deleted only if its generation/ETag is still the one "
    "this plan saw (a conditional delete), so an object rewritten after the plan is kept and "
    "reported"
)


def plan_prune(
    cache_dir: str | os.PathLike[str],
    options: PruneOptions,
    *,
    now: float | None = None,
    jax_info: JaxInfo | None = None,
    progress: scan.ProgressCallback | None = None,
) -> Plan:
    """What ``prune`` would do with these options. Reads the directory; changes nothing.
    ``progress(done, total)`` follows the entries decoded (only some rules decode)."""
    if not options.anything:
        raise CachedoctorError(
            "nothing selected: give at least one of --older-than, --max-size, --duplicates, "
            "--corrupt, --orphans, --relocated, --stale-jax, --module, --xla-subcaches, --repair",
            slug="usage",
        )
    if options.repair and stores.is_url(cache_dir):
        raise CachedoctorError(
            "--repair works on local cache directories only: it recreates -atime files for "
            "JAX's LRU eviction and fixes file modes, and a gs:// or s3:// cache has neither",
            slug="usage",
        )
    now = time.time() if now is None else now
    jax_info = jax_info or installed_jax()
    with stores.one_line_errors(str(cache_dir)), open_dir(cache_dir) as cd:
        return _Planner(cd, options, now, jax_info, os.fspath(cache_dir), progress).plan()


class _Planner:
    def __init__(
        self,
        cd: Dir,
        options: PruneOptions,
        now: float,
        jax_info: JaxInfo,
        as_given: str,
        progress: scan.ProgressCallback | None = None,
    ) -> None:
        self.cd = cd
        self.as_given = as_given  # the user's spelling of the directory (cd.path is real)
        self.progress = progress
        self.o = options
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
        items = self.listing.items
        self.eviction_in_use = any(i.kind in (FileKind.ATIME, FileKind.LOCKFILE) for i in items)

    # entries ---------------------------------------------------------------------------------

    def _entries(self) -> dict[str, _Entry]:
        atimes = {i.key: i for i in self.listing.of_kind(FileKind.ATIME) if i.key}
        manifests = {m.key: m for m in self.manifests}
        irs = {}
        folder = self.cd.subdir(MANIFEST_DIRNAME)
        if folder is not None:
            with folder:
                for key in manifests:
                    st = folder.regular(key + MANIFEST_IR_SUFFIX)
                    if st is not None:
                        irs[key] = st.st_size
        out: dict[str, _Entry] = {}
        for item in self.listing.entries:
            assert item.key is not None
            if item.is_symlink:
                self.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
                continue
            st = self.cd.regular(item.name)
            if st is None:
                continue  # vanished (JAX's eviction) or not a regular file
            e = _Entry(item.key, item, FileId.of(item.name, st), last_used_ns=st.st_mtime_ns)
            atime = atimes.get(item.key)
            if atime is not None and not atime.is_symlink:
                ast = self.cd.regular(atime.name)
                if ast is not None:
                    e.atime_item = atime
                    e.atime_id = FileId.of(atime.name, ast)
                    value = self._read_atime(atime.name)
                    if value is not None:
                        e.last_used_ns, e.used_from_atime = value, True
            m = manifests.get(item.key)
            if m is not None and not m.is_symlink:
                e.manifest = m
                e.ir_size = irs.get(item.key, 0)
            out[item.key] = e
        return out

    def _read_atime(self, name: str) -> int | None:
        if not isinstance(self.cd, StoreDir):
            return listdir.read_atime(os.path.join(self.cd.path, name))
        data = self.cd.read_small(name, 9)  # the reader's layout: 8 bytes, little-endian ns
        return int.from_bytes(data, "little") if data is not None and len(data) == 8 else None

    def _needs_decode(self) -> bool:
        o = self.o
        return o.duplicates or o.corrupt or o.relocated or o.stale_jax

    def _decode(self, entries: dict[str, _Entry]) -> scan.ScanReport | None:
        """Decode entries and build scan's report, so rules reuse scan's findings verbatim."""
        if not self._needs_decode():
            return None
        infos: list[EntryInfo] = []
        if isinstance(self.cd, StoreDir):  # concurrent ranged reads, the same decoder
            decoded = reader.decode_store_entries(
                self.cd.store, [e.item for e in entries.values()], progress=self.progress
            )
            for e, done in zip(entries.values(), decoded, strict=True):
                e.info = done
                infos.append(done)
            return scan.build_report(
                self.listing,
                infos,
                self.jax,
                self.now,
                manifests=self._manifest_data(),
                root_as_given=self.as_given,
            )
        for n, e in enumerate(entries.values(), 1):
            info = reader.decode_entry(self.cd.path + os.sep + e.item.name, key=e.key)
            assert isinstance(info, EntryInfo)
            e.info = info
            infos.append(info)
            if self.progress is not None:
                self.progress(n, len(entries))
        return scan.build_report(
            self.listing,
            infos,
            self.jax,
            self.now,
            manifests=self._manifest_data(),
            root_as_given=self.as_given,
        )

    def _manifest_data(self) -> list[dict[str, object] | None]:
        return [m.data for m in self.manifests if not m.is_symlink]

    def plan(self) -> Plan:
        entries = self._entries()
        if self.o.module is not None:
            pattern = self.o.module
            entries = {
                k: e for k, e in entries.items() if fnmatch.fnmatchcase(e.module or "", pattern)
            }
            if not self.o.entry_rules:
                for e in entries.values():
                    e.rules.append((Rule.MODULE, f"module matches {pattern}"))
        report = self._decode(entries)
        if report is not None:
            self._rule_corrupt(entries, report)
            self._rule_relocated(entries, report)
            self._rule_stale(entries)
        self._rule_older(entries)
        self._rule_duplicates(entries)
        self._rule_max_size(entries)
        removed = set()
        for e in entries.values():
            if e.rules:
                removed.add(e.key)
                self.actions.append(self._remove_entry(e))
        self._orphan_atimes()
        if self.o.orphans:
            self._orphans()
        if self.o.repair:
            self._repair(entries, removed)
        self._subcaches()
        self._report_foreign()
        stats_actions, stats_note = plan_folder_bound(self.cd)
        self.actions += stats_actions
        self.notes += [stats_note] if stats_note else []
        self.actions.sort(key=lambda a: (list(Op).index(a.op), a.name))
        return Plan(
            command="prune",
            cache_dir=self.cd.path,
            created_at=self.now,
            selectors=self.o.selectors,
            actions=tuple(self.actions),
            skipped=tuple(self.skipped),
            notes=tuple(self.notes),
            eviction_in_use=self.eviction_in_use,
            jax_version=self.jax.jax_version,
            jaxlib_version=self.jax.jaxlib_version,
        )

    def _remove_entry(self, e: _Entry) -> Action:
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
            last_used_ns=e.last_used_ns,
            files=tuple(files),
        )

    def _rule_corrupt(self, entries: dict[str, _Entry], report: scan.ScanReport) -> None:
        if not self.o.corrupt:
            return
        for f in report.findings:
            if f.kind is scan.FindingKind.UNREADABLE:  # scan says the same: never removed
                self.skipped.extend(
                    Skip(k, f.message.partition(": ")[2], Rule.CORRUPT)
                    for k in f.entries
                    if k in entries
                )
                continue
            if f.kind is not scan.FindingKind.CORRUPT:
                continue
            for key in f.entries:
                if key not in entries:
                    continue
                if f.severity < scan.Severity.ERROR:  # scan's "may be a write in progress"
                    self.skipped.append(
                        Skip(
                            key,
                            "truncated but written under a minute ago: may be a JAX write "
                            "in progress",
                            Rule.CORRUPT,
                        )
                    )
                    continue
                problem = scan._real_problems(entries[key].info)[0]  # type: ignore[arg-type]
                entries[key].rules.append((Rule.CORRUPT, f"{problem.kind}: {problem.message}"))

    def _rule_relocated(self, entries: dict[str, _Entry], report: scan.ScanReport) -> None:
        if not self.o.relocated:
            return
        for f in report.findings:
            if f.kind is scan.FindingKind.RELOCATED:
                for key in f.entries:
                    if key in entries:
                        e = entries[key]
                        where = (e.info.autotune_dir or e.info.kernel_cache_file) if e.info else ""
                        where_dir = os.path.dirname((where or "").rstrip("/"))
                        e.rules.append(
                            (Rule.RELOCATED, f"written for a cache at {where_dir}; cannot hit here")
                        )

    def _rule_stale(self, entries: dict[str, _Entry]) -> None:
        if not self.o.stale_jax:
            return
        installed = self.jax.jaxlib_version
        if installed is None:
            self.notes.append("--stale-jax: jaxlib is not installed here, so nothing is stale")
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
        self.notes.append(
            "--stale-jax decides from manifests (their jaxlib version) when present, else from the "
            "entry's layout (pjrt_ifrt header since jaxlib 0.9.1); entries of another jaxlib with "
            "the same layout are not detected without a manifest"
        )

    def _rule_older(self, entries: dict[str, _Entry]) -> None:
        if self.o.older_than_s is None:
            return
        limit_ns = (self.now - self.o.older_than_s) * 1e9
        for e in entries.values():
            if e.last_used_ns < limit_ns:
                age = self.now - e.last_used_ns / 1e9
                source = "-atime" if e.used_from_atime else "file time"
                e.rules.append((Rule.OLDER_THAN, f"last used {_fmt_age(age)} ago ({source})"))

    def _rule_duplicates(self, entries: dict[str, _Entry]) -> None:
        if not self.o.duplicates:
            return
        infos = [e.info for e in entries.values() if e.info is not None]
        for group, _evidence in scan.unstable_groups(infos):
            members = [entries[i.key] for i in group]
            alive = [m for m in members if not m.rules] or members
            keep = max(alive, key=lambda m: (m.last_used_ns, m.key))
            for m in members:
                if m is not keep:
                    m.rules.append(
                        (
                            Rule.DUPLICATES,
                            f"same program as {keep.key} (kept: used last); the stored HLO "
                            "shows a key input that changes per run (scan: unstable-key)",
                        )
                    )
        self.notes.append(
            "--duplicates removes only copies whose key is shown to change between runs (the "
            "stored HLO holds a per-process pointer or custom_partitioning output); the same "
            "program under several stable keys is hit under each of them and is kept"
        )

    def _rule_max_size(self, entries: dict[str, _Entry]) -> None:
        """JAX's ``_evict_if_needed``: pop the smallest (atime, key) until the total fits."""
        if self.o.max_size is None:
            return
        remaining = sorted(
            (e for e in entries.values() if not e.rules), key=lambda e: (e.last_used_ns, e.key)
        )
        total = sum(e.item.size for e in remaining)
        budget = self.o.max_size
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

    # other files -----------------------------------------------------------------------------

    def _age_s(self, mtime_ns: int) -> float:
        return self.now - mtime_ns / 1e9

    def _remove_file(
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

    def _orphan_atimes(self) -> None:
        """``-atime`` files whose entry is gone: JAX ignores them, every run removes them.

        They are what an interrupted removal leaves (the ``-cache`` file goes first), so the
        next run finishes the job whatever its selectors; ``--module`` still limits it.
        """
        entry_keys = {i.key for i in self.listing.entries}
        for item in self.listing.of_kind(FileKind.ATIME):
            if item.key in entry_keys:
                continue
            parsed = listdir.parse_key(item.key or "")
            module = parsed[1] if parsed else None
            if self.o.module is not None and not fnmatch.fnmatchcase(module or "", self.o.module):
                continue
            st = self.cd.regular(item.name)
            if st is None:
                continue
            if self._age_s(st.st_mtime_ns) < ORPHAN_ATIME_GRACE_S:
                self.skipped.append(
                    Skip(item.name, "-atime without entry, but under a minute old", Rule.ORPHANS)
                )
                continue
            self._remove_file(item.name, st, Rule.ORPHANS, "-atime file without its entry")

    def _orphans(self) -> None:
        entry_keys = {i.key for i in self.listing.entries}
        self._stale_temps(Rule.ORPHANS)
        folder_name = MANIFEST_DIRNAME
        folder = self.cd.subdir(folder_name)
        if folder is None:
            return
        with folder:
            for m in self.manifests:
                if m.key in entry_keys or m.is_symlink:
                    continue
                st = folder.regular(m.file)
                if st is None:
                    continue
                age = self._age_s(st.st_mtime_ns)
                if age < self.o.stale_after_s:
                    self.skipped.append(
                        Skip(
                            f"{folder_name}/{m.file}",
                            f"manifest without entry, only "
                            f"{_fmt_age(age)} old (the hook writes it before JAX compiles)",
                            Rule.ORPHANS,
                        )
                    )
                    continue
                self._remove_file(
                    m.file, st, Rule.ORPHANS, "manifest without its entry", folder_name
                )
                ir = folder.regular(m.key + MANIFEST_IR_SUFFIX)
                if ir is not None:
                    self._remove_file(
                        m.key + MANIFEST_IR_SUFFIX,
                        ir,
                        Rule.ORPHANS,
                        "module text of a manifest without entry",
                        folder_name,
                    )
            manifest_keys = {m.key for m in self.manifests}
            for item in self.manifest_others:
                st = folder.regular(item.name)
                if st is None:
                    continue
                stale = self._age_s(st.st_mtime_ns) >= self.o.stale_after_s
                if item.name.startswith(".") and item.name.endswith(".tmp") and stale:
                    self._remove_file(
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
                    self._remove_file(
                        item.name,
                        st,
                        Rule.ORPHANS,
                        "module text without manifest or entry",
                        folder_name,
                    )

    def _stale_temps(self, rule: Rule) -> None:
        for item in self.listing.items:
            own = item.kind is FileKind.CACHEDOCTOR and fsops.is_own_temp(item.name)
            if item.kind is not FileKind.TEMP and not own:
                continue
            st = self.cd.regular(item.name)
            if st is None:
                continue
            age = self._age_s(st.st_mtime_ns)
            limit = self.o.stale_after_s
            if age < limit:
                self.skipped.append(
                    Skip(
                        item.name,
                        f"temporary file only {_fmt_age(age)} old (a write may be in progress)",
                        rule,
                    )
                )
                continue
            who = "cachedoctor" if own else "JAX"
            self._remove_file(item.name, st, rule, f"{who} temporary file, {_fmt_age(age)} old")

    def _repair(self, entries: dict[str, _Entry], removed: set[str]) -> None:
        if not self.eviction_in_use:
            self.notes.append(
                "--repair: LRU eviction is not in use (no -atime files, no .lockfile), so missing "
                "-atime files are not recreated"
            )
        me = os.getuid()
        for e in entries.values():
            if e.key in removed:
                continue
            if self.eviction_in_use and e.atime_item is None:
                self.actions.append(
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
                    self.skipped.append(
                        Skip(
                            item.name,
                            f"writable by group/others but owned by uid {item.uid}",
                            Rule.REPAIR,
                        )
                    )
                    continue
                self.actions.append(
                    Action(
                        op=Op.FIX_MODE,
                        name=item.name,
                        rules=(Rule.REPAIR,),
                        reason=f"{stat.filemode(item.mode)}: writable by group/others",
                        module=e.module,
                        files=(fid,),
                    )
                )
        if not self.o.orphans:
            self._stale_temps(Rule.REPAIR)
        if self.eviction_in_use:
            blockers = [
                i.name
                for i in self.listing.items
                if i.name.endswith(layout.CACHE_SUFFIX)
                and (i.is_symlink or i.kind is not FileKind.ENTRY)
                and self.cd.lstat(i.name[: -len(layout.CACHE_SUFFIX)] + layout.ATIME_SUFFIX) is None
            ]
            if blockers:
                self.notes.append(
                    "--repair: JAX's eviction (jax <= 0.10) fails on names that match "
                    f"'*-cache' without an -atime file: {', '.join(blockers)}; cachedoctor never "
                    "removes links or files it does not recognise, so move them out yourself"
                )

    def _subcaches(self) -> None:
        subs = [
            i
            for i in self.listing.items
            if i.kind in (FileKind.AUTOTUNE_SUBCACHE, FileKind.KERNEL_SUBCACHE)
        ]
        if not subs:
            return
        if not self.o.xla_subcaches:
            total = sum(
                scan._tree_size(self.listing.path(i))
                if i.is_dir and not self.listing.remote
                else i.size  # a bucket's listing gives a prefix's total
                for i in subs
            )
            self.notes.append(
                f"XLA sub-caches ({', '.join(i.name for i in subs)}, {total} bytes) are not "
                "touched without --xla-subcaches"
            )
            return
        for item in subs:
            if item.is_symlink:
                self.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
            elif item.kind is FileKind.KERNEL_SUBCACHE and not item.is_dir:
                st = self.cd.regular(item.name)
                if st is not None:
                    self._remove_file(item.name, st, Rule.XLA_SUBCACHES, "XLA kernel cache file")
            elif item.kind is FileKind.AUTOTUNE_SUBCACHE and item.is_dir:
                self._autotune_dir(item.name)
            else:
                self.skipped.append(Skip(item.name, "unexpected sub-cache layout; not touched"))

    def _autotune_dir(self, name: str) -> None:
        folder = self.cd.subdir(name)
        if folder is None:
            return
        with folder:
            for child in folder.listdir():
                st = folder.lstat(child)
                if st is None:
                    continue
                rel = f"{name}/{child}"
                if stat.S_ISLNK(st.st_mode):
                    self.skipped.append(Skip(rel, "symbolic link: never followed or removed"))
                elif stat.S_ISREG(st.st_mode) and subcaches.is_autotune_file_name(child):
                    self._remove_file(
                        child, st, Rule.XLA_SUBCACHES, "per-fusion autotune result", name
                    )
                elif child == "tmp" and stat.S_ISDIR(st.st_mode):
                    tmp = folder.subdir("tmp")
                    if tmp is None:
                        continue
                    with tmp:
                        for t in tmp.listdir():
                            tst = tmp.regular(t)
                            if (
                                tst is not None
                                and _is_autotune_tmp(t)
                                and (self._age_s(tst.st_mtime_ns) >= self.o.stale_after_s)
                            ):
                                self._remove_file(
                                    t,
                                    tst,
                                    Rule.XLA_SUBCACHES,
                                    "interrupted autotune write",
                                    f"{rel}",
                                )
                else:
                    self.skipped.append(Skip(rel, "not recognised: never removed"))

    def _report_foreign(self) -> None:
        for item in self.listing.items:
            if item.kind is FileKind.ENTRY:
                continue  # entry links are reported in _entries
            if item.is_symlink:
                self.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
            elif item.kind is FileKind.UNKNOWN:
                what = "folder" if item.is_dir else "file"
                self.skipped.append(Skip(item.name, f"{what} not recognised: never removed"))
        for m in self.manifests:
            if m.is_symlink:
                self.skipped.append(
                    Skip(f"{MANIFEST_DIRNAME}/{m.file}", "symbolic link: never followed")
                )
        for item in self.manifest_others:
            if item.is_symlink:
                self.skipped.append(
                    Skip(f"{MANIFEST_DIRNAME}/{item.name}", "symbolic link: never followed")
                )


# --- applying ------------------------------------------------------------------------------------
