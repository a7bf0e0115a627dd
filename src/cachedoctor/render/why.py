"""``cachedoctor why`` output: each recorded miss and what differs from the nearest earlier key
(``core.why.WhyReport``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from cachedoctor.core.why import ENABLE_HINT, WhyReport

WHY_SCHEMA_VERSION = 1


def why_document(report: WhyReport) -> dict[str, Any]:
    return {"schema_version": WHY_SCHEMA_VERSION, **report.to_dict()}


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + " UTC"


def why_lines(report: WhyReport) -> Iterator[str]:
    """The text report, line by line: per miss, its module, key, when, and the causes."""
    misses = report.misses
    explained = sum(1 for m in misses if m.verdict in ("changed", "same-key"))
    yield (
        f"{report.where}: {len(misses)} recorded miss{'es' if len(misses) != 1 else ''}"
        f" in {report.records} process record{'s' if report.records != 1 else ''},"
        f" {explained} explained"
    )
    for read in report.caches:
        if read.folders == [report.where] and not read.read_only_runs:
            continue  # a cache's own records, in it: nothing to say
        runs = f"{read.records} process record{'s' if read.records != 1 else ''}"
        by = f", {read.read_only_runs} of read-only runs" if read.read_only_runs else ""
        yield f"records of the cache {read.cache}: {runs}{by}, from {', '.join(read.folders)}"
    if not report.records:
        yield f"no process recorded its lookups: {ENABLE_HINT}"
    for m in misses:
        yield ""
        yield f"{m.module}  {m.key.rsplit('-', 1)[-1][:16]}  {_when(m.time)}  {m.host}"
        if m.verdict == "changed" and m.nearest:
            held = "in the cache" if m.nearest_in_cache else "no longer in the cache"
            held = held if m.cache_read else "the cache not read"
            when = _when(m.nearest_time) if m.nearest_time else "?"
            yield f"  vs {m.nearest.rsplit('-', 1)[-1][:16]} ({when}, {held}):"
            for c in m.changes:
                yield f"  - {c.words}  [{c.component}]"
        else:
            yield f"  {m.verdict}: {m.words}"
    if report.unrecorded:
        yield ""
        total = sum(report.unrecorded.values())
        names = ", ".join(sorted(report.unrecorded)[:5])
        yield (
            f"{total} more miss{'es' if total != 1 else ''} ({names}) have no recorded key"
            " components (records from before they were kept, or a key JAX's code did not"
            f" give again): {ENABLE_HINT}"
        )
    for f in report.findings:
        yield f"finding: {f.kind}: {f.message}"
