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
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from cachedoctor import layout
from cachedoctor.core import preflight
from cachedoctor.core.bundle_file import (
    COMPANION,
    ENTRY_PREFIX,
    FORMAT,
    HEADER,
    BundleError,
    ReadError,
    copy_hashed,
    opened,
    stage,
    write_tar,
)
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "bundle": self.bundle,
            "entries": [asdict(e) for e in self.entries],
            "left_out": [asdict(e) for e in self.left_out],
            "companions": self.companions,
            "bytes": self.bytes,
        }


def _jaxlib(ev: preflight.Evidence | None) -> str | None:
    values = (ev.values.get("jax_lib version") if ev else None) or ()
    return values[0] if values else None


def _devices(entry: Any) -> int | None:
    if entry.num_replicas and entry.num_partitions:
        return int(entry.num_replicas * entry.num_partitions)
    return None


def _selected(
    where: Location, include: frozenset[str], jaxlib: str
) -> tuple[list[Any], list[LeftOut], dict[str, preflight.Evidence]]:
    """The entries to pack and those left out, with the recorded evidence of each key."""
    scan = scan_directory(where, all_tiers=True)
    evidence = preflight.recorded_evidence(where)
    damaged = {
        k
        for f in scan.findings
        if f.kind in (FindingKind.CORRUPT, FindingKind.UNREADABLE)
        for k in f.entries
    }
    keep, left = [], []
    for entry in scan.loaded_entries()[0]:
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
    return keep, left, evidence


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
    _refuse_inside(where, bundle)
    keep, left, evidence = _selected(where, include, jaxlib)
    report = PackReport(where.spelling, str(bundle), left_out=left)
    with _spool(bundle) as spool:
        try:
            members = _spool_entries(where, keep, evidence, report, spool)
            files = _spool_companions(where, {e.key for e in report.entries}, spool, members)
        except OSError as exc:  # the spool's own (a full disk): named by the bundle
            raise OSError(exc.errno, exc.strerror, str(bundle)) from None
        report.companions = len(files)
        head = json.dumps(_header(report, here, files), indent=1).encode()
        spool.seek(0)
        write_tar(
            bundle,
            [(HEADER, len(head), io.BytesIO(head))] + [(n, size, spool) for n, size in members],
        )
    report.bytes = bundle.stat().st_size
    return report


def _refuse_inside(where: Location, bundle: Path) -> None:
    """A bundle written inside the cache it packs would be a foreign file there (and its
    spool, a temp file JAX's writers never clean): refused."""
    root = where.local_path
    if root is None:
        return
    cache = os.path.realpath(root)
    parent = os.path.realpath(bundle.parent)
    if parent == cache or parent.startswith(cache.rstrip(os.sep) + os.sep):
        raise BundleError(f"{bundle} is inside the cache it packs ({root}): write it elsewhere")


@contextmanager
def _spool(bundle: Path) -> Iterator[IO[bytes]]:
    """A nameless temp file beside ``bundle`` (``O_TMPFILE`` where the system has it: nothing
    is left behind even when the process is killed), holding the members until the header is
    known."""
    try:
        bundle.parent.mkdir(parents=True, exist_ok=True)
        spool = tempfile.TemporaryFile(dir=bundle.parent)  # noqa: SIM115 (closed below)
    except OSError as exc:  # named by the bundle, not by its folder
        raise OSError(exc.errno, exc.strerror, str(bundle)) from None
    with spool:
        yield spool


def _spool_one(store: Any, name: str, spool: IO[bytes]) -> tuple[int, str] | OSError:
    """``name`` copied to the end of ``spool``: (size, SHA-256), or the OSError that kept it
    from being read, with nothing of it left in the spool. The spool's own errors are raised."""
    start = spool.tell()
    try:  # a link or a special file named like a cache file is never followed or read
        source = store.open_read(name)
    except OSError as exc:
        return exc
    with source:
        try:
            return copy_hashed(source, spool)
        except ReadError as exc:
            spool.seek(start)
            spool.truncate()
            return exc.error


def _spool_entries(
    where: Location,
    keep: list[Any],
    evidence: dict[str, preflight.Evidence],
    report: PackReport,
    spool: IO[bytes],
) -> list[tuple[str, int]]:
    """Each entry to pack copied into ``spool`` and named in ``report``: (member name, size) in
    spool order. One that cannot be read is left out, and says why."""
    store = where.store()
    members: list[tuple[str, int]] = []
    for entry in keep:
        copied = _spool_one(store, f"{entry.key}-cache", spool)
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
        copied = _spool_one(store, name, spool)
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
    action: str  # "write" (dry run), "written", "present" (the target holds it), "failed: ..."


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

    def counts(self) -> dict[str, int]:
        return dict(Counter(e.verdict for e in self.entries))

    def failed(self) -> int:
        return sum(1 for e in self.entries if e.action.startswith("failed"))

    def to_dict(self) -> dict[str, Any]:
        summary = {k: v for k, v in self.header.items() if k not in ("entries", "files")}
        return {
            "bundle": self.bundle,
            "target": self.target,
            "cache_dir": self.cache_dir,
            "header": summary,
            "applied": self.applied,
            "counts": self.counts(),
            "entries": [asdict(e) for e in self.entries],
            "companions": self.companions,
            "atime_files": self.atime_files,
            "records": self.records,
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
    spelling the jobs give JAX); with ``apply``, write what the target lacks."""
    spelling = cache_dir or target.spelling
    with (
        opened(bundle) as (header, tar),
        tempfile.TemporaryDirectory(prefix="cachedoctor-unpack-") as tmp,
    ):
        staged = Path(tmp)
        stage(tar, header, staged)
        report = UnpackReport(str(bundle), target.spelling, spelling, header, apply)
        forecast = preflight.predict(Location.local(staged), cache_dir=spelling)
        report.problem = forecast.problem
        verdicts = {f.key: f for f in forecast.entries}
        missing = target.local_path is not None and not os.path.isdir(target.local_path)
        if missing and apply:
            os.makedirs(target.local_path or "", mode=0o755, exist_ok=True)
            missing = False
        store = None if missing else target.store()
        for e in header["entries"]:
            f = verdicts.get(e["key"])
            verdict, words = (f.verdict, f.words) if f else ("unknown", forecast.problem or "")
            held = store is not None and store.stat(f"{e['key']}-cache") is not None
            action = "present" if held else "write"
            damage = _damage_held(store, e["key"]) if held else None
            if damage is not None:  # JAX loads the file there, not the bundle's
                verdict, words = "miss", _DAMAGED_THERE.format(damage=damage)
            report.entries.append(UnpackedEntry(e["key"], e.get("module"), verdict, words, action))
        if apply:
            _write(staged, header, store, report)
            if relocate:
                _relocate(target, spelling, report, lock_timeout)
    return report


_DAMAGED_THERE = (
    "the target holds a damaged entry at this key ({damage}): JAX fails to load it and never"
    " replaces it, and unpack never writes over a file; `cachedoctor prune --corrupt --apply`"
    " there first"
)


def _damage_held(store: Any, key: str) -> str | None:
    """What is damaged in the target's own entry at ``key``, or None when it decodes (or
    cannot be read: no claim)."""
    from cachedoctor.cache import reader
    from cachedoctor.cache.model import EntryInfo
    from cachedoctor.core.scan.report import DAMAGE, real_problems

    try:
        with store.open_read(f"{key}-cache") as fh:
            info = reader.decode_entry(f"{key}-cache", key=key, fileobj=fh)
    except OSError:
        return None
    assert isinstance(info, EntryInfo)
    real = real_problems(info)
    return f"{real[0].kind}: {real[0].message}" if real and real[0].kind in DAMAGE else None


def _lru_in_use(store: Any) -> bool:
    """Whether JAX's LRU eviction runs on the target: its ``.lockfile``, or ``-atime`` files
    (JAX writes them only with eviction on). A target not there yet (a new bucket prefix)
    runs none."""
    try:
        if store.stat(layout.LOCKFILE) is not None:
            return True
        return any(i.name.endswith(layout.ATIME_SUFFIX) for i in store.list())
    except FileNotFoundError:
        return False


def _write(stage: Path, header: dict[str, Any], store: Any, report: UnpackReport) -> None:
    """Each entry whole, none over an existing file, then its key manifest (a manifest only
    for an entry this unpack wrote: never one without its entry), then the bundle's stats
    records (the evidence of what went into each key travels with it). Into a cache where
    JAX's LRU eviction runs, each entry's ``-atime`` file is written first (JAX's eviction pass
    fails on an entry without one, jax <= 0.10, and then every later put fails)."""
    mode = 0o666 & ~_umask()
    lru = _lru_in_use(store)
    manifests: dict[str, list[str]] = {}  # key -> its manifest and module text
    for f in header["files"]:
        base = f["name"].removeprefix(layout.MANIFEST_DIRNAME + "/")
        for suffix in (layout.MANIFEST_SUFFIX, layout.MANIFEST_IR_SUFFIX):
            if base != f["name"] and base.endswith(suffix):
                manifests.setdefault(base[: -len(suffix)], []).append(f["name"])
    for i, done in enumerate(report.entries):
        if done.action != "write":
            continue
        action = _write_entry(stage, store, done.key, lru, mode, report)
        report.entries[i] = replace(done, action=action)
        if action == "written":
            for name in manifests.get(done.key, ()):
                report.companions += _write_new(stage, store, name, mode)
    for f in header["files"]:
        if f["name"].startswith(layout.STATS_DIRNAME + "/"):
            report.records += _write_new(stage, store, f["name"], mode)


def _write_entry(
    stage: Path, store: Any, key: str, lru: bool, mode: int, report: UnpackReport
) -> str:
    """One entry (its -atime file first where JAX's LRU runs): what became of it."""
    try:
        if lru and store.stat(f"{key}{layout.ATIME_SUFFIX}") is None:
            # as JAX's LRU writes it on a put: the time of use, ns, 8 bytes little-endian
            stamp = time.time_ns().to_bytes(8, "little")
            report.atime_files += _write_bytes(store, f"{key}{layout.ATIME_SUFFIX}", stamp, mode)
        store.write_atomic(
            f"{key}-cache", (stage / f"{key}-cache").read_bytes(), create=True, mode=mode
        )
        return "written"
    except FileExistsError:
        return "present"  # another process wrote it meanwhile
    except OSError as exc:
        return f"failed: {exc.strerror or exc}"


def _write_new(stage: Path, store: Any, name: str, mode: int) -> int:
    """A staged companion file written where none is: 1, else 0."""
    return _write_bytes(store, name, (stage / name).read_bytes(), mode)


def _write_bytes(store: Any, name: str, data: bytes, mode: int) -> int:
    try:
        store.write_atomic(name, data, create=True, mode=mode)
    except FileExistsError:
        return 0
    return 1


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _relocate(target: Location, spelling: str, report: UnpackReport, lock_timeout: float) -> None:
    """Move the unpacked relocated entries with observe-mode manifests to their stable keys
    (``rekey --relocated``'s plan, kept to what this unpack wrote)."""
    if not target.can_rename:
        report.notes.append(
            "a bucket has no rename: relocated entries stay under their written keys"
        )
        return
    from cachedoctor.core.prune.actions import Status
    from cachedoctor.core.prune.apply import apply as apply_plan
    from cachedoctor.core.prune.rekey import plan_rekey

    written = {e.key for e in report.entries if e.action == "written"}
    plan = plan_rekey(target, relocated=True, jobs_cache_dir=spelling)
    plan = replace(plan, actions=tuple(a for a in plan.actions if a.name in written))
    if not plan.actions:
        return
    try:
        result = apply_plan(plan, lock_timeout=lock_timeout)
    except (OSError, CachedoctorError) as exc:  # the folder or its lock cannot be used
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
    if report.moved:
        _judge_moved(target, spelling, report)


def _judge_moved(target: Location, spelling: str, report: UnpackReport) -> None:
    """The preflight again for the entries moved to their stable keys, now that they are
    there: they hit where processes run the stable hook (``cachedoctor enable``)."""
    forecast = preflight.predict(target, cache_dir=spelling)
    verdicts = {f.key: f for f in forecast.entries}
    at = {e.key: i for i, e in enumerate(report.entries)}
    for old, new in report.moved:
        i, f = at[old], verdicts.get(new)
        if f is None:
            continue
        words = f"moved to its stable key {new}: {f.words}"
        report.entries[i] = replace(report.entries[i], verdict=f.verdict, words=words)
