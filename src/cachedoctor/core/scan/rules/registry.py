"""``scan``'s rules: one interface, :class:`ScanRule`, and one ordered registry, :data:`SCAN_RULES`.

Each rule names the finding kinds it raises, and so its entries of the catalog
(``core/catalog_entries.BY_KIND``), as ruff binds a rule to its page: a rule that raises a kind
it does not name fails the scan (:func:`run_rules`), and tests/core/scan/test_registry.py fails
on a kind of scan's no rule names and on a rule that names no entry. Kinds raised outside scan
(the stats records') say so in their entry (``CatalogEntry.raised_by``).

The order is the order the rules run in, and so the order of findings that ``build_report``'s
stable sort leaves tied (severity, kind, module, entries): keep it, the text and the JSON show it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.listdir import CacheListing
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.findings import Finding, FindingKind
from cachedoctor.core.scan.rules.integrity import (
    atime_findings,
    corrupt_findings,
    load_failure_findings,
)
from cachedoctor.core.scan.rules.inventory import (
    mixtures,
    not_stored_findings,
    subcache_findings,
    unknown_files,
)
from cachedoctor.core.scan.rules.keys import (
    kernel_location_findings,
    observe_manifest_keys,
    relocated_findings,
    same_program_findings,
    stable_hasher_keys,
)
from cachedoctor.core.scan.rules.lrucost import lru_write_cost_findings
from cachedoctor.core.scan.rules.processes import first_process_only, process_findings
from cachedoctor.core.scan.rules.security import insecure_findings
from cachedoctor.core.usage.model import Record
from cachedoctor.xla import subcaches

K = FindingKind


@dataclass(frozen=True)
class ScanInput:
    """What the scan has when its rules run; a rule reads it and does no I/O."""

    listing: CacheListing
    entries: list[EntryInfo]
    jax_info: JaxInfo
    now: float
    sub: subcaches.SubcacheReport | None
    manifests: Sequence[Mapping[str, object] | None]  # the key manifests, as JSON data
    records: Sequence[Record]  # the stats records
    root_as_given: str  # the cache dir as the user spelled it (JAX hashes paths as spelled)
    # the records and those ``stats --zero`` archived: JAX's failed loads stay evidence after it
    evidence_records: Sequence[Record] = ()


@dataclass(frozen=True)
class ScanRule:
    """One rule of scan: the kinds it raises (its catalog entries) and what raises them.

    ``run`` takes the scan's input and the findings of the rules before it (``not-stored``
    names an unstable key as a module's reason), and returns its findings."""

    name: str
    kinds: tuple[FindingKind, ...]
    run: Callable[[ScanInput, Sequence[Finding]], list[Finding]]


SCAN_RULES: tuple[ScanRule, ...] = (
    ScanRule("subcache", (K.SUBCACHE,), lambda s, _: subcache_findings(s.sub)),
    ScanRule(
        "same-program",
        (K.UNSTABLE_KEY, K.SAME_PROGRAM),
        lambda s, _: same_program_findings(s.entries, s.manifests),
    ),
    ScanRule(
        "kernel-locations",
        (K.KERNEL_LOCATIONS,),
        lambda s, _: kernel_location_findings(s.entries, s.jax_info),
    ),
    ScanRule(
        "relocated",
        (K.RELOCATED, K.MIXED_VERSIONS),  # mixed-versions: entries of another jaxlib
        lambda s, _: relocated_findings(
            s.root_as_given,
            s.entries,
            s.jax_info,
            stable_hasher_keys(s.manifests),
            frozenset() if s.listing.remote else observe_manifest_keys(s.manifests),  # rekey's
        ),
    ),
    ScanRule(
        "not-stored",
        (K.NOT_STORED,),
        lambda s, earlier: not_stored_findings(
            s.listing, first_process_only(s.manifests), s.records, earlier
        ),
    ),
    ScanRule("processes", (K.MULTI_PROCESS,), lambda s, _: process_findings(s.manifests)),
    ScanRule(
        "atime", (K.MISSING_ATIME, K.ORPHAN), lambda s, _: atime_findings(s.listing, s.jax_info)
    ),
    ScanRule(
        "lru-write-cost", (K.LRU_WRITE_COST,), lambda s, _: lru_write_cost_findings(s.listing)
    ),
    ScanRule(
        "corrupt",
        (K.CORRUPT, K.UNREADABLE, K.UNKNOWN_LAYOUT),
        lambda s, _: (
            corrupt_findings(s.entries, s.now)
            + load_failure_findings(s.entries, s.listing, s.evidence_records)
        ),
    ),
    ScanRule("insecure", (K.INSECURE,), lambda s, _: insecure_findings(s.listing)),
    ScanRule("mixtures", (K.MIXED_VERSIONS, K.MIXED_PLATFORMS), lambda s, _: mixtures(s.entries)),
    ScanRule("unknown-file", (K.UNKNOWN_FILE,), lambda s, _: unknown_files(s.listing)),
)


def run_rules(scan: ScanInput, rules: Sequence[ScanRule] = SCAN_RULES) -> list[Finding]:
    """Every rule's findings, in the registry's order. A finding of a kind its rule does not
    name is a bug of the rule (its catalog binding would lie), raised as such."""
    findings: list[Finding] = []
    for rule in rules:
        found = rule.run(scan, tuple(findings))
        stray = sorted({f.kind.value for f in found} - set(rule.kinds))
        if stray:
            raise ValueError(f"scan rule {rule.name} raised {', '.join(stray)}: not its kinds")
        findings += found
    return findings
