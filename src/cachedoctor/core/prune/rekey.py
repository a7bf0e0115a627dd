"""``rekey``: move manifest-bearing entries to the key the current stable hasher gives them.

A manifest records the digest of every key component (see ``stablekeys.manifest``), so a key can
be recomputed offline after the combination step changes (a new hasher version). An entry whose
recomputed key differs is moved: target manifest and ``-atime`` first, then the ``-cache`` file
is hard-linked to the new name (atomic, never replacing an existing file), then the old names are
removed. Every instant leaves a usable cache: each ``-cache`` file JAX can see has its ``-atime``,
and a kill leaves at worst the same entry under both keys, which the next run drops.

Only entries stored in ``stable`` mode move: in ``observe`` mode JAX finds entries by its own key.
With ``relocated``, entries that ``scan`` reports ``relocated`` (keyed for another spelling of
the cache path, so JAX's own key never hits them here) and that carry an ``observe``-mode
manifest move too: the manifest records the stable key's components, which hash the cache's
paths relative to the cache, so the hook in ``stable`` mode hits the moved entry at this path.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from cachedoctor import layout
from cachedoctor.cache import listdir, reader
from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.prune import spelling
from cachedoctor.core.prune.actions import (
    Action,
    ManifestFile,
    Op,
    Outcome,
    Plan,
    Selector,
    Skip,
    Status,
    open_cache,
    read_manifests,
    remove_companions,
)
from cachedoctor.core.scan.report import lru_evidence
from cachedoctor.core.usage.lookups import EntryUse, entry_use
from cachedoctor.errors import CachedoctorError
from cachedoctor.layout import LOCKFILE, MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX, MANIFEST_SUFFIX
from cachedoctor.stablekeys import manifest, splithash
from cachedoctor.storage import mounts
from cachedoctor.storage.fileid import FileId
from cachedoctor.storage.fsops import CacheDir, Folder
from cachedoctor.storage.location import Location


class KeyHasher(Protocol):
    """What rekey needs from the stable hasher (``stablekeys.keys`` + ``stablekeys.manifest``)."""

    version: int

    def recompute(self, manifest: dict[str, Any]) -> str:
        """The key the current hasher gives this manifest. Raises ValueError with a reason."""
        ...


class _StableHasher:
    """The stable hasher of this installation, as rekey uses it."""

    def __init__(self) -> None:
        self.version: int = int(splithash.HASHER_VERSION)

    def recompute(self, data: dict[str, Any]) -> str:
        try:
            m = manifest.Manifest.from_dict(data)
        except TypeError as exc:
            raise ValueError(f"manifest lacks fields: {exc}") from exc
        return str(manifest.recompute_key(m, hasher_version=self.version))


def default_hasher() -> KeyHasher:
    return _StableHasher()


def _digest(cd: Folder, key: str) -> str | None:
    info = reader.decode_entry(os.path.join(cd.path, key + layout.CACHE_SUFFIX), key=key)
    assert isinstance(info, EntryInfo)
    return info.executable_digest


def plan_rekey(
    cache_dir: Location,
    *,
    hasher: KeyHasher | None = None,
    now: float | None = None,
    jax_info: JaxInfo | None = None,
    progress: Callable[[int, int], None] | None = None,
    relocated: bool = False,
    jobs_cache_dir: str | None = None,
) -> Plan:
    """What ``rekey`` would do. Reads the directory; changes nothing. ``progress(done, total)``
    follows the manifests examined; ``relocated`` also adopts relocated observe-mode entries."""
    where = cache_dir
    if not where.can_rename:
        raise CachedoctorError(
            "rekey works on local cache directories only: a bucket has no atomic rename or "
            "link, so a re-key would be a copy of every entry; run it on a local copy",
            slug="usage",
        )
    hasher = hasher or default_hasher()
    now = time.time() if now is None else now
    jax_info = jax_info or installed_jax()
    planned = _Planned()
    with open_cache(where.spelling) as cd:
        listing = listdir.list_cache(cd.path)
        eviction = lru_evidence(listing).in_use
        manifests, _ = read_manifests(cd)
        adoptable = (
            _relocated_keys(
                cd,
                listing,
                manifests,
                jax_info,
                now,
                jobs_cache_dir or where.spelling,
                planned,
                jobs_told=jobs_cache_dir is not None,
            )
            if relocated
            else set()
        )
        for n, m in enumerate(manifests):
            if progress is not None:
                progress(n, len(manifests))
            _plan_manifest(cd, m, hasher, m.key in adoptable, planned)
    return Plan(
        command="rekey",
        cache_dir=where.resolved(),
        created_at=now,
        selectors=(),
        actions=tuple(planned.actions),
        skipped=tuple(planned.skipped),
        conflicts=tuple(planned.conflicts),
        notes=tuple(_notes(hasher, planned.current, len(adoptable) if relocated else None)),
        eviction_in_use=eviction,
        jax_version=jax_info.jax_version,
        jaxlib_version=jax_info.jaxlib_version,
    )


@dataclass
class _Planned:
    """What the manifests examined so far add to the plan."""

    actions: list[Action] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    conflicts: list[Skip] = field(default_factory=list)
    current: int = 0  # entries already under their current key
    targets: dict[str, tuple[str, FileId]] = field(default_factory=dict)  # new key -> source, file


def _plan_manifest(
    cd: CacheDir, m: ManifestFile, hasher: KeyHasher, adopting: bool, planned: _Planned
) -> None:
    """One manifest's part of the plan: skipped (and why), already current, or a move."""
    label = f"{MANIFEST_DIRNAME}/{m.file}"
    if m.is_symlink:
        planned.skipped.append(Skip(label, "symbolic link: never followed", Selector.REKEY))
        return
    if m.data is None:
        planned.skipped.append(Skip(label, "not a readable manifest", Selector.REKEY))
        return
    if m.data.get("key") != m.key:
        why = f"records key {m.data.get('key')!r}, not its file name"
        planned.skipped.append(Skip(label, why, Selector.REKEY))
        return
    if m.data.get("mode") != "stable" and not adopting:
        why = (
            f"{m.data.get('mode')}-mode manifest: JAX finds this entry by its own key, so it stays"
        )
        planned.skipped.append(Skip(m.key, why, Selector.REKEY))
        return
    src = cd.regular(m.key + layout.CACHE_SUFFIX)
    if src is None:
        leftover = _interrupted_move(cd, m, hasher, MANIFEST_DIRNAME)
        if leftover is not None:
            planned.actions.append(leftover)
        else:
            why = "manifest without entry (prune --orphans)"
            planned.skipped.append(Skip(m.key, why, Selector.REKEY))
        return
    try:
        new = hasher.recompute(m.data)
    except ValueError as exc:
        planned.skipped.append(Skip(m.key, f"key cannot be recomputed: {exc}", Selector.REKEY))
        return
    if new == m.key:
        planned.current += 1
        return
    reason = (
        "relocated: JAX's key hashes another cache path; to the stable key"
        if adopting
        else f"hasher v{m.data.get('hasher_version', '?')} → v{hasher.version}"
    )
    _plan_move(cd, m, new, src, reason, planned)


def _plan_move(
    cd: CacheDir, m: ManifestFile, new: str, src: os.stat_result, reason: str, planned: _Planned
) -> None:
    """Move ``m``'s entry to ``new``; when another entry holds (or will hold) ``new``, drop ours
    as a duplicate if both hold the same executable, else keep both as a conflict."""
    parsed = listdir.parse_key(m.key)
    base = Action(
        op=Op.MOVE_ENTRY,
        name=m.key,
        rules=(Selector.REKEY,),
        reason=reason,
        module=parsed[1] if parsed else None,
        files=(FileId.of(m.key + layout.CACHE_SUFFIX, src),),
        new_key=new,
    )
    # who holds (or will hold, after an earlier move) the new key, and its file
    holder = planned.targets.get(new)
    if holder is None:
        target = cd.regular(new + layout.CACHE_SUFFIX)
        if target is not None:
            holder = (new, FileId.of(new + layout.CACHE_SUFFIX, target))
    if holder is None:
        planned.targets[new] = (m.key, base.files[0])
        planned.actions.append(base)
        return
    ours = _digest(cd, m.key)
    if ours is not None and ours == _digest(cd, holder[0]):
        atime = cd.regular(m.key + layout.ATIME_SUFFIX)
        planned.actions.append(
            replace(
                base,
                op=Op.DROP_DUPLICATE,
                reason=f"{new} already holds the same executable",
                bytes=src.st_size + (atime.st_size if atime else 0) + m.size,
                files=(base.files[0], holder[1]),
            )
        )
    else:
        why = f"new key {new} already holds a different executable; both kept"
        planned.conflicts.append(Skip(m.key, why, Selector.REKEY))


def _notes(hasher: KeyHasher, current: int, adopted: int | None) -> list[str]:
    """The plan's notes; ``adopted``: how many relocated entries move (None: not asked)."""
    notes = [
        f"stable hasher v{hasher.version}; {current} manifest-bearing entries already under "
        "their current key",
        "rekey recomputes the combination of the recorded component digests; a different key "
        "policy (other components) needs a new compile with the hook enabled",
    ]
    if adopted is not None:
        notes.append(
            f"--relocated: {adopted} relocated entries carry an observe-mode manifest and "
            "move to their stable key (`cachedoctor enable` makes JAX use it); relocated entries "
            "without a manifest cannot be re-keyed offline (their key needs the module)"
        )
    return notes


def _relocated_keys(
    cd: CacheDir,
    listing: listdir.CacheListing,
    manifests: list[ManifestFile],
    jax_info: JaxInfo,
    now: float,
    as_given: str,
    planned: _Planned,
    *,
    jobs_told: bool,
) -> set[str]:
    """Keys of observe-mode entries that ``scan`` reports ``relocated`` (its evidence, reused)
    for the spelling ``as_given``, less those a run may still hit (``spelling.keep_reason``:
    a read since the write, or another spelling of this folder), which are skipped."""
    from cachedoctor.core.findings import FindingKind
    from cachedoctor.core.scan.build import build_report

    observed = {
        m.key
        for m in manifests
        if m.data is not None and m.data.get("mode") == "observe" and not m.is_symlink
    }
    infos = {}
    for item in listing.entries:
        if item.key in observed and not item.is_symlink:
            info = reader.decode_entry(os.path.join(cd.path, item.name), key=item.key)
            assert isinstance(info, EntryInfo)
            infos[item.key] = info
    report = build_report(
        listing,
        list(infos.values()),
        jax_info,
        now,
        manifests=[m.data for m in manifests if not m.is_symlink],
        root_as_given=as_given,
    )
    mount = mounts.mount_of(cd.path)
    keys = set()
    for f in report.findings:
        if f.kind is not FindingKind.RELOCATED:
            continue
        for key in f.entries:
            if key not in observed:
                continue
            info = infos[key]
            written = os.path.dirname(info.autotune_dir or info.kernel_cache_file or "") or "."
            keep = spelling.keep_reason(written, cd.path, jobs_told, _read_use(cd, key, mount, now))
            if keep is None:
                keys.add(key)
            else:
                planned.skipped.append(Skip(key, keep, Selector.RELOCATED))
    return keys


def _read_use(cd: CacheDir, key: str, mount: mounts.MountAtime | None, now: float) -> EntryUse:
    """What the entry's access time and -atime file say of a read since its write."""
    st = cd.regular(key + "-cache")
    written = st.st_mtime_ns if st is not None else 0
    accessed = st.st_atime_ns if st is not None and os.geteuid() in (0, st.st_uid) else None
    return entry_use(
        key,
        written_ns=written,
        accessed_ns=accessed,
        lru_atime_ns=listdir.read_atime(os.path.join(cd.path, key + "-atime")),
        mount=mount,
        manifest=None,
        now_ns=int(now * 1e9),
    )


def _interrupted_move(
    cd: CacheDir, m: ManifestFile, hasher: KeyHasher, folder: str
) -> Action | None:
    """The source manifest a killed move left behind: its entry and manifest already stand
    under the new key, so removing it finishes the move (the next run's job)."""
    try:
        new = hasher.recompute(m.data or {})
    except ValueError:
        return None
    mdir = cd.subdir(folder)
    if new == m.key or mdir is None:
        return None
    if cd.regular(new + layout.CACHE_SUFFIX) is None or mdir.regular(new + MANIFEST_SUFFIX) is None:
        return None
    st = mdir.regular(m.file)
    if st is None:
        return None
    return Action(
        op=Op.REMOVE_FILE,
        name=f"{folder}/{m.file}",
        rules=(Selector.REKEY,),
        reason=f"left by an interrupted move to {new}: the entry and its manifest are there",
        bytes=st.st_size,
        files=(FileId.of(m.file, st),),
        folder=folder,
    )


def _moved_manifest(raw: bytes, old: str, new: str) -> bytes | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    data.update(key=new, stable_key=new, migrated_from=old, mode="stable")
    return json.dumps(data, indent=1, sort_keys=True).encode() + b"\n"


def apply_action(cd: Folder, a: Action) -> Outcome:
    """Carry out one MOVE_ENTRY or DROP_DUPLICATE; the caller holds JAX's lock."""
    old, new = a.name, a.new_key
    assert new is not None
    st = cd.lstat(a.files[0].name)
    if st is None:
        return Outcome(a, Status.SKIPPED, "already gone")
    if not a.files[0].matches(st):
        return Outcome(a, Status.SKIPPED, "changed since the plan")
    target = cd.regular(new + layout.CACHE_SUFFIX)
    if a.op is Op.DROP_DUPLICATE or target is not None:
        return _drop_if_same(cd, a, old, new)
    mdir = cd.subdir(MANIFEST_DIRNAME, create=True)
    if mdir is None:
        return Outcome(a, Status.FAILED, f"{MANIFEST_DIRNAME} is not a folder (a link?)")
    with mdir:
        raw = mdir.read_small(old + MANIFEST_SUFFIX, limit=64 << 20)
        moved = _moved_manifest(raw, old, new) if raw else None
        if moved is not None:
            mdir.write_new(new + MANIFEST_SUFFIX, moved)
        if mdir.regular(old + MANIFEST_IR_SUFFIX) is not None:
            mdir.link_noreplace(old + MANIFEST_IR_SUFFIX, new + MANIFEST_IR_SUFFIX)
    if cd.regular(old + layout.ATIME_SUFFIX) is not None:
        cd.link_noreplace(old + layout.ATIME_SUFFIX, new + layout.ATIME_SUFFIX)
    elif cd.lstat(LOCKFILE) is not None:
        cd.write_new(new + layout.ATIME_SUFFIX, st.st_mtime_ns.to_bytes(8, "little"))
    if not cd.link_noreplace(old + layout.CACHE_SUFFIX, new + layout.CACHE_SUFFIX):
        return _drop_if_same(cd, a, old, new)  # a JAX process wrote the new key meanwhile
    cd.fsync()
    cd.unlink_if(None, old + layout.CACHE_SUFFIX)
    remove_companions(cd, old)
    return Outcome(a, Status.DONE, f"now {new}")


def _drop_if_same(cd: Folder, a: Action, old: str, new: str) -> Outcome:
    """Drop the source when the new key holds the same executable; else report the conflict.

    The plan compared the two files; when the target is still that very file (inode, size,
    mtime) nothing is decoded here, under JAX's lock.
    """
    target = cd.lstat(new + layout.CACHE_SUFFIX)
    compared = len(a.files) > 1 and target is not None and a.files[1].matches(target)
    if not compared:
        ours, theirs = _digest(cd, old), _digest(cd, new)
        if ours is None or ours != theirs:
            return Outcome(
                a, Status.FAILED, f"conflict: {new} holds a different executable; kept both"
            )
    size = a.files[0].size
    if cd.unlink_if(a.files[0]) != "removed":
        return Outcome(a, Status.SKIPPED, "changed since the plan")
    freed = size + remove_companions(cd, old)
    return Outcome(a, Status.DONE, f"duplicate of {new}", freed)
