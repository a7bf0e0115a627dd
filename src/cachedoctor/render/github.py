"""GitHub Actions workflow commands: one ``::error``/``::warning``/``::notice`` line per finding.

Escaping follows the runner's rules (actions/toolkit ``command.ts``): in the message ``%``,
``\\r`` and ``\\n`` become ``%25``, ``%0D``, ``%0A``; property values also escape ``:`` and
``,`` (``%3A``, ``%2C``), which would otherwise end the value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from cachedoctor.core.check.report import CheckReport
from cachedoctor.core.findings import Severity
from cachedoctor.core.lint import LintReport
from cachedoctor.core.preflight import PreflightReport

LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, properties: Mapping[str, str] | None = None) -> str:
    """One workflow command line, e.g. ``::warning title=x::message``."""
    props = ",".join(f"{k}={escape_property(v)}" for k, v in (properties or {}).items() if v)
    return f"::{level}{' ' + props if props else ''}::{escape_data(message)}"


def lint_lines(report: LintReport) -> Iterator[str]:
    """Annotations for a lint report: failing findings as errors, the rest by severity."""
    for lf in report.findings:
        f = lf.finding
        if lf.failing:
            level = "error"
        elif lf.baselined:
            level = "notice"
        else:
            level = LEVELS[f.severity]
        title = f"cachedoctor {f.kind.value}" + (f" ({f.module})" if f.module else "")
        if lf.baselined:
            title += " [baseline]"
        yield command(level, f"{f.message}\n→ {f.advice}", {"title": title})
    for fp in report.fixed:
        yield command(
            "notice",
            f"baselined finding is gone: {fp}; rewrite the baseline with --write-baseline",
            {"title": "cachedoctor baseline"},
        )
    yield report.summary_line()


def check_lines(report: CheckReport) -> Iterator[str]:
    """Annotations for a check report: one error per unstable module or stale entry, or for a
    failed run of CMD; one warning per module JAX would not store."""
    if report.command_failed is not None:
        yield command(
            "error",
            report.command_failed.message,
            {"title": f"cachedoctor check: run {report.command_failed.run} failed"},
        )
    for n in report.refused:
        yield command(
            "warning",
            f"{n.summary}; it is compiled afresh every run\n{n.evidence}\n→ {n.advice}",
            {"title": f"cachedoctor check: not stored ({n.module})"},
        )
    for m in report.unstable:
        yield command(
            "error",
            "\n".join(m.explanation_lines()),
            {"title": f"cachedoctor check: unstable cache key ({m.module})"},
        )
    if report.verify is not None:
        for c in report.verify.stale:
            yield command(
                "error",
                f"{c.detail}\nentries: {c.entries}",
                {"title": f"cachedoctor check --verify ({c.module})"},
            )
        for module in report.verify.not_checked:
            yield command(
                "warning",
                f"not checked: {report.verify.reason}",
                {"title": f"cachedoctor check --verify ({module})"},
            )
    yield report.summary_line()


def preflight_lines(report: PreflightReport) -> Iterator[str]:
    """Annotations for a preflight: an error per module that will miss, a notice per module it
    cannot tell about (an error with ``--strict``), then the text report for the log."""
    from cachedoctor.render.preflight import preflight_lines as text_lines

    if report.problem:
        yield command("error", report.problem, {"title": "cachedoctor preflight"})
    for m in report.modules:
        if m.verdict == "miss" or (m.verdict == "unknown" and report.strict):
            level = "error"
        elif m.verdict == "unknown":
            level = "notice"
        else:
            continue
        said = "will miss" if m.verdict == "miss" else "cannot tell"
        yield command(
            level, f"{m.module} {said}: {m.words}", {"title": f"cachedoctor preflight ({m.module})"}
        )
    yield from text_lines(report)
