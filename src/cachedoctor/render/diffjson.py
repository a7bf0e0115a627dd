"""JSON documents of ``cachedoctor diff`` (``schema_version`` as every other document)."""

from __future__ import annotations

from typing import Any

from cachedoctor._version import __version__
from cachedoctor.core.diff.report import DiffReport, ModuleDiffReport
from cachedoctor.core.scan.report import SCHEMA_VERSION
from cachedoctor.render.jsonout import to_plain


def _report(report: DiffReport) -> dict[str, Any]:
    data: dict[str, Any] = to_plain(report)
    data["equivalent"] = report.equivalent
    return data


def diff_document(report: DiffReport) -> dict[str, Any]:
    """One A-vs-B diff; ``verdict`` comes first after the envelope."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "cachedoctor", "version": __version__},
        "document": "diff",
        **_report(report),
    }


def module_document(report: ModuleDiffReport) -> dict[str, Any]:
    """Every entry of one module against the most recent one."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "cachedoctor", "version": __version__},
        "document": "diff-module",
        "module": report.module,
        "cache_dir": report.cache_dir,
        "latest": report.latest,
        "equivalent": report.equivalent,
        "diffs": [_report(r) for r in report.reports],
        "undecodable": list(report.undecodable),
    }
