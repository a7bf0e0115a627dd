"""From the runs to the verdicts: which modules recompiled and why (the entries, the key
manifests, ``diff``); --verify's comparison is ``verify.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from cachedoctor import layout
from cachedoctor.core.check.report import (
    CheckReport,
    ObserveStatus,
    RunResult,
    UnstableModule,
    VolatileChange,
    module_of_key,
)
from cachedoctor.core.check.runner import entry_keys
from cachedoctor.core.check.verify import FreshRun, verify_result
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.errors import CachedoctorError
from cachedoctor.stablekeys.manifest import Manifest, iter_manifests, key_mode_reason
from cachedoctor.stablekeys.processes import per_process_keys
from cachedoctor.storage.location import Location


def analyse(
    argv: Sequence[str],
    cache: str,
    results: list[RunResult],
    fresh: FreshRun | None,
    observe_requested: bool,
) -> CheckReport:
    first = results[0]
    all_keys = [k for r in results for k in r.new_keys]
    pre_existing = [k for k in entry_keys(cache) if k not in set(all_keys)]
    after_first = {module_of_key(k) for k in [*pre_existing, *first.new_keys]}
    by_module: dict[str, list[str]] = {}
    for k in [*pre_existing, *all_keys]:
        by_module.setdefault(module_of_key(k), []).append(k)
    later: dict[str, list[int]] = {}
    for r in results[1:]:
        for k in r.new_keys:
            if module_of_key(k) in after_first and r.index not in later.get(module_of_key(k), []):
                later.setdefault(module_of_key(k), []).append(r.index)
    try:
        scan: ScanReport | None = scan_directory(Location.local(cache))
    except OSError:
        scan = None
    manifests = _load_manifests(cache)
    unstable = tuple(
        _explain(module, by_module[module], sorted(later[module]), results, scan, manifests, cache)
        for module in sorted(later)
    )
    observe = _observe_status(observe_requested, manifests)
    verify = verify_result(fresh, cache, scan, after_first) if fresh is not None else None
    per_process = tuple(
        (k.module, k.process_index, k.fields) for k in per_process_keys(manifests.values())
    )
    return CheckReport(
        argv=tuple(argv),
        cache_dir=cache,
        temporary=False,
        kept=False,
        log_path=None,
        runs=tuple(results),
        modules=tuple(sorted(after_first)),
        unstable=unstable,
        observe=observe,
        verify=verify,
        scan=scan,
        per_process=per_process,
    )


def _observe_status(requested: bool, manifests: Mapping[str, Manifest]) -> ObserveStatus:
    modes = sorted({m.mode for m in manifests.values()})
    if manifests:
        detail = f"hook in {'/'.join(modes)} mode: key manifests for {len(manifests)} entries"
        return ObserveStatus(requested, len(manifests), detail)
    if not requested:
        return ObserveStatus(False, 0, "off (--no-observe)")
    return ObserveStatus(
        True,
        0,
        "no key manifests were written: the command's Python could not load cachedoctor's "
        "hook (is cachedoctor installed in it?), CACHEDOCTOR_HOOK=off, or it compiled nothing",
    )


def _load_manifests(cache: str) -> dict[str, Manifest]:
    """Key manifests by stored key (unreadable ones are skipped by ``iter_manifests``)."""
    return {m.key: m for m in iter_manifests(Location.local(cache))}


def _entry_verdict(module: str, keys: Sequence[str], scan: ScanReport | None) -> str:
    """What the stored entries say: the scan's unstable-key finding, or how the programs differ."""
    if scan is None:
        return "the cache could not be scanned"
    for f in scan.findings:
        if (
            f.kind is FindingKind.UNSTABLE_KEY
            and f.module == module
            and set(keys) <= set(f.entries)
        ):
            return f.message.split(": ", 1)[-1]
    entries = [e for e in scan.loaded_entries()[0] if e.key in set(keys)]
    if len(entries) < 2 or any(e.program_digest is None for e in entries):
        return "the entries could not be compared (undecodable or missing)"
    entries.sort(key=lambda e: list(keys).index(e.key))  # in the order of the pair
    params = [e.hlo.parameters if e.hlo else None for e in entries]
    if len(set(params)) > 1:
        shown = " vs ".join("(" + ", ".join(p or ()) + ")" for p in params)
        return (
            f"different programs: the entry parameters differ {shown}; "
            "the traced program changes between runs"
        )
    sizes = [e.hlo.instructions if e.hlo else None for e in entries]
    if len(set(sizes)) > 1:
        shown = " vs ".join(str(s) for s in sizes)
        return f"different programs: {shown} instructions; the traced program changes between runs"
    if len({e.program_digest for e in entries}) > 1:
        return "different programs (same shapes and size): the traced program changes between runs"
    return "same program in every entry, but not the same executable"


def _explain(
    module: str,
    keys: Sequence[str],
    recompiled_in: Sequence[int],
    results: Sequence[RunResult],
    scan: ScanReport | None,
    manifests: Mapping[str, Manifest],
    cache: str,
) -> UnstableModule:
    ordered = [k for r in results for k in r.new_keys if k in set(keys)]
    ordered = [k for k in keys if k not in set(ordered)] + ordered
    pair, pairing = _pair(ordered, recompiled_in[0], results, scan)
    entry_verdict = _entry_verdict(module, pair, scan)
    found = [manifests[k] for k in pair if k in manifests]
    verdict, source = entry_verdict, "entries"
    volatile: list[VolatileChange] = []
    components: list[str] = []
    stable_hit: bool | None = None
    stable_keys: int | None = None
    if len(found) >= 2:
        volatile = _volatile_changes(found)
        components = _changed_components(found)
        stable = {m.stable_key for m in found}
        stable_keys = len(stable)
        stable_hit = stable_keys == 1
        if volatile:
            names = ", ".join(v.field for v in volatile)
            verdict = f"the key input {names} changed between runs"
            if stable_hit:
                verdict += "; its canonical form did not (a volatile value, not a real change)"
        elif components:
            verdict = "key components differ: " + ", ".join(components)
        source = "manifests"
    diff_verdict = _diff_verdict(cache, pair[0], pair[1])
    if diff_verdict and source == "entries":
        verdict, source = diff_verdict, "diff"
    return UnstableModule(
        module=module,
        keys=tuple(ordered),
        recompiled_in=tuple(recompiled_in),
        pair=pair,
        pairing=pairing,
        verdict=verdict,
        source=source,
        entry_verdict=entry_verdict,
        changed_components=tuple(components),
        volatile=tuple(volatile),
        stable_would_hit=stable_hit,
        stable_keys=stable_keys,
        diff_verdict=diff_verdict,
        key_mode=_key_mode(found[-1]) if found else None,
    )


def _pair(
    ordered: Sequence[str], run: int, results: Sequence[RunResult], scan: ScanReport | None
) -> tuple[tuple[str, str], str]:
    """The two entries a verdict rests on: the first new entry of ``run`` and the earlier
    entry it stands for, with the evidence that pairs them.

    A module name can hold several programs (one per shape, or per static argument): the new
    entry is paired with an earlier one holding the same program (program digest), else the
    only earlier one, else the one earlier entry whose parameters are the same as its own.
    """
    written = {k for r in results if r.index == run for k in r.new_keys}
    new = next(k for k in ordered if k in written)
    earlier = list(ordered[: ordered.index(new)]) or [k for k in ordered if k != new][:1]
    if not earlier:
        return (new, new), "no earlier entry"
    entries = {e.key: e for e in (scan.loaded_entries()[0] if scan else ())}
    mine = entries.get(new)
    if mine is not None and mine.program_digest is not None:
        same = [
            k
            for k in earlier
            if entries.get(k) and entries[k].program_digest == mine.program_digest
        ]
        if same:
            return (same[0], new), "the earlier entry holding the same program"
    if len(earlier) == 1:
        return (earlier[0], new), "the only earlier entry of the module"
    params = mine.hlo.parameters if mine is not None and mine.hlo else None
    alike = [
        k for k in earlier if params is not None and (h := entries.get(k)) and h.hlo
        and h.hlo.parameters == params
    ]  # fmt: skip
    if len(alike) == 1:
        shown = ", ".join(params or ())
        return (alike[0], new), f"the one earlier entry with the same parameters ({shown})"
    return (earlier[0], new), (
        f"the first of {len(earlier)} earlier entries; {len(alike) or 'none'} of them with the "
        "same parameters, so which one it stands for is unknown"
    )


def _key_mode(found: Manifest) -> str | None:
    """``replay (3 recorded partitioner calls ...)``, ``static (...)`` or ``fallback (why)``."""
    mode = getattr(found, "key_mode", None)
    if mode is None:
        return None
    return f"{mode} ({key_mode_reason(found)})"


def _volatile_changes(found: Sequence[Manifest]) -> list[VolatileChange]:
    """Volatile fields whose raw value differed between the manifests (hook's ``volatile``)."""
    by_field: dict[str, list[tuple[str, str]]] = {}
    for m in found:
        for v in m.volatile:
            name = str(v.get("field", "?"))
            by_field.setdefault(name, []).append(
                (str(v.get("raw", "")), str(v.get("canonical", "")))
            )
    changes = []
    for name, pairs in by_field.items():
        raws = [raw for raw, _ in pairs]
        if len(set(raws)) > 1:
            changes.append(
                VolatileChange(
                    field=name,
                    values=tuple(raws),
                    canonical_same=len({c for _, c in pairs}) == 1,
                )
            )
    return changes


def _changed_components(found: Sequence[Manifest]) -> list[str]:
    digests: dict[str, set[str]] = {}
    for m in found:
        for comp in m.components:
            digests.setdefault(str(comp.get("name")), set()).add(str(comp.get("digest")))
    return [name for name, values in digests.items() if len(values) > 1]


def _diff_verdict(cache: str, key_a: str, key_b: str) -> str | None:
    """The verdict line of ``cachedoctor diff`` for two entries; None when one is unreadable."""
    from cachedoctor.core.diff.compare import diff_entries

    try:
        result = diff_entries(
            Path(cache) / f"{key_a}{layout.CACHE_SUFFIX}",
            Path(cache) / f"{key_b}{layout.CACHE_SUFFIX}",
        )
    except (OSError, CachedoctorError):  # the entries' own verdict stands
        return None
    return result.verdict.line.strip() or None
