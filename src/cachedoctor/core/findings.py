"""Findings: what is wrong, how badly, what to do, and the evidence the verdict rests on.

Shared by every command that judges a cache (scan, lint, stats, check); each finding kind is
one member of FindingKind.
"""

from __future__ import annotations

import enum
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
    RELOCATED = "relocated"
    MISSING_ATIME = "missing-atime"
    CORRUPT = "corrupt"
    UNREADABLE = "unreadable"
    ORPHAN = "orphan"
    INSECURE = "insecure"
    MIXED_VERSIONS = "mixed-versions"
    MIXED_PLATFORMS = "mixed-platforms"
    UNKNOWN_FILE = "unknown-file"
    SUBCACHE = "subcache"
    NEVER_HIT = "never-hit"  # from the stats records (core/stats.py)
    STATS_RECORD = "stats-record"  # a torn, foreign or rule-breaking file in cachedoctor-stats/
    SAME_PROGRAM = "same-program"
    NOT_STORED = "not-stored"
    MULTI_PROCESS = "multi-process"  # processes of a jax.distributed job (their manifests)


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    severity: Severity
    message: str  # what is wrong, naming the module or file
    advice: str  # one line: what the user should do
    evidence: str  # what the verdict rests on: files, stored bytes, manifests, times
    entries: tuple[str, ...] = ()  # keys (or file names for non-entries) involved
    module: str | None = None
