"""``pack`` / ``unpack``: a cache as one file that travels, checked against the machine before
it is unpacked.

A bundle is an uncompressed tar (entries are zstd already; ``tar tf`` lists it) whose first
member is a JSON header (:data:`HEADER`): the format, the source's spelling, the jax/jaxlib
that packed it, and per entry its key, module, size, SHA-256, platform, device count and the
jaxlib that wrote it where the cache's records say so; then ``entries/<key>-cache``, their key
manifests (``cachedoctor-manifests/``) and the stats records (``cachedoctor-stats/``: the
evidence the preflight reads, what went into each key).

``pack`` leaves out what cannot hit elsewhere unless asked: damaged entries, entries keyed with
a custom_partitioning pointer (JAX's key holds a Python address no other process computes),
entries another jaxlib wrote (recorded evidence only). ``unpack`` reads only the members the
header names, each checked against its size and digest before anything is written, refuses
names that are not a cache's own, runs the preflight (``core/preflight``) on the staged copy
as this machine's JAX would see it at the target, and writes each file whole (temp file and
link, or a conditional create on a bucket), never over an existing one: a JAX process using the
cache sees an entry entirely or not at all. Relocated entries with observe-mode manifests then
move to their stable keys, as ``rekey --relocated`` does (local targets).
"""

from __future__ import annotations

import io
import json
import os
import stat
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from cachedoctor import layout
from cachedoctor.core import preflight, recorded_keys
from cachedoctor.core.bundle_file import (
    COMPANION,
    ENTRY_PREFIX,
    FORMAT,
    HEADER,
    BundleError,
    opened,
    refuse_inside,
    spool,
    spool_one,
    stage,
    write_tar,
)
from cachedoctor.core.bundle_write import lru_in_use, write_members
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.core.where import Location
from cachedoctor.errors import CachedoctorError

LEAVE_OUT = ("damaged", "pointer", "other-jaxlib")  # what pack leaves out unless included


@dataclass(frozen=True)
class BundledEntry:
    key: str
    module: str | None
    size: int
    sha256: str
    platform: str
    devices: int | None
    jaxlib: str | None  # who wrote it, where a manifest or record says (None: not recorded)


@dataclass(frozen=True)
class LeftOut:
    key: str
    why: str  # one of LEAVE_OUT
    words: str


@dataclass
class PackReport:
    source: str
    bundle: str
    entries: list[BundledEntry] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    companions: int = 0  # manifests and records
    bytes: int = 0
    links: list[str] = field(default_factory=list)  # -cache names that are links: no entries

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "bundle": self.bundle,
            "entries": [asdict(e) for e in self.entries],
            "left_out": [asdict(e) for e in self.left_out],
            "links": self.links,
            "companions": self.companions,
            "bytes": self.bytes,
        }


def _jaxlib(ev: recorded_keys.Evidence | None) -> str | None:
    values = (ev.values.get("jax_lib version") if ev else None) or ()
    return values[0] if values else None


def _devices(entry: Any) -> int | None:
    if entry.num_replicas and entry.num_partitions:
        return int(entry.num_replicas * entry.num_partitions)
    return None


def _selected(
    where: Location, include: frozenset[str], jaxlib: str
) -> tuple[list[Any], list[LeftOut], dict[str, recorded_keys.Evidence], list[str]]:
    """The entries to pack and those left out, with the recorded evidence of each key, and the
    keys of ``-cache`` names that are links (no entry: never followed, never packed)."""
    from cachedoctor.core.scan.report import is_symlink

    scan = scan_directory(where, all_tiers=True)
    evidence = recorded_keys.recorded_evidence(where)
    damaged = {
        k
        for f in scan.findings
        if f.kind in (FindingKind.CORRUPT, FindingKind.UNREADABLE)
        for k in f.entries
    }
    keep, left, links = [], [], []
    for entry in scan.loaded_entries()[0]:
        if is_symlink(entry):
            links.append(entry.key)
            continue
        ev = evidence.get(entry.key)
        writer = _jaxlib(ev)
        unread = any(p.kind != "unknown-layout" for p in entry.problems)  # no verdict: packed
        if (entry.key in damaged or unread) and "damaged" not in include:
            left.append(LeftOut(entry.key, "damaged", "the entry cannot be read whole"))
        elif entry.volatile and not (ev and ev.kind == "stable") and "pointer" not in include:
            left.append(
                LeftOut(
                    entry.key,
                    "pointer",
                    "JAX's key holds a custom_partitioning pointer: no other process computes it",
                )
            )
        elif writer is not None and writer != jaxlib and "other-jaxlib" not in include:
            left.append(
                LeftOut(entry.key, "other-jaxlib", f"written by jaxlib {writer}, not {jaxlib}")
            )
        else:
            keep.append(entry)
    return keep, left, evidence, links


def _companion_names(where: Location, keys: set[str]) -> list[str]:
    """The key manifests (and module texts) of ``keys``, and the stats records that parse as
    records, as names in the cache dir. A file with another link elsewhere (a hard link into
    the cache of someone else's file) is not taken."""
    from cachedoctor.core.usage.records import sound_files

    store = where.store()
    names = []
    for folder in (layout.MANIFEST_DIRNAME, layout.STATS_DIRNAME):
        try:
            listed = store.list(folder)
        except FileNotFoundError:
            continue
        sound = sound_files(store) if folder == layout.STATS_DIRNAME else set()
        for item in listed:
            base = item.name.rsplit("/", 1)[-1]
            if item.is_dir or not COMPANION.fullmatch(f"{folder}/{base}"):
                continue
            stats = folder == layout.STATS_DIRNAME
            taken = base in sound if stats else _manifest_key(base) in keys
            if taken and not _linked_elsewhere(where, f"{folder}/{base}"):
                names.append(f"{folder}/{base}")
    return names


def _manifest_key(name: str) -> str | None:
    """The key a manifest file (``<key>.json``) or module text belongs to."""
    for suffix in (layout.MANIFEST_SUFFIX, layout.MANIFEST_IR_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def _linked_elsewhere(where: Location, name: str) -> bool:
    """A local file with more than one link: its bytes are also someone else's file."""
    if where.local_path is None:
        return False
    try:
        return os.lstat(os.path.join(where.local_path, name)).st_nlink > 1
    except OSError:
        return False


def pack(
    where: Location,
    bundle: Path,
    *,
    include: frozenset[str] = frozenset(),
    jaxlib: str | None = None,
    overwrite: bool = False,
) -> PackReport:
    """Write the bundle of ``where`` to ``bundle`` (a temp file renamed into place).

    The header comes first but names every member's digest, so the members are copied once,
    a chunk at a time, into a spool beside the bundle while they are hashed: memory stays one
    chunk whatever the cache's size (it held the whole bundle before), and the disk beside the
    bundle holds the spool and the bundle while it is written."""
    from cachedoctor.cache.jaxenv import installed_jax

    here = installed_jax()
    jaxlib = jaxlib or here.jaxlib_version or "unknown"
    if bundle.exists() and not overwrite:
        raise BundleError(f"{bundle} exists: give another name, or --force to replace it")
    refuse_inside(where.local_path, bundle)
    keep, left, evidence, links = _selected(where, include, jaxlib)
    report = PackReport(where.spelling, str(bundle), left_out=left, links=links)
    with spool(bundle) as spooled:
        try:
            members = _spool_entries(where, keep, evidence, report, spooled)
            files = _spool_companions(where, {e.key for e in report.entries}, spooled, members)
        except OSError as exc:  # the spool's own (a full disk): named by the bundle
            raise OSError(exc.errno, exc.strerror, str(bundle)) from None
        report.companions = len(files)
        head = json.dumps(_header(report, here, files), indent=1).encode()
        spooled.seek(0)
        write_tar(
            bundle,
            [(HEADER, len(head), io.BytesIO(head))] + [(n, size, spooled) for n, size in members],
        )
    report.bytes = bundle.stat().st_size
    return report


def _spool_entries(
    where: Location,
    keep: list[Any],
    evidence: dict[str, recorded_keys.Evidence],
    report: PackReport,
    spool: IO[bytes],
) -> list[tuple[str, int]]:
    """Each entry to pack copied into ``spool`` and named in ``report``: (member name, size) in
    spool order. One that cannot be read is left out, and says why."""
    store = where.store()
    members: list[tuple[str, int]] = []
    for entry in keep:
        copied = spool_one(store, f"{entry.key}-cache", spool)
        if isinstance(copied, OSError):
            said = f"cannot be read ({copied.strerror or copied}): left out"
            report.left_out.append(LeftOut(entry.key, "damaged", said))
            continue
        size, digest = copied
        jaxlib = _jaxlib(evidence.get(entry.key))
        report.entries.append(
            BundledEntry(
                entry.key, entry.module, size, digest, entry.platform, _devices(entry), jaxlib
            )
        )
        members.append((f"{ENTRY_PREFIX}{entry.key}-cache", size))
    return members


def _spool_companions(
    where: Location, keys: set[str], spool: IO[bytes], members: list[tuple[str, int]]
) -> list[dict[str, Any]]:
    """The key manifests of ``keys`` and the stats records copied into ``spool`` after the
    entries (and added to ``members``): the header's ``files``. One that is a link or no file
    is not packed (evidence only)."""
    store = where.store()
    files = []
    for name in _companion_names(where, keys):
        copied = spool_one(store, name, spool)
        if not isinstance(copied, OSError):
            files.append({"name": name, "size": copied[0], "sha256": copied[1]})
            members.append((name, copied[0]))
    return files


def _header(report: PackReport, here: Any, files: list[dict[str, Any]]) -> dict[str, Any]:
    from cachedoctor._version import __version__

    entries = report.entries
    return {
        "format": FORMAT,
        "created": time.time(),
        "source": report.source,
        "packed_by": {
            "cachedoctor": __version__,
            "jax": here.jax_version,
            "jaxlib": here.jaxlib_version,
        },
        "platforms": dict(Counter(e.platform for e in entries)),
        "device_counts": {str(k): n for k, n in Counter(e.devices for e in entries).items()},
        "jaxlibs": {str(k): n for k, n in Counter(e.jaxlib for e in entries).items()},
        "entries": [asdict(e) for e in entries],
        "files": files,
        "left_out": [asdict(e) for e in report.left_out],
    }


@dataclass(frozen=True)
class UnpackedEntry:
    key: str
    module: str | None
    verdict: str  # the preflight's: hit, miss, unknown
    words: str
    # a dry run: "write", or what stays as it is: "present" (the target holds it), "refused"
    # (it does not decode: never written as an entry), "blocked" (a link or other non-file
    # stands at its name: never followed or replaced); applied: "written" in place of "write",
    # or "failed: ..."
    action: str


@dataclass
class UnpackReport:
    bundle: str
    target: str
    cache_dir: str  # the spelling the jobs give JAX, which the preflight judged
    header: dict[str, Any]
    applied: bool
    entries: list[UnpackedEntry] = field(default_factory=list)
    companions: int = 0  # key manifests written, each beside the entry this unpack wrote
    atime_files: int = 0  # -atime files written beside entries (the target runs JAX's LRU)
    records: int = 0  # the bundle's stats records written (the evidence of each key's inputs)
    moved: list[tuple[str, str]] = field(default_factory=list)  # relocated -> stable key
    problem: str | None = None  # why the preflight could not judge (no JAX here)
    notes: list[str] = field(default_factory=list)
    failed_files: list[tuple[str, str]] = field(default_factory=list)  # manifests, records...

    def counts(self) -> dict[str, int]:
        return dict(Counter(e.verdict for e in self.entries))

    def actions(self) -> dict[str, int]:
        """Entries per action (``failed: ...`` counted as ``failed``)."""
        return dict(Counter(e.action.split(":")[0] for e in self.entries))

    def failed(self) -> int:
        """Entries and other files that could not be written."""
        failed = sum(1 for e in self.entries if e.action.startswith("failed"))
        return failed + len(self.failed_files)

    def to_dict(self) -> dict[str, Any]:
        summary = {k: v for k, v in self.header.items() if k not in ("entries", "files")}
        return {
            "bundle": self.bundle,
            "target": self.target,
            "cache_dir": self.cache_dir,
            "header": summary,
            "applied": self.applied,
            "counts": self.counts(),
            "actions": self.actions(),
            "entries": [asdict(e) for e in self.entries],
            "companions": self.companions,
            "atime_files": self.atime_files,
            "records": self.records,
            "failed_files": [{"name": n, "reason": r} for n, r in self.failed_files],
            "moved": [list(m) for m in self.moved],
            "problem": self.problem,
            "notes": self.notes,
        }


def unpack(
    bundle: Path,
    target: Location,
    *,
    apply: bool,
    cache_dir: str | None = None,
    relocate: bool = True,
    lock_timeout: float = 30.0,
) -> UnpackReport:
    """Check ``bundle`` and judge it against this machine at ``target`` (``cache_dir``: the
    spelling the jobs give JAX); with ``apply``, write what the target lacks. Raises only
    before the first write: from there every failure is in the report."""
    spelling = cache_dir or target.spelling
    with (
        opened(bundle) as (header, tar),
        tempfile.TemporaryDirectory(prefix="cachedoctor-unpack-") as tmp,
    ):
        staged = Path(tmp)
        stage(tar, header, staged)
        report = UnpackReport(str(bundle), target.spelling, spelling, header, apply)
        undecodable = _undecodable(staged, header)
        forecast = preflight.predict(Location.local(staged), cache_dir=spelling)
        report.problem = forecast.problem
        verdicts = {f.key: f for f in forecast.entries}
        missing = target.local_path is not None and not os.path.isdir(target.local_path)
        if missing and apply:
            os.makedirs(target.local_path or "", mode=0o755, exist_ok=True)
            missing = False
        store = None if missing else target.store()
        relocating = relocate and target.can_rename and store is not None
        stable = _stable_keys(staged, spelling) if relocating else {}
        there: list[tuple[str, str]] = []  # bundle key -> its stable key the target holds
        for e in header["entries"]:
            key = e["key"]
            f = verdicts.get(key)
            verdict, words = (f.verdict, f.words) if f else ("unknown", forecast.problem or "")
            action = _found(target, store, f"{key}-cache")
            if key in undecodable:
                verdict, words, action = "miss", undecodable[key], "refused"
            elif action == "blocked":
                verdict, words = "unknown", _BLOCKED
            elif action == "present":
                damage = _damage_held(store, key)
                if damage is not None:  # JAX loads the file there, not the bundle's
                    verdict, words = "miss", _DAMAGED_THERE.format(damage=damage)
            elif key in stable and _found(target, store, f"{stable[key]}-cache") == "present":
                action = "present"  # as the relocation after a write would find it
                there.append((key, stable[key]))
            report.entries.append(UnpackedEntry(key, e.get("module"), verdict, words, action))
        if apply:
            _write(staged, header, store, report)
            if relocate:
                _relocate(target, spelling, report, lock_timeout)
        if there or report.moved:
            _judge_stable(target, spelling, report, there)
    return report


_BLOCKED = (
    "a symbolic link or other non-file stands at this key in the target: JAX reads through it,"
    " cachedoctor neither follows nor replaces it"
)

_DAMAGED_THERE = (
    "the target holds a damaged entry at this key ({damage}): JAX fails to load it and never"
    " replaces it, and unpack never writes over a file; `cachedoctor prune --corrupt --apply`"
    " there first"
)


def _found(target: Location, store: Any, name: str) -> str:
    """What stands at ``name`` in the target: "write" (nothing), "present" (a file) or
    "blocked" (a link or other non-file: never counted as an entry)."""
    if store is None or store.stat(name) is None:
        return "write"
    if target.local_path is None:
        return "present"
    try:
        st = os.lstat(os.path.join(target.local_path, name))
    except FileNotFoundError:
        return "write"
    return "present" if stat.S_ISREG(st.st_mode) else "blocked"


def _damage(info: Any) -> str | None:
    """What makes a decoded entry one JAX fails to load (scan's ``corrupt``: the reader's
    damage kinds), or None: it decodes, cannot be read (no claim) or is in a layout the reader
    does not know (JAX may load it)."""
    from cachedoctor.core.scan.report import DAMAGE, real_problems

    real = real_problems(info)
    return f"{real[0].kind}: {real[0].message}" if real and real[0].kind in DAMAGE else None


def _undecodable(staged: Path, header: dict[str, Any]) -> dict[str, str]:
    """The bundle's entries that do not decode, by the reader that makes scan's ``corrupt``
    verdict: matching their digests, they are still not entries JAX loads, so none is written
    under a ``-cache`` name (an unknown layout is written: no verdict on it)."""
    from cachedoctor.cache import reader
    from cachedoctor.cache.model import EntryInfo

    out = {}
    for e in header["entries"]:
        info = reader.decode_entry(str(staged / f"{e['key']}-cache"), key=e["key"])
        assert isinstance(info, EntryInfo)
        damage = _damage(info)
        if damage is not None:
            out[e["key"]] = (
                f"does not decode ({damage}): JAX fails to load it, so it is not written as an"
                " entry"
            )
    return out


def _damage_held(store: Any, key: str) -> str | None:
    """What is damaged in the target's own entry at ``key``, or None when it decodes (or
    cannot be read: no claim)."""
    from cachedoctor.cache import reader

    try:
        with store.open_read(f"{key}-cache") as fh:
            info = reader.decode_entry(f"{key}-cache", key=key, fileobj=fh)
    except OSError:
        return None
    return _damage(info)


def _stable_keys(staged: Path, spelling: str) -> dict[str, str]:
    """Each staged entry the relocation would move: its stable key (``rekey --relocated``'s
    plan for the jobs' spelling). One the target already holds there is not written again."""
    from cachedoctor.core.prune.rekey import plan_rekey

    try:
        plan = plan_rekey(Location.local(staged), relocated=True, jobs_cache_dir=spelling)
    except (OSError, ValueError, ImportError, CachedoctorError):  # no plan: written as before
        return {}
    return {a.name: a.new_key for a in plan.actions if a.new_key}


def _write(stage: Path, header: dict[str, Any], store: Any, report: UnpackReport) -> None:
    """The entries to write, then their manifests and the bundle's records (``bundle_write``):
    the report's actions and counts become what was written."""
    keys = [e.key for e in report.entries if e.action == "write"]
    done = write_members(stage, header, store, keys, lru=lru_in_use(store))
    for i, e in enumerate(report.entries):
        report.entries[i] = replace(e, action=done.actions.get(e.key, e.action))
    report.companions, report.records = len(done.manifests), len(done.records)
    report.atime_files, report.failed_files = len(done.atime_files), done.failed


def _relocate(target: Location, spelling: str, report: UnpackReport, lock_timeout: float) -> None:
    """Move the unpacked relocated entries with observe-mode manifests to their stable keys
    (``rekey --relocated``'s plan, kept to what this unpack wrote). After the writes: never
    raises, what could not be moved is a note."""
    if not target.can_rename:
        report.notes.append(
            "a bucket has no rename: relocated entries stay under their written keys"
        )
        return
    from cachedoctor.core.prune.actions import Status
    from cachedoctor.core.prune.apply import apply as apply_plan
    from cachedoctor.core.prune.rekey import plan_rekey

    written = {e.key for e in report.entries if e.action == "written"}
    if not written:
        return
    try:
        plan = plan_rekey(target, relocated=True, jobs_cache_dir=spelling)
        plan = replace(plan, actions=tuple(a for a in plan.actions if a.name in written))
        if not plan.actions:
            return
        result = apply_plan(plan, lock_timeout=lock_timeout)
    except Exception as exc:  # the folder or its lock cannot be used: after the writes, said
        report.notes.append(
            f"relocated entries were not moved to their stable keys ({exc}): they stay under"
            " their written keys; `cachedoctor rekey --relocated --apply` moves them later"
        )
        return
    for outcome in result.outcomes:
        if outcome.status is Status.DONE and outcome.action.new_key:
            report.moved.append((outcome.action.name, outcome.action.new_key))
        elif outcome.status is not Status.DONE:
            report.notes.append(
                f"{outcome.action.name} was not moved to its stable key"
                f" ({outcome.status.value}: {outcome.detail or 'no reason given'})"
            )


def _judge_stable(
    target: Location, spelling: str, report: UnpackReport, there: list[tuple[str, str]]
) -> None:
    """The preflight again for the entries now at their stable keys (moved there, or found
    there already), judged where they are: they hit where processes run the stable hook
    (``cachedoctor enable``). A target that cannot be read now leaves a note."""
    try:
        forecast = preflight.predict(target, cache_dir=spelling)
    except Exception as exc:  # after the writes nothing raises: said
        report.notes.append(f"the entries at their stable keys were not judged again ({exc})")
        return
    verdicts = {f.key: f for f in forecast.entries}
    at = {e.key: i for i, e in enumerate(report.entries)}
    pairs = [(old, new, "moved to its stable key") for old, new in report.moved]
    pairs += [(old, new, "there already under its stable key") for old, new in there]
    for old, new, how in pairs:
        i, f = at[old], verdicts.get(new)
        if f is None:
            continue
        words = f"{how} {new}: {f.words}"
        report.entries[i] = replace(report.entries[i], verdict=f.verdict, words=words)
