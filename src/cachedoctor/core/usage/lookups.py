"""Which entries processes look up: per entry, what JAX's own records say about its use.

Two records of a read exist, both JAX's: the ``-atime`` file its LRU rewrites on every hit
(only in processes that run with a size limit), and the file's access time, which a hit's read
moves past the write on a ``relatime`` or ``strictatime`` mount (``storage/mounts``). A key
manifest adds which keys processes compute: a ``stable`` one names the key hooked runs look up;
a key that holds a per-process pointer is looked up by no later run. The processes' stats
records (``cachedoctor-stats/``, :mod:`.records`) add a third record of a read, one that needs no
access time (a bucket keeps none): a hit of the key, counted per key by a process that ended
after the entry was written. Nothing here guesses from file times alone: without a record, the
answer is ``None`` and the evidence says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachedoctor.core.usage.records import KeyUse
from cachedoctor.stablekeys.manifest import Manifest
from cachedoctor.storage.mounts import MountAtime
from cachedoctor.units import format_age

# JAX's put writes the entry, then its -atime, within milliseconds; a -atime later than the
# entry's write by more than this was written by a get (a hit). Two seconds also covers the
# coarsest file-time granularity in use (FAT's 2 s).
LRU_HIT_GAP_NS = 2_000_000_000
# On a relatime mount the kernel moves st_atime on the first read after a write and then only
# when the recorded access time is at least a day old (fs/inode.c, relatime_need_update): the
# last read is at or after the recorded one and before it plus a day.
RELATIME_WINDOW_NS = 86_400 * 1_000_000_000


@dataclass(frozen=True)
class EntryUse:
    """What the records say about one entry's use."""

    key: str
    read_since_written: bool | None  # None: no record can tell
    evidence: str  # what the verdict above rests on, quotable in a plan or a finding
    last_use_ns: int | None  # the last read a record shows (-atime, access time); None: none
    last_use_source: str | None  # "-atime", "access time" or "stats record"
    looked_up_by_hook: bool  # a stable-mode manifest: hooked runs compute this key
    pointer_key: str | None  # evidence that the key holds a per-process pointer, or None
    # its manifest records the partitioner calls: a stable-hooked run whose calls reproduce
    # them takes this key, whatever mode wrote it (stablekeys/hook_replay._replay_candidates)
    replayed_by_hook: bool = False
    # the latest the last use can be, by every record together: the write when nothing read it
    # since, a relatime access time plus a day (or now); None when no record can tell
    latest_use_ns: int | None = None
    latest_use_why: str = ""  # how ``latest_use_ns`` was bounded, for a plan's reason


def entry_use(
    key: str,
    *,
    written_ns: int,
    accessed_ns: int | None,
    lru_atime_ns: int | None,
    mount: MountAtime | None,
    manifest: Manifest | None,
    now_ns: int,
    lru_in_use: bool = False,
    recorded: KeyUse | None = None,
) -> EntryUse:
    """One entry's use from its file times, its ``-atime`` content and its manifest.

    ``written_ns`` is the entry's ``st_mtime``; ``accessed_ns`` its ``st_atime`` (None on a
    bucket); ``mount`` the local mount it lives on (None: unknown or a bucket);
    ``lru_in_use``: JAX's ``.lockfile`` is there, so its LRU keeps ``-atime`` as the record of
    use it evicts by; ``recorded``: the stats records' counts of this key, from processes that
    ended after ``written_ns`` (a hit there is a read since the write)."""
    read: bool | None = None
    evidence = ""
    last: int | None = None
    source: str | None = None
    if lru_atime_ns is not None and lru_atime_ns - written_ns > LRU_HIT_GAP_NS:
        read, last, source = True, lru_atime_ns, "-atime"
        after = format_age((lru_atime_ns - written_ns) / 1e9)
        evidence = f"JAX's -atime: looked up {after} after it was written"
    if mount is not None and mount.tells_reads and accessed_ns is not None:
        if accessed_ns > written_ns:
            if read is None:
                read = True
                after = format_age((accessed_ns - written_ns) / 1e9)
                evidence = f"read {after} after it was written (access time, {mount.policy} mount)"
            if last is None or accessed_ns > last:
                last, source = accessed_ns, "access time"
        elif read is None:
            read = False
            ago = format_age((now_ns - written_ns) / 1e9)
            evidence = (
                f"not read since it was written {ago} ago (access time not after the write, "
                f"{mount.policy} mount)"
            )
    if recorded is not None and recorded.hits and recorded.last_hit_end is not None:
        if read is not True:
            read, evidence = True, recorded.evidence
        ended = int(recorded.last_hit_end * 1e9)
        if last is None or ended > last:
            last, source = ended, "stats record"
    if read is None and lru_in_use and lru_atime_ns is not None:
        read = False
        ago = format_age((now_ns - written_ns) / 1e9)
        evidence = (
            f"JAX's -atime: not looked up since it was written {ago} ago (LRU eviction in use: "
            "the record JAX evicts by)"
        )
    latest, why = _latest_use(
        read,
        written_ns,
        lru_atime_ns,
        accessed_ns if read is not None else None,
        mount,
        recorded,
        now_ns,
    )
    if read is None:
        evidence = _no_record(accessed_ns, mount)
    return EntryUse(
        key=key,
        read_since_written=read,
        evidence=evidence,
        last_use_ns=last,
        last_use_source=source,
        latest_use_ns=latest,
        latest_use_why=why,
        looked_up_by_hook=looked_up_by_hook(manifest),
        pointer_key=pointer_evidence(manifest) or _recorded_pointer(recorded),
        replayed_by_hook=replayed_by_hook(manifest),
    )


def _no_record(accessed_ns: int | None, mount: MountAtime | None) -> str:
    where = (
        "a bucket"
        if accessed_ns is None
        else f"mount {mount.describe()}"
        if mount
        else ("a mount whose access-time policy is unknown")
    )
    return f"no record of a read: no -atime after the write, and {where} keeps none"


def _latest_use(
    read: bool | None,
    written_ns: int,
    lru_atime_ns: int | None,
    accessed_ns: int | None,
    mount: MountAtime | None,
    recorded: KeyUse | None,
    now_ns: int,
) -> tuple[int | None, str]:
    """The latest moment the entry's last use can be, and how that is known; (None, "") when
    no record bounds it (then an age or an LRU order cannot be told)."""
    if read is None:
        return None, ""
    bounds: list[tuple[int, str]] = [(written_ns, "written")]
    if lru_atime_ns is not None and lru_atime_ns > written_ns:
        bounds.append((lru_atime_ns, "JAX's -atime"))
    if mount is not None and mount.tells_reads and accessed_ns is not None:
        if accessed_ns > written_ns and mount.policy == "relatime":
            until = min(now_ns, accessed_ns + RELATIME_WINDOW_NS)
            bounds.append(
                (
                    until,
                    "access time on a relatime mount: the kernel records the first read after a "
                    "write, then at most one a day, so the last read is at or after it and up "
                    "to a day later",
                )
            )
        elif accessed_ns > written_ns:
            bounds.append((accessed_ns, "access time (strictatime mount: every read)"))
    if recorded is not None and recorded.hits and recorded.last_hit_end is not None:
        bounds.append((int(recorded.last_hit_end * 1e9), "a stats record's hit"))
    return max(bounds)


def _recorded_pointer(recorded: KeyUse | None) -> str | None:
    """The stats records' word that the key's writer hashed the pointer, or None."""
    if recorded is None or not recorded.pointer_writer:
        return None
    return (
        "stats records: written by a process whose JAX key held the custom_partitioning "
        "pointer (jax_remove_custom_partitioning_ptr_from_cache_key off, no stable hook)"
    )


def looked_up_by_hook(m: Manifest | None) -> bool:
    """A stable-mode manifest (not the hook's ``fallback``): hooked runs compute this key."""
    return m is not None and m.mode == "stable" and m.key_mode != "fallback"


def replayed_by_hook(m: Manifest | None) -> bool:
    """A manifest with recorded partitioner calls: the stable hook takes any such variant of
    the module (observe mode's too) whose calls reproduce, and JAX then hits its key."""
    return m is not None and bool(m.replay) and m.base_key is not None


def pointer_evidence(m: Manifest | None) -> str | None:
    """The manifest's word that this key holds a per-process pointer (so no later run computes
    it), or None."""
    if m is None:
        return None
    if m.mode == "stable" and m.key_mode == "fallback":
        return "its manifest (stable mode, key_mode fallback) keeps a raw pointer in the key"
    if m.mode == "observe" and m.jax_key_pointer:
        return (
            "its manifest (observe mode) shows JAX's key holds a custom_partitioning pointer "
            "(jax_remove_custom_partitioning_ptr_from_cache_key off)"
        )
    return None
