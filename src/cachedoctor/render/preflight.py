"""``cachedoctor preflight`` output: per module, will JAX here hit it, and on what evidence
(``core.preflight.PreflightReport``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cachedoctor.core.preflight import PreflightReport
from cachedoctor.core.why import ENABLE_HINT

PREFLIGHT_SCHEMA_VERSION = 1
_SAID = {
    "hit": "will hit",
    "miss": "will miss",
    "unknown": "cannot tell",
}


def preflight_document(report: PreflightReport) -> dict[str, Any]:
    return {"schema_version": PREFLIGHT_SCHEMA_VERSION, **report.to_dict()}


def preflight_lines(report: PreflightReport) -> Iterator[str]:
    """A heading with this environment, then one line per module, worst first, with its cause."""
    if report.problem:
        yield f"{report.where}: cannot predict: {report.problem}"
        return
    here = report.here or {}
    spelled = "" if report.cache_dir == report.where else f" (as {report.cache_dir})"
    yield (
        f"{report.where}{spelled}: here jax {here.get('jax')}, jaxlib {here.get('jaxlib')},"
        f" {here.get('device_count')} {'/'.join(here.get('device_kinds', []))} devices,"
        f" hook {report.hook}"
    )
    counts = report.counts()
    said = ", ".join(f"{counts[v]} {_SAID[v]}" for v in _SAID if counts[v])
    n = len(report.modules)
    yield f"{n} module{'s' if n != 1 else ''}: {said or 'none'}"
    order = {"miss": 0, "unknown": 1, "hit": 2}
    for m in sorted(report.modules, key=lambda m: (order[m.verdict], m.module)):
        entries = f"{m.entries} entr{'y' if m.entries == 1 else 'ies'}"
        yield f"  {_SAID[m.verdict]:<14} {m.module} ({entries}): {m.words}"
    if report.needs_records():
        yield f"cannot tell: {ENABLE_HINT}"
