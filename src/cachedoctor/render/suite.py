"""The pytest plugin's output (``core.suite.SuiteReport``): the tests ranked by compile time,
the totals, and the persistent cache's misses grouped by cause, in ``why``'s words."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cachedoctor.core.suite import SuiteReport, TestCompiles

SUITE_SCHEMA_VERSION = 1
MAX_NAMED = 3  # tests and modules a cause names before "and N more"
MAX_CAUSES = 20  # causes the summary lists; the JSON document has them all


def suite_document(report: SuiteReport) -> dict[str, Any]:
    return {"schema_version": SUITE_SCHEMA_VERSION, "document": "pytest", **report.to_dict()}


def _secs(s: float) -> str:
    return f"{s:.2f}"


def _count(n: int | None) -> str:
    return "?" if n is None else str(n)


def _named(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:MAX_NAMED])
    more = len(names) - MAX_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


def _cache_line(report: SuiteReport, total: TestCompiles) -> str:
    if total.requests is None or total.hits is None:
        unknown = ", ".join(report.missing_events)
        return f"persistent cache: hits and misses unknown (this JAX sends no {unknown})"
    where = report.cache_dir or "not set"
    line = f"persistent cache {where}: {total.requests} lookups, {total.hits} hits,"
    line += f" {total.cache_misses} miss{'es' if total.cache_misses != 1 else ''}"
    if total.hits:
        line += f"; JAX says the hits saved {_secs(max(0.0, total.saved_secs))} s"
    if total.uncached:
        line += f"; {total.uncached} compiles did not ask it"
    return line


def suite_lines(report: SuiteReport, top: int) -> Iterator[str]:
    """The text summary, line by line."""
    total = report.totals
    ran = len(report.tests)
    procs = f" in {report.processes} processes" if report.processes > 1 else ""
    yield (
        f"{ran} test{'s' if ran != 1 else ''}{procs}: {total.compilations} compilations,"
        f" {_secs(total.compile_secs)} s compiling, {_secs(total.trace_secs)} s tracing,"
        f" {_secs(total.lower_secs)} s lowering (jax {report.jax or 'not imported'})"
    )
    if report.outside.compilations:
        yield f"  of them outside tests (collection, between tests): {report.outside.compilations}"
    yield _cache_line(report, total)
    ranked = report.ranked()
    if ranked and top:
        yield ""
        yield (
            f"slowest to compile: trace, lower and compile (top {min(top, len(ranked))} of"
            f" {len(ranked)} that compiled)"
        )
        yield "  total s  compile s  trace s  lower s  compiles  hits  misses  test"
        for t in ranked[:top]:
            yield (
                f"  {_secs(t.compile_secs + t.trace_secs + t.lower_secs):>7}"
                f"  {_secs(t.compile_secs):>9}  {_secs(t.trace_secs):>7}  {_secs(t.lower_secs):>7}"
                f"  {t.compilations:>8}  {_count(t.hits):>4}  {_count(t.cache_misses):>6}"
                f"  {t.nodeid}"
            )
    causes = report.causes()
    if causes:
        yield ""
        yield "misses by cause"
        for g in causes[:MAX_CAUSES]:
            head = g.words if g.verdict == "changed" else f"{g.verdict}: {g.words}"
            yield f"  {g.misses:>4}  {head}"
            yield f"        modules {_named(g.modules)}; tests {_named(g.tests)}"
        if len(causes) > MAX_CAUSES:
            more = causes[MAX_CAUSES:]
            n = sum(g.misses for g in more)
            yield f"  and {len(more)} more causes of {n} misses (in --cachedoctor-json)"
    failed = [t.nodeid for t in report.tests if t.failed_on_miss]
    if failed:
        yield ""
        yield f"--cachedoctor-fail-on-miss failed {len(failed)}: {_named(tuple(failed))}"
