"""Why did a run miss: each recorded miss set against the nearest earlier key of its module,
component by component, in the terms of JAX's own key.

The evidence is what the stats recorder kept of each key JAX looked up and did not find
(``stablekeys/misskeys.py``): one digest per component of JAX's key and the pieces JAX hashed for
the small ones. A component is named as a cause only when its two digests differ; its values
only say what the difference was. A miss without such a record is "unknown", with what to turn on.
"""

from __future__ import annotations

import base64
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cachedoctor.core.findings import Finding
from cachedoctor.core.usage.model import MissedKey, Record
from cachedoctor.core.usage.records_of import CacheRecords, records_by_cache
from cachedoctor.errors import CachedoctorError
from cachedoctor.plaindata import plain
from cachedoctor.storage.location import Location
from cachedoctor.storage.stores import Store

# JAX's component names (jax/_src/cache_key.py), the likelier root cause first: a new XLA flag
# also changes the compile options it lands in, a new jaxlib also the program it lowers.
CAUSE_ORDER = (
    "jax_lib version",
    "backend version",
    "XLA flags",
    "accelerator_config",
    "compression",
    "custom_hook",
    "compile_options",
    "computation",
    "custom_partitioning_replay",
)
ENABLE_HINT = (
    "record misses with `cachedoctor enable --stats-only` (or any hook mode) in the processes"
    " that use this cache"
)
MAX_OPTION_CHANGES = 4
POINTERS = "custom_partitioning pointers"  # misskeys: the backend_config values JAX hashed
WITHOUT_POINTERS = "computation without pointers"  # misskeys: the digest with them removed
POINTERS_REMOVED = "computation, pointers removed by JAX"  # misskeys: JAX's, its flag on
DIGESTS_BESIDE = (WITHOUT_POINTERS, POINTERS_REMOVED)  # recorded beside JAX's components
# JAX's flag that leaves custom_partitioning pointers out of the key: a change of how JAX
# hashes the program, not of the program it lowers
POINTER_FLAG = "jax_remove_custom_partitioning_ptr_from_cache_key"
# the stable hook's replay-verified variant of a module with custom_partitioning calls
# (stablekeys.keys.REPLAY_COMPONENT); its value says why the hook picked or made that variant
REPLAY = "custom_partitioning_replay"


@dataclass(frozen=True)
class Change:
    """One component of JAX's key whose digest differs, and what its values say."""

    component: str
    words: str
    before: str | None = None
    after: str | None = None


@dataclass(frozen=True)
class MissWhy:
    """One recorded miss, explained."""

    module: str
    key: str
    time: float
    host: str
    record: str
    outcome: str | None
    verdict: str  # "changed", "same-key", "first", "unknown"
    words: str
    nearest: str | None = None
    nearest_time: float | None = None
    nearest_in_cache: bool = False
    changes: tuple[Change, ...] = ()
    cache: str | None = None  # the cache it missed in, as records name it
    cache_read: bool = True  # False: that cache could not be read (its entries are not known)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["changes"] = [asdict(c) for c in self.changes]
        return doc


@dataclass(frozen=True)
class CacheRead:
    """A cache whose records were read: how records name it, how many, how many of them by
    read-only runs, and the folders they came from (the folder given first)."""

    cache: str
    records: int
    read_only_runs: int
    folders: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class WhyReport:
    where: str
    records: int
    misses: list[MissWhy] = field(default_factory=list)
    # per module: misses the records count but whose key's components were not recorded
    unrecorded: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    caches: list[CacheRead] = field(default_factory=list)  # whose records were read

    def to_dict(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "caches": [c.to_dict() for c in self.caches],
            "records": self.records,
            "misses": [m.to_dict() for m in self.misses],
            "unrecorded": self.unrecorded,
            "hint": ENABLE_HINT if self.unrecorded or not self.records else None,
            "findings": [plain(f) for f in self.findings],
        }


def _text(values: Sequence[str] | None) -> str | None:
    return None if values is None else " ".join(values)


def _option_changes(a: Sequence[str] | None, b: Sequence[str] | None) -> list[str]:
    """Each compile option that differs, ``path a → b``, from the serialized options JAX hashed."""
    from cachedoctor.formats import wire
    from cachedoctor.xla import optiondiff, optionschema

    if not a or not b or not a[0].startswith("b64:") or not b[0].startswith("b64:"):
        return []
    try:
        diffs = optiondiff.diff_messages(
            base64.b64decode(a[0][4:]), base64.b64decode(b[0][4:]), optionschema.COMPILE_OPTIONS
        )
    except (ValueError, wire.WireError):
        return []
    debug = "executable_build_options.debug_options."
    return ["`{}` {} → {}".format(d.path.removeprefix(debug), *shown_pair(d.a, d.b)) for d in diffs]


def short(value: str | None, limit: int = 60) -> str:
    if value is None:
        return "(unset)"
    return value if len(value) <= limit else value[: limit - 1] + "…"


def shown_pair(a: str | None, b: str | None, limit: int = 60) -> tuple[str, str]:
    """Two differing values as :func:`short` shows them, unless they would then read the same
    (cut before they differ): then each from a little before where they first differ."""
    sa, sb = short(a, limit), short(b, limit)
    if sa != sb or a is None or b is None or a == b:
        return sa, sb
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    start = max(0, at - limit // 3)
    return _window(a, start, limit), _window(b, start, limit)


def _window(value: str, start: int, limit: int) -> str:
    part = value[start : start + limit - 2]
    return ("…" if start else "") + part + ("…" if start + len(part) < len(value) else "")


def shown_values(a: Any, b: Any) -> tuple[str, str]:
    """Two differing settings' values, each as Python writes it (``repr``; a long one shown
    where the two differ)."""
    return shown_pair(repr(a), repr(b))


def _flag_words(va: Sequence[str], vb: Sequence[str]) -> str:
    """What differs between two lists of XLA flags as JAX hashed them (sorted, each once per
    time it was given): flags added and gone, and a flag given more or fewer times."""
    a, b = Counter(va), Counter(vb)
    said = [f"+ {f}" for f in sorted(b.keys() - a.keys())]
    said += [f"- {f}" for f in sorted(a.keys() - b.keys())]
    said += [f"{f} given {_times(a[f])} → {_times(b[f])}" for f in sorted(a) if 0 < b[f] != a[f]]
    if not said:  # the same flags as often: JAX hashed them in another order or spelling
        return "XLA flags {} → {}".format(*shown_pair(repr(list(va)), repr(list(vb))))
    return "XLA flags " + ", ".join(said)


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _pieces_pair(va: Sequence[str], vb: Sequence[str]) -> tuple[str, str]:
    """Two values JAX hashed in pieces, joined; each piece quoted where the joins read alike."""
    ta, tb = " ".join(va), " ".join(vb)
    if ta == tb:
        ta, tb = repr(list(va)), repr(list(vb))
    return shown_pair(ta, tb)


def value_words(name: str, va: Sequence[str] | None, vb: Sequence[str] | None) -> str | None:
    """A small component's change in words from the pieces JAX hashed, or None when the values
    do not say (shared by ``why`` and ``preflight``). Two differing values never read alike."""
    if name == "jax_lib version" and va and vb:
        return "jaxlib {} → {}".format(*_pieces_pair(va, vb))
    if name == "backend version" and va and vb:
        return "backend {} → {}".format(*_pieces_pair(va, vb))
    if name == "XLA flags" and va is not None and vb is not None:
        return _flag_words(va, vb)
    if name == "compression" and va and vb:
        return "{} → {}".format(*_pieces_pair(va, vb))
    if name == "custom_hook":
        return "custom_hook {} → {}".format(*shown_pair(repr(_text(va)), repr(_text(vb))))
    return None


def _describe(name: str, before: MissedKey, after: MissedKey) -> Change:
    """One differing component in words: its two values where the record kept them."""
    va, vb = before.values.get(name), after.values.get(name)
    said = value_words(name, va, vb)
    if said is not None:
        return Change(name, said, _text(va), _text(vb))
    if name == "accelerator_config":
        da, db = _devices(before), _devices(after)
        if da is None or db is None:
            return Change(name, "the accelerator topology changed (its devices not recorded)")
        if da != db:
            return Change(name, f"{da} → {db}", da, db)
        return Change(name, f"the accelerator topology changed, on {da} both times", da, db)
    if name == "compile_options":
        options = _option_changes(va, vb)
        words = "compile options changed"
        if options:
            more = len(options) - MAX_OPTION_CHANGES
            words = "compile option " + "; ".join(options[:MAX_OPTION_CHANGES])
            words += f" (and {more} more)" if more > 0 else ""
        return Change(name, words)
    if name == "computation":
        pa, pb = before.values.get(POINTERS), after.values.get(POINTERS)
        fa, fb = (before.settings or {}).get(POINTER_FLAG), (after.settings or {}).get(POINTER_FLAG)
        if pa and pb and fa is not None and fb is not None and bool(fa) != bool(fb):
            return Change(name, _pointer_flag_words(before, after), repr(fa), repr(fb))
        if pa and pb and _same_without_pointers(before, after):
            words = (
                f"a custom_partitioning pointer: JAX hashes a Python object address"
                f" ({_text(pa)} → {_text(pb)}), so each run writes a new entry; the program is"
                " otherwise the same (`cachedoctor enable` keys it stably)"
            )
            return Change(name, words, _text(pa), _text(pb))
        meta = before.metadata_in_key and after.metadata_in_key
        words = "the program changed"
        if meta:
            words += " (jax_compilation_cache_include_metadata_in_key is on: a moved line counts)"
        settings = _settings_changed(before, after)
        if settings:
            words += f", with {settings} in force (JAX lowers the program under it)"
        return Change(name, words)
    if name == REPLAY:
        return Change(name, _replay_words(before.key, vb), _text(va), _text(vb))
    return Change(name, f"{name} changed")


def _devices(m: MissedKey) -> str | None:
    """How many devices of which kinds the compile was for, in words (None: not recorded)."""
    d = m.devices
    if not d or not isinstance(d.get("count"), int):
        return None
    kinds = "/".join(str(k) for k in d.get("kinds") or [])
    return f"{d['count']} {kinds} device{'s' if d['count'] != 1 else ''}".replace("  ", " ")


def _same_without_pointers(before: MissedKey, after: MissedKey) -> bool | None:
    """Whether the two programs are the same but for their custom_partitioning pointers, by the
    digests the recorder kept of each without them (None: no pair of them to compare). JAX's
    own removal is compared first; the placeholder's digest is JAX's removal when its flag is
    on, so across a toggle of the flag it tells nothing."""
    a, b = before.digest(POINTERS_REMOVED), after.digest(POINTERS_REMOVED)
    if a is not None and b is not None:
        return a == b
    fa = (before.settings or {}).get(POINTER_FLAG)
    if bool(fa) != bool((after.settings or {}).get(POINTER_FLAG)):
        return None
    a, b = before.digest(WITHOUT_POINTERS), after.digest(WITHOUT_POINTERS)
    return None if a is None or b is None else a == b


def _pointer_flag_words(before: MissedKey, after: MissedKey) -> str:
    """JAX's pointer flag turned on or off between two keys of a program with custom_partitioning
    calls: JAX hashes the program another way, which is not a change of the program."""
    fa = (before.settings or {}).get(POINTER_FLAG)
    fb = (after.settings or {}).get(POINTER_FLAG)
    how = (
        "JAX leaves the custom_partitioning pointers out of the key from then on"
        if fb
        else "JAX hashes the custom_partitioning pointers (Python object addresses) into the key"
        " again"
    )
    words = "`{}` {} → {}: {}".format(POINTER_FLAG, *shown_values(fa, fb), how)
    same = _same_without_pointers(before, after)
    if same:
        return words + "; the program is otherwise the same"
    if same is None:
        return words + "; whether the program changed too, the records cannot tell"
    return words + "; the program changed too"


def _replay_words(earlier: str, reasons: Sequence[str] | None) -> str:
    """A new replay-verified variant, in words: what the hook found when it replayed the
    partitioner calls recorded with the earlier variant (``"<key>: <first difference>"``)."""
    said = [r.split(": ", 1)[1] for r in reasons or [] if r.startswith(earlier + ": ")]
    words = "the custom_partitioning calls recorded with it no longer reproduce"
    if said:
        words += f" ({short(said[0], 120)})"
    elif reasons:
        words += f" ({short(reasons[0], 120)})"
    return (
        words
        + ": the partition rule, or what it reads, changed; the stable hook compiled a new variant"
    )


def _settings_changed(before: MissedKey, after: MissedKey) -> str | None:
    """The JAX settings that change lowering and differ between two recorded keys, in words."""
    a, b = before.settings or {}, after.settings or {}
    said = [
        "`{}` {} → {}".format(n, *shown_values(a[n], b[n]))
        for n in a
        if n in b and n != POINTER_FLAG and a[n] != b[n]
    ]
    return ", ".join(said) or None


def differing(before: MissedKey, after: MissedKey) -> list[str]:
    """The components whose digests differ, in :data:`CAUSE_ORDER` (unknown names last)."""
    a, b = dict(before.components), dict(after.components)
    names = [n for n in dict.fromkeys([*a, *b]) if a.get(n) != b.get(n) and n not in DIGESTS_BESIDE]
    rank = {n: i for i, n in enumerate(CAUSE_ORDER)}
    return sorted(names, key=lambda n: rank.get(n, len(rank)))


def _written(m: MissedKey) -> bool:
    return m.outcome in (None, "writes")


KERNEL_MOVED = (
    " (jax up to 0.10 hashes a Pallas kernel's source path and lines into the key; 0.11 and"
    " `cachedoctor enable` strip them)"
)


def _program_detail(where: Location, before: str, after: str) -> str | None:
    """What the canonical programs of two entries the cache holds say (local caches only)."""
    root = where.local_path
    if root is None:
        return None
    a, b = os.path.join(root, before + "-cache"), os.path.join(root, after + "-cache")
    if not (os.path.isfile(a) and os.path.isfile(b)):
        return None
    try:
        from cachedoctor.core.diff.compare import diff_entries

        report = diff_entries(a, b)
    except Exception:
        return None
    moved = report.kernels.pairs if report.kernels and report.kernels.only_debug_info else ()
    if report.verdict.equivalent and any(not p.same_body and p.same_stripped for p in moved):
        # the entries say which Pallas kernel moved, and where (jax <= 0.10 hashes it)
        return report.verdict.line.split(": ", 1)[1] + KERNEL_MOVED
    hlo = report.hlo
    if not hlo.available:
        return None
    if hlo.same_canonical:
        return "the canonical HLO is the same: only what JAX hashes beside it (metadata) differs"
    first = next((line for line in hlo.canonical_diff if line.startswith("+ ")), None)
    n = hlo.changed_instructions
    said = f"{n} instruction{' differs' if n == 1 else 's differ'}"
    return said + (f", first {first[2:].strip()[:80]}" if first else "")


def explain_miss(
    miss: MissedKey,
    record: Record,
    earlier: list[MissedKey],
    held: set[str],
    unknown: set[str],
    where: Location | None,
    cache_read: bool = True,
) -> MissWhy:
    """Why ``miss`` missed, in ``why``'s words: against the keys earlier runs looked up
    (``earlier``) and the entries the cache holds (``held``). The pytest plugin asks it too."""

    def said(verdict: str, words: str, **found: Any) -> MissWhy:
        return MissWhy(
            module=miss.module,
            key=miss.key,
            time=miss.time,
            host=record.host,
            record=record.file,
            outcome=miss.outcome,
            verdict=verdict,
            words=words,
            cache_read=cache_read,
            **found,
        )

    same = [m for m in earlier if m.key == miss.key and _written(m)]
    if same:
        words = (
            "this very key was written before (by a process that ended earlier) and was not in"
            " the cache when looked up: removed since (JAX's LRU eviction, a prune) or never"
            " stored whole"
        )
        return said("same-key", words, nearest=miss.key)
    candidates = [
        m
        for m in earlier
        if m.kind == miss.kind and m.key != miss.key and (_written(m) or m.key in held)
    ]
    if not candidates:
        others = sorted(k for k in unknown if k.rsplit("-", 1)[0] == miss.module)
        if others:
            words = (
                f"the cache holds {len(others)} other entr{'y' if len(others) == 1 else 'ies'} of"
                f" {miss.module}, written by processes that recorded no components: unknown"
                f" ({ENABLE_HINT})"
            )
            return said("unknown", words)
        if not cache_read:  # what the cache held is not known: no first compile claimed
            words = (
                f"no earlier key of {miss.module} is recorded, and the cache could not be read:"
                " whether it held one, and why it missed, cannot tell"
            )
            return said("unknown", words)
        words = (
            f"no earlier key of {miss.module} is recorded, and the cache held none before:"
            " the first compile of it here, as far as this cache shows"
        )
        return said("first", words)
    nearest = min(candidates, key=lambda m: (len(differing(m, miss)), -m.time))
    changes = [_describe(n, nearest, miss) for n in differing(nearest, miss)]
    if where is not None and changes and changes[-1].words.startswith("the program changed"):
        detail = _program_detail(where, nearest.key, miss.key)
        if detail:
            last = changes[-1]
            changes[-1] = Change(last.component, f"{last.words}: {detail}")
    words = "; ".join(c.words for c in changes) or "no component differs (a different key kind)"
    return said(
        "changed",
        words,
        nearest=nearest.key,
        nearest_time=nearest.time,
        nearest_in_cache=nearest.key in held,
        changes=tuple(changes),
    )


def entry_times(store: Store) -> dict[str, float]:
    """Each entry's key and when it was written (its modification time)."""
    try:
        return {
            i.name[: -len("-cache")]: i.mtime_ns / 1e9
            for i in store.list()
            if not i.is_dir and i.name.endswith("-cache")
        }
    except FileNotFoundError:
        return {}


def explain_misses(
    where: Location,
    *,
    module: str | None = None,
    program_detail: bool = True,
    archived: bool = True,
    only_given: bool = False,
) -> WhyReport:
    """Every recorded miss of the cache's processes (of ``module``), explained, oldest first.
    ``where`` is a cache or a records folder: the records are those of each cache it is or
    holds records of, wherever they are (``usage/records_of.py``: read-only runs record outside
    the cache). ``program_detail``: a changed program is diffed entry against entry (as
    ``diff`` does), which reads both entries; ``stats`` and ``lint`` leave it out.
    ``archived``: the records ``stats --zero`` archived count too (the history a miss is
    explained by); ``stats`` and ``lint``, which report the counters since the last reset,
    leave them out, and explain only the misses of the records in ``where`` (``only_given``),
    against all the history."""
    groups = records_by_cache(where, archived=archived)
    report = WhyReport(where=where.spelling, records=0)
    for got in groups:
        report.findings += got.findings
        counted = got.given if only_given else got.records
        report.records += len(counted)
        if got.records:
            report.caches.append(
                CacheRead(got.cache, len(counted), got.read_only_runs, got.folders)
            )
        _explain_cache(report, got, counted, module, program_detail)
    return report


def _explain_cache(
    report: WhyReport,
    got: CacheRecords,
    counted: list[Record],
    module: str | None,
    program_detail: bool,
) -> None:
    """The misses of ``counted`` (records of ``got.cache``), each against the cache's history."""
    found = got.records
    where = got.location
    try:
        written_at = {} if where is None else entry_times(where.store())
    except (OSError, CachedoctorError):
        if where is not None and where.spelling == report.where:
            raise  # the folder the user named: its error is the command's
        where, written_at = None, {}  # a cache the records name: explained from them alone
    cache_read = where is not None
    recorded = {m.key for r in found for m in r.missed.values()}
    misses = sorted(
        ((m, r) for r in found for m in r.missed.values()), key=lambda pair: pair[0].time
    )
    explain = {id(r) for r in counted}
    for r in counted:
        for name, counters in r.modules.items():
            if module is not None and name != module:
                continue
            # a key missed twice in one process is kept once: count its misses from its lookups
            kept = sum(
                max(1, r.keys[m.key].lookups - r.keys[m.key].hits) if m.key in r.keys else 1
                for m in r.missed.values()
                if m.module == name
            )
            if counters.misses > kept:
                report.unrecorded[name] = report.unrecorded.get(name, 0) + counters.misses - kept
    for index, (miss, record) in enumerate(misses):
        if (module is not None and miss.module != module) or id(record) not in explain:
            continue
        earlier = [m for m, r in misses[:index] if m.module == miss.module and r is not record]
        # entries of no recorded key that were there before the miss: unexplained history
        unknown = {k for k, t in written_at.items() if k not in recorded and t <= miss.time}
        shown = where if program_detail else None
        said = explain_miss(miss, record, earlier, set(written_at), unknown, shown, cache_read)
        report.misses.append(replace(said, cache=got.cache))


@dataclass(frozen=True)
class MissCause:
    """One cause of a module's misses, as ``stats`` and ``lint`` show it: the words ``why``
    gives, how many recorded misses it explains, and JAX's components that differ."""

    words: str
    misses: int
    verdict: str  # "changed" or "same-key"
    components: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def miss_causes(report: WhyReport) -> dict[str, tuple[MissCause, ...]]:
    """Per module, each distinct explained cause of its misses, the most frequent first."""
    counted: dict[str, dict[str, tuple[int, MissWhy]]] = {}
    for m in report.misses:
        if m.verdict not in ("changed", "same-key"):
            continue
        said = counted.setdefault(m.module, {})
        n, first = said.get(m.words, (0, m))
        said[m.words] = (n + 1, first)
    return {
        module: tuple(
            MissCause(words, n, m.verdict, tuple(c.component for c in m.changes))
            for words, (n, m) in sorted(said.items(), key=lambda kv: (-kv[1][0], kv[0]))
        )
        for module, said in counted.items()
    }
