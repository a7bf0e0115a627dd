"""Findings: what is wrong, how badly, what to do, and the evidence the verdict rests on.

Shared by every command that judges a cache (scan, lint, stats, check); each finding kind is
one member of FindingKind, and one CatalogEntry of the table in core/catalog.py: its family, the
cases it is raised in (severity, evidence, advice), and an example. Findings are made by the
table's cases (``Case.finding``), so what a rule says and what docs/findings.md says are one text.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


class FindingKind(enum.StrEnum):
    UNSTABLE_KEY = "unstable-key"
    KERNEL_LOCATIONS = "kernel-locations"  # Pallas kernels' keys differing in debug locations only
    RELOCATED = "relocated"
    MISSING_ATIME = "missing-atime"
    CORRUPT = "corrupt"
    UNREADABLE = "unreadable"
    UNKNOWN_LAYOUT = "unknown-layout"  # a payload layout the reader does not know: no verdict
    ORPHAN = "orphan"
    INSECURE = "insecure"
    MIXED_VERSIONS = "mixed-versions"
    MIXED_PLATFORMS = "mixed-platforms"
    UNKNOWN_FILE = "unknown-file"
    SUBCACHE = "subcache"
    NEVER_HIT = "never-hit"  # from the stats records (core/stats.py)
    MISSED = "missed"  # a module's recorded misses, and what changed in JAX's key (core/why.py)
    STATS_RECORD = "stats-record"  # a torn, foreign or rule-breaking file in cachedoctor-stats/
    SAME_PROGRAM = "same-program"
    NOT_STORED = "not-stored"
    MULTI_PROCESS = "multi-process"  # processes of a jax.distributed job (their manifests)
    LRU_WRITE_COST = "lru-write-cost"  # what JAX's LRU eviction pass costs each write here


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    severity: Severity
    message: str  # what is wrong, naming the module or file
    advice: str  # one line: what the user should do
    evidence: str  # what the verdict rests on: files, stored bytes, manifests, times
    entries: tuple[str, ...] = ()  # keys (or file names for non-entries) involved
    module: str | None = None


class Family(enum.StrEnum):
    """What a finding kind is about; docs/findings.md groups the kinds by it."""

    KEYS = "keys"  # the keys JAX computes: unstable, relocated, several for one program
    INTEGRITY = "integrity"  # damaged or incomplete files
    SECURITY = "security"  # who can write what JAX loads and runs
    INVENTORY = "inventory"  # what the cache holds besides sound entries
    PROCESSES = "processes"  # the processes of a jax.distributed job
    USAGE = "usage"  # the processes' stats records (cachedoctor-stats/)


class Producer(enum.StrEnum):
    """What raises a finding kind: its catalog entry's binding to the code, which the tests hold
    both ways (tests/core/scan/test_registry.py, tests/core/test_catalog.py)."""

    SCAN = "scan"  # a rule of core/scan/rules/registry.SCAN_RULES, over the listing and entries
    # the stats records: core/usage/records.py (each file as it is read), core/stats.py (never-hit)
    STATS_RECORDS = "stats-records"

    @property
    def commands(self) -> tuple[str, ...]:
        """The commands that show its findings (docs/findings.md's "raised by")."""
        return ("scan", "lint") if self is Producer.SCAN else ("stats", "lint")


_FIELD = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Case:
    """One way a finding kind is raised: when, at what severity, on what evidence, with what
    advice. ``evidence`` and ``advice`` are templates: the rule raising the finding fills their
    ``{fields}`` (a path, a module, a reason's own advice), the table holds the rest."""

    kind: FindingKind
    when: str  # the condition, one clause
    severity: Severity
    evidence: str
    advice: str
    otherwise: tuple[tuple[Severity, str], ...] = ()  # another severity, and when it is used

    def fields(self) -> set[str]:
        return set(_FIELD.findall(self.evidence + " " + self.advice))

    def finding(
        self,
        message: str,
        *,
        entries: tuple[str, ...] = (),
        module: str | None = None,
        severity: Severity | None = None,
        **fill: str,
    ) -> Finding:
        """The finding of this case; ``severity`` only as one of ``otherwise``'s."""
        return self.filled(message, fill, entries=entries, module=module, severity=severity)

    def filled(
        self,
        message: str,
        fill: Mapping[str, str],
        *,
        entries: tuple[str, ...] = (),
        module: str | None = None,
        severity: Severity | None = None,
    ) -> Finding:
        """``finding`` with the template's fields in a mapping (``{module}`` is the module)."""
        if severity is not None and severity not in (self.severity, *dict(self.otherwise)):
            raise ValueError(f"{self.kind.value}: {severity.label} is not a severity of {self}")
        values = {"module": module or "", **fill}
        return Finding(
            kind=self.kind,
            severity=self.severity if severity is None else severity,
            message=message,
            advice=self.advice.format_map(values),
            evidence=self.evidence.format_map(values),
            entries=entries,
            module=module,
        )


@dataclass(frozen=True)
class Example:
    """A finding as a cache raised it (docs/findings.md prints it as scan does)."""

    case: Case
    message: str
    fill: tuple[tuple[str, str], ...] = ()
    severity: Severity | None = None
    module: str | None = None

    def finding(self) -> Finding:
        return self.case.filled(
            self.message, dict(self.fill), module=self.module, severity=self.severity
        )


@dataclass(frozen=True)
class CatalogEntry:
    """One finding kind: the entry of the table (core/catalog.py) docs/findings.md is made of.

    Not a rule: the rules (core/scan/rules/) raise the findings its cases word."""

    kind: FindingKind
    family: Family
    summary: str  # one line: what it finds
    what: str  # what it does, in full
    why: str  # why it matters
    cases: tuple[Case, ...]
    example: Example
    raised_by: Producer = Producer.SCAN

    def __post_init__(self) -> None:
        if not self.cases or any(c.kind is not self.kind for c in self.cases):
            raise ValueError(f"entry {self.kind.value}: its cases must be of its kind")
        if self.example.case not in self.cases:
            raise ValueError(f"entry {self.kind.value}: its example is not one of its cases")

    @property
    def severity(self) -> Severity:
        """The default severity: its first case's."""
        return self.cases[0].severity
