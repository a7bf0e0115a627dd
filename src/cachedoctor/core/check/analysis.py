"""From the runs to the verdicts: which modules recompiled, why (the entries, the key manifests,
``diff``), and which --verify mismatches are stale entries.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from cachedoctor import layout
from cachedoctor.cache import listdir, model, reader
from cachedoctor.core.check.report import (
    CheckReport,
    Mismatch,
    ObserveStatus,
    Progress,
    RunResult,
    UnstableModule,
    VerifyResult,
    VolatileChange,
    module_of_key,
)
from cachedoctor.core.check.runner import check_env, entry_keys, run_once
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.errors import CachedoctorError
from cachedoctor.stablekeys.manifest import Manifest, iter_manifests, key_mode_reason
from cachedoctor.stablekeys.processes import per_process_keys


def analyse(
    argv: Sequence[str],
    cache: str,
    results: list[RunResult],
    jax_mismatches: Sequence[str],
    cold: tuple[int, dict[str, set[str]]] | None,
    before_verify: int,
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
        scan: ScanReport | None = scan_directory(cache)
    except OSError:
        scan = None
    manifests = _load_manifests(cache)
    unstable = tuple(
        _explain(module, by_module[module], sorted(later[module]), results, scan, manifests, cache)
        for module in sorted(later)
    )
    observe = _observe_status(observe_requested, manifests)
    verify_result = None
    if cold is not None:
        last = results[-1]
        missed = {module_of_key(k) for k in last.new_keys}
        mismatches = _verify_findings(jax_mismatches, cold, scan, set(later))
        complete = last.returncode == 0
        # an aborted run proves nothing about the modules it produced no trace for: they may
        # have hit, or never been reached
        reached = missed | {m.module for m in mismatches}
        silent = tuple(sorted(m for m in after_first if m not in reached))
        verify_result = VerifyResult(
            run=last.index,
            entries_before=before_verify,
            hit_modules=silent if complete else (),
            mismatches=mismatches,
            complete=complete,
            not_checked=() if complete else silent,
        )
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
        verify=verify_result,
        scan=scan,
        per_process=per_process,
    )


def cold_programs(
    argv: Sequence[str], base: Mapping[str, str], workdir: str, log: IO[bytes], note: Progress
) -> tuple[int, dict[str, set[str]]]:
    """Run the command once against an empty cache: the programs it compiles now, by module."""
    fresh = os.path.join(workdir, "verify-cold")
    os.makedirs(fresh, exist_ok=True)
    note("--verify: one more run against an empty cache, to compare programs")
    log.write(b"=== cachedoctor check --verify: cold run against an empty cache\n")
    log.flush()
    code, _, _ = run_once(
        argv, check_env(base, fresh, observe=False, verify=False), None, None, log
    )
    log.write(f"=== cold run exited with {code}\n".encode())
    programs: dict[str, set[str]] = {}
    with contextlib.suppress(OSError):
        listing = listdir.list_cache(fresh)
        for item in listing.entries:
            info = reader.decode_entry(listing.path(item), key=item.key)
            if isinstance(info, model.EntryInfo) and info.program_digest:
                programs.setdefault(module_of_key(item.key or ""), set()).add(info.program_digest)
    return code, programs


def _verify_findings(
    jax_keys: Sequence[str],
    cold: tuple[int, dict[str, set[str]]],
    scan: ScanReport | None,
    unstable: set[str],
) -> tuple[Mismatch, ...]:
    """Stale entries, from JAX's byte comparison and from comparing programs with a cold compile.

    JAX compares executable bytes and stops the command at the first difference, but XLA's CPU
    backend does not always emit identical object files for one program (seen for sharded
    modules), so each JAX mismatch is classified by program (modulo volatile fields). And a
    module that hit the cache (no new entry after run 1) although a cold compile gives a
    program that no entry of that module holds was served another program: a stale entry.
    """
    code, fresh = cold
    cached: dict[str, dict[str, str]] = {}  # module -> program digest -> key
    digest_of: dict[str, str | None] = {}
    for e in scan.loaded_entries()[0] if scan else ():
        digest_of[e.key] = e.program_digest
        if e.program_digest:
            cached.setdefault(module_of_key(e.key), {})[e.program_digest] = e.key
    out: list[Mismatch] = []
    for key in jax_keys:
        module = module_of_key(key)
        digest = digest_of.get(key)
        if code != 0:
            out.append(Mismatch(key, module, None, f"the cold run failed (exit {code})"))
        elif digest is None:
            out.append(Mismatch(key, module, None, "the cached entry could not be decoded"))
        elif digest in fresh.get(module, set()):
            out.append(
                Mismatch(
                    key,
                    module,
                    False,
                    "same program as a cold compile but other executable bytes: XLA's "
                    "compilation of this module is not deterministic, so JAX's check cannot "
                    "verify it and stops the command there",
                )
            )
        else:
            out.append(
                Mismatch(
                    key,
                    module,
                    True,
                    "JAX found the cached executable different from a fresh "
                    "compile, and it holds another program than a cold compile gives",
                )
            )
    if code == 0:
        flagged = {m.module for m in out}
        for module, digests in sorted(fresh.items()):
            if module in unstable or module in flagged or module not in cached:
                continue
            missing = digests - set(cached[module])
            if missing:
                keys = ", ".join(sorted(cached[module].values()))
                out.append(
                    Mismatch(
                        keys,
                        module,
                        True,
                        f"{module} hit the cache, but a cold compile gives a program "
                        "that no cached entry of it holds (the key missed a change)",
                    )
                )
    return tuple(out)


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
    return {m.key: m for m in iter_manifests(cache)}


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
    params = {e.hlo.parameters if e.hlo else None for e in entries}
    if len(params) > 1:
        shown = " vs ".join("(" + ", ".join(p or ()) + ")" for p in params)
        return (
            f"different programs: the entry parameters differ {shown}; "
            "the traced program changes between runs"
        )
    sizes = {e.hlo.instructions if e.hlo else None for e in entries}
    if len(sizes) > 1:
        shown = " vs ".join(str(s) for s in sorted(s for s in sizes if s is not None))
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
    entry_verdict = _entry_verdict(module, ordered, scan)
    found = [manifests[k] for k in ordered if k in manifests]
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
    diff_verdict = _diff_verdict(cache, ordered[0], ordered[-1])
    if diff_verdict and source == "entries":
        verdict, source = diff_verdict, "diff"
    return UnstableModule(
        module=module,
        keys=tuple(ordered),
        recompiled_in=tuple(recompiled_in),
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
