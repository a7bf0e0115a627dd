"""Findings about what the cache holds besides sound entries: several JAX formats or platforms,
files JAX never writes, damaged XLA sub-caches, modules compiled without an entry (and why).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from cachedoctor import layout
from cachedoctor.cache import listdir
from cachedoctor.cache.listdir import CacheListing, FileKind
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding, Severity
from cachedoctor.core.scan.report import lru_evidence as listing_lru
from cachedoctor.core.usage import reasons
from cachedoctor.core.usage.model import Record
from cachedoctor.errors import count
from cachedoctor.xla import subcaches


def subcache_findings(sub: subcaches.SubcacheReport | None) -> list[Finding]:
    if sub is None:
        return []
    findings = []
    if sub.autotune.exists and sub.autotune.problems:
        findings.append(
            catalog.SUBCACHE_AUTOTUNE.finding(
                "autotune sub-cache: " + "; ".join(sub.autotune.problems),
                entries=(layout.AUTOTUNE_DIR,),
                what_clears_it=autotune_advice(sub.autotune),
            )
        )
    if sub.kernel_cache is not None and sub.kernel_cache.problems:
        findings.append(
            catalog.SUBCACHE_KERNEL.finding(
                "kernel cache: " + "; ".join(sub.kernel_cache.problems),
                severity=None if not sub.kernel_cache.parsed else Severity.WARNING,
                entries=(layout.KERNEL_CACHE_FILE,),
            )
        )
    return findings


def autotune_advice(autotune: subcaches.AutotuneDirReport) -> str:
    """What clears the autotune sub-cache's problems, from the predicates prune itself uses:
    it removes per-fusion files by XLA's name pattern and ``tmp/`` writes by theirs (older
    than ``--stale-after``), and never a file it does not recognise."""
    foreign = [e.name for e in autotune.entries if e.problems and not e.name_ok]
    foreign += [f"tmp/{n}" for n in autotune.tmp_leftovers if not subcaches.is_autotune_tmp_name(n)]
    ours = any(e.problems and e.name_ok for e in autotune.entries) or (
        len(autotune.models) > 1
        or any(subcaches.is_autotune_tmp_name(n) for n in autotune.tmp_leftovers)
    )
    parts = []
    if ours:
        clears = (
            "`cachedoctor prune --xla-subcaches --apply` clears XLA's own files (XLA rebuilds them)"
        )
        if any(subcaches.is_autotune_tmp_name(n) for n in autotune.tmp_leftovers):
            clears += ", and those in tmp/ once older than --stale-after (24h; 0 while no XLA runs)"
        parts.append(clears)
    if foreign:
        shown = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        parts.append(
            f"remove {shown} yourself: {'it is' if len(foreign) == 1 else 'they are'} not "
            "named as XLA names its files, and "
            "cachedoctor never removes a file it does not recognise"
        )
    return (
        "; ".join(parts) or "XLA rebuilds it; `cachedoctor prune --xla-subcaches --apply` clears it"
    )


def not_stored_findings(
    listing: CacheListing,
    manifests: Sequence[Mapping[str, object] | None],
    records: Sequence[Record] = (),
    findings: Sequence[Finding] = (),
) -> list[Finding]:
    """Modules whose key manifest has no entry beside it: JAX compiled them, holds nothing.

    Each is explained by ``usage.reasons`` (as ``stats`` and ``lint`` explain it) from the stats
    ``records``, the listing and the scan's key ``findings``; one finding per kind of reason.
    """
    entry_keys = {i.key for i in listing.entries}
    missing: dict[str, list[str]] = defaultdict(list)
    hooked: dict[str, set[str]] = defaultdict(set)  # the hook's modes in each module's manifests
    for m in manifests:
        if m is None or not isinstance(m.get("key"), str) or m["key"] in entry_keys:
            continue
        module = str(m.get("module_name") or "(unnamed)")
        missing[module].append(str(m["key"]))
        if isinstance(m.get("mode"), str):
            hooked[module].add(str(m["mode"]))
    if not missing:
        return []
    held = Counter(listdir.module_of(k) for k in entry_keys if k)
    settings = reasons.settings_of(records)
    own = listing_lru(listing)  # the entries' own -atime files and the .lockfile (no orphans)
    atimes = len(own.with_atime)
    lru = reasons.lru_evidence(atimes, own.lockfile, settings)
    gap = reasons.atime_gap(len(listing.entries), atimes, lru)
    kinds = reasons.scan_kinds(findings)
    by_kind: dict[reasons.ReasonKind, list[tuple[str, reasons.Reason]]] = defaultdict(list)
    for module in sorted(missing):
        counters, processes = reasons.summed(records, module)
        evidence = reasons.ModuleEvidence(
            module,
            counters,
            processes,
            settings,
            module in held,
            lru,
            kinds.get(module),
            gap,
            entries=held[module],
            hooked=_hook_mode(hooked[module]),
        )
        why = reasons.explain(evidence)
        by_kind[why.kind].append((module, why))
    return [
        _not_stored(kind, explained, {m: missing[m] for m, _ in explained})
        for kind, explained in sorted(by_kind.items())
    ]


def _hook_mode(modes: set[str]) -> str | None:
    """The hook's mode a module's manifests show: stable where any is (its keys are stable)."""
    return "stable" if "stable" in modes else min(modes, default=None)


_SHOWN = 5  # modules whose evidence a not-stored finding quotes


def _not_stored(
    kind: reasons.ReasonKind,
    explained: list[tuple[str, reasons.Reason]],
    keys: Mapping[str, list[str]],
) -> Finding:
    modules = [m for m, _ in explained]
    quoted = "; ".join(f"{m}: {why.evidence}" for m, why in explained[:_SHOWN])
    if len(explained) > _SHOWN:
        quoted += f"; and {len(explained) - _SHOWN} more modules"
    first = explained[0][1]
    return catalog.NOT_STORED.finding(
        f"{count(len(modules), 'module')} compiled with this cache without an entry "
        f"({kind.value}: {first.summary}): " + ", ".join(modules),
        entries=tuple(k for m in modules for k in keys[m]),
        module=modules[0] if len(modules) == 1 else None,
        each_modules_evidence=quoted,
        the_reasons_advice=reasons.advice(
            first, modules[0] if len(modules) == 1 else "each module"
        ),
    )


def mixtures(entries: list[EntryInfo]) -> list[Finding]:
    findings = []
    ok = [e for e in entries if e.ok]
    formats = Counter(e.format_label for e in ok)
    if len(formats) > 1:
        findings.append(
            catalog.MIXED_VERSIONS.finding(
                "entries in several JAX formats: "
                + ", ".join(f"{n}× {f}" for f, n in formats.most_common()),
                entries=tuple(e.key for e in ok if e.format_label != formats.most_common(1)[0][0]),
            )
        )
    platforms = Counter(e.platform for e in ok)
    if len(platforms) > 1:
        findings.append(
            catalog.MIXED_PLATFORMS.finding(
                "entries for several platforms: "
                + ", ".join(f"{n}× {p}" for p, n in platforms.most_common()),
            )
        )
    return findings


def unknown_files(listing: CacheListing) -> list[Finding]:
    unknown = [i.name for i in listing.of_kind(FileKind.UNKNOWN)]
    if not unknown:
        return []
    return [
        catalog.UNKNOWN_FILE.finding(
            count(len(unknown), "file that is", "files that are") + " not part of a JAX cache",
            entries=tuple(unknown),
        )
    ]
