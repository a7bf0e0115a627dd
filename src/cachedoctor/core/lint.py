"""`lint`: the scan's findings judged for CI, with baselines of accepted findings.

Besides the scan's findings, lint reads the hook's stats records (core/stats.py): a module
that compiled in several processes and never hit is a ``never-hit`` finding, an unreadable
record a ``stats-record`` one.

A baseline records *fingerprints*: strings that name a finding's cause, not its instance, so the
same problem keeps the same fingerprint from one CI run to the next. The unstable-key finding of
``jit_f`` names a new random key and a larger entry count on every run; its fingerprint is only
``unstable-key jit_f``. Other findings use their message with the volatile parts (the cache
directory, long hex digests, counts) replaced by placeholders; a corrupt entry keeps its key,
which is that file's identity.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass

from cachedoctor._version import __version__
from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.core.scan.report import ProgressCallback, ScanReport
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.core.stats import record_findings
from cachedoctor.errors import CachedoctorError, count, path_error
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.storage.files import open_regular, write_atomic
from cachedoctor.storage.location import Location

BASELINE_SCHEMA_VERSION = 1
BASELINE_KIND = "cachedoctor-lint-baseline"

_HEX = re.compile(r"\b[0-9a-f]{12,}\b")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)*(?![\w.])")


class BaselineError(CachedoctorError):
    slug = "bad-baseline"


@dataclass(frozen=True)
class LintFinding:
    finding: Finding
    fingerprint: str
    baselined: bool  # accepted by --baseline: reported, never failing
    failing: bool  # at or above --fail-on and not baselined


@dataclass(frozen=True)
class LintReport:
    scan: ScanReport
    fail_on: Severity
    ignored_kinds: tuple[str, ...]
    findings: tuple[LintFinding, ...]  # ignored kinds left out
    ignored: int  # findings dropped by --ignore
    baseline_path: str | None
    fixed: tuple[str, ...]  # baseline fingerprints no finding has any more

    @property
    def failed(self) -> bool:
        return any(f.failing for f in self.findings)

    @property
    def failing(self) -> tuple[LintFinding, ...]:
        return tuple(f for f in self.findings if f.failing)

    def summary_line(self) -> str:
        parts = [
            count(len(self.findings), "finding"),
            f"{len(self.failing)} failing (--fail-on {self.fail_on.label})",
        ]
        baselined = sum(1 for f in self.findings if f.baselined)
        if baselined:
            parts.append(f"{baselined} in baseline")
        if self.fixed:
            parts.append(f"{len(self.fixed)} baselined findings gone")
        if self.ignored:
            parts.append(f"{self.ignored} ignored")
        return f"cachedoctor lint {self.scan.cache_dir}: " + ", ".join(parts)


def parse_kinds(names: Iterable[str]) -> tuple[FindingKind, ...]:
    """``--ignore`` values as kinds; a typo is a usage error, not a silently ignored nothing."""
    kinds = []
    for name in names:
        try:
            kinds.append(FindingKind(name.strip().lower()))
        except ValueError:
            known = ", ".join(k.value for k in FindingKind)
            raise CachedoctorError(
                f"unknown finding kind {name!r} (known: {known})", slug="usage"
            ) from None
    return tuple(kinds)


def fingerprint(finding: Finding, cache_dir: str) -> str:
    """A string that stays the same while the finding's cause stays the same."""
    head = f"{finding.kind.value} {finding.module or '-'}"
    if finding.kind in (FindingKind.UNSTABLE_KEY, FindingKind.NEVER_HIT):
        return head  # each run adds a key and changes the count: the module is the identity
    if finding.kind is FindingKind.CORRUPT and finding.entries:
        return f"{head} {finding.entries[0]}"  # the damaged file itself
    return f"{head} {_stable_text(finding.message, cache_dir)}"


def _stable_text(message: str, cache_dir: str) -> str:
    text = message
    for spelling in sorted({cache_dir, os.path.abspath(cache_dir)}, key=len, reverse=True):
        if spelling:
            text = text.replace(spelling.rstrip("/") or "/", "<dir>")
    text = _HEX.sub("<hex>", text)
    return _NUMBER.sub("N", text)


def load_baseline(path: str | os.PathLike[str]) -> frozenset[str]:
    """Fingerprints from a baseline file; a missing or malformed file is an error (exit 2)."""
    try:
        with open_regular(path) as fh:  # a FIFO or a folder is refused, never waited on
            raw = fh.read().decode("utf-8")
    except OSError as exc:
        raise path_error(exc, path, what="baseline", cls=BaselineError) from None
    except UnicodeDecodeError:
        raise BaselineError(f"{path}: not a cachedoctor lint baseline (binary data)") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise BaselineError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != BASELINE_KIND:
        raise BaselineError(f"{path}: not a cachedoctor lint baseline")
    if data.get("schema_version") != BASELINE_SCHEMA_VERSION:
        raise BaselineError(f"{path}: unsupported baseline schema {data.get('schema_version')!r}")
    items = data.get("findings")
    if not isinstance(items, list) or not all(
        isinstance(i, dict) and isinstance(i.get("fingerprint"), str) for i in items
    ):
        raise BaselineError(f"{path}: 'findings' must be a list of objects with a fingerprint")
    return frozenset(i["fingerprint"] for i in items)


def baseline_document(report: LintReport) -> dict[str, object]:
    """What ``--write-baseline`` stores: fingerprints, with the finding beside each for review."""
    rows: dict[str, dict[str, object]] = {}
    for f in report.findings:
        rows.setdefault(
            f.fingerprint,
            {
                "fingerprint": f.fingerprint,
                "kind": f.finding.kind.value,
                "module": f.finding.module,
                "severity": f.finding.severity.label,
                "message": f.finding.message,
            },
        )
    return {
        "schema_version": BASELINE_SCHEMA_VERSION,
        "kind": BASELINE_KIND,
        "tool": {"name": "cachedoctor", "version": __version__},
        "findings": [rows[k] for k in sorted(rows)],
    }


def write_baseline(path: str | os.PathLike[str], report: LintReport) -> None:
    """Write the baseline atomically (temp file in the same directory, then rename)."""
    write_text_atomic(path, json.dumps(baseline_document(report), indent=2) + "\n")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write a baseline whole; a failure is a one-line error, not a traceback."""
    try:
        write_atomic(path, text.encode("utf-8"))
    except OSError as exc:
        raise path_error(exc, path, what="baseline", verb="write") from None


def judge(
    scan: ScanReport,
    *,
    fail_on: Severity = Severity.ERROR,
    ignore: Iterable[FindingKind] = (),
    baseline: frozenset[str] | None = None,
    baseline_path: str | None = None,
) -> LintReport:
    """Apply --ignore, --fail-on and a baseline to a scan (pure: no I/O)."""
    ignored_kinds = tuple(sorted({k.value for k in ignore}))
    kept: list[LintFinding] = []
    ignored = 0
    for f in scan.findings:
        if f.kind.value in ignored_kinds:
            ignored += 1
            continue
        fp = fingerprint(f, scan.cache_dir)
        accepted = baseline is not None and fp in baseline
        kept.append(
            LintFinding(
                finding=f,
                fingerprint=fp,
                baselined=accepted,
                failing=f.severity >= fail_on and not accepted,
            )
        )
    seen = {f.fingerprint for f in kept}
    fixed = tuple(sorted(baseline - seen)) if baseline is not None else ()
    return LintReport(
        scan=scan,
        fail_on=fail_on,
        ignored_kinds=ignored_kinds,
        findings=tuple(kept),
        ignored=ignored,
        baseline_path=baseline_path,
        fixed=fixed,
    )


def lint_directory(
    cache_dir: Location,
    *,
    fail_on: Severity = Severity.ERROR,
    ignore: Iterable[FindingKind] = (),
    baseline_path: str | None = None,
    progress: ProgressCallback | None = None,
    executor: Executor | None = None,
) -> LintReport:
    """Scan ``cache_dir`` (the entries to read decoded on ``executor`` when given) and judge the
    findings; I/O problems raise ``CachedoctorError``."""
    where = cache_dir
    baseline = load_baseline(baseline_path) if baseline_path else None
    try:
        scan = scan_directory(where, progress=progress, entries=False, executor=executor)
    except OSError as exc:
        raise path_error(exc, where.spelling) from None
    try:
        from_records = record_findings(scan, where)
    except OSError as exc:
        raise path_error(exc, where.subpath(STATS_DIRNAME)) from None
    scan = dataclasses.replace(scan, findings=scan.findings + tuple(from_records))
    return judge(
        scan, fail_on=fail_on, ignore=ignore, baseline=baseline, baseline_path=baseline_path
    )
