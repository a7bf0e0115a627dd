"""Text and JSON output of the CI commands, ``lint`` and ``check``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from cachedoctor._version import __version__
from cachedoctor.core.check.report import CheckReport, NotStored, Outcome, VerifyResult
from cachedoctor.core.lint import LintReport
from cachedoctor.core.scan.report import SCHEMA_VERSION
from cachedoctor.errors import count
from cachedoctor.render.console import Line, print_lines
from cachedoctor.render.jsonout import finding_dict, to_plain
from cachedoctor.render.table import SEVERITY_STYLE


def render_lint(report: LintReport, console: Console) -> None:
    """Each finding's line, advice and evidence, and the baseline's fixed ones, printed in few
    calls (each line wrapped as if printed alone), then the summary."""
    if not report.findings:
        console.print(Text("no findings", style="green"))
    lines: list[Line] = []
    for lf in report.findings:
        f = lf.finding
        mark = "FAIL" if lf.failing else ("base" if lf.baselined else "  ok")
        lines.append(
            [
                (f"{mark} ", "bold red" if lf.failing else "dim"),
                (f"{f.severity.label:7} ", SEVERITY_STYLE[f.severity]),
                (f"{f.kind.value:15} ", "bold"),
                (f.message, None),
            ]
        )
        lines.append([(f"     → {f.advice}", "dim")])
        lines.append([(f"     evidence: {f.evidence}", "dim")])
    for fp in report.fixed:
        lines.append([(f"gone from the cache, still in the baseline: {fp}", "cyan")])
    print_lines(console, lines)
    console.print(Text(report.summary_line(), style="bold"))


def lint_document(report: LintReport) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "cachedoctor", "version": __version__},
        "command": "lint",
        "cache_dir": report.scan.cache_dir,
        "fail_on": report.fail_on.label,
        "failed": report.failed,
        "ignored_kinds": list(report.ignored_kinds),
        "ignored": report.ignored,
        "baseline": report.baseline_path,
        "baseline_fixed": list(report.fixed),
        "findings": [
            {
                **finding_dict(lf.finding),
                "fingerprint": lf.fingerprint,
                "failing": lf.failing,
                "baselined": lf.baselined,
            }
            for lf in report.findings
        ],
    }


def render_check(report: CheckReport, console: Console) -> None:
    for run in report.runs:
        new = len(run.new_keys)
        console.print(
            f"run {run.index}: exit {run.returncode}, {run.seconds:.1f} s, "
            f"{new} new {'entry' if new == 1 else 'entries'}"
        )
    console.print(f"observe: {report.observe.detail}")
    if report.verify is not None:
        _render_verify(report.verify, console)
    for line in not_stored_lines(report.refused):
        console.print(Text(line, style="yellow") if line.startswith("NOT STORED") else line)
    if report.command_failed is not None:
        console.print(Text(f"COMMAND FAILED {report.command_failed.message}", style="bold red"))
    for m in report.unstable:
        lines = m.explanation_lines()
        label = "PROGRAM CHANGES" if m.program_changes else "UNSTABLE"
        console.print(Text(f"{label} {lines[0]}", style="bold red"))
        for line in lines[1:]:
            console.print(f"  {line}")
        for key in m.keys:
            console.print(Text(f"    {key}", style="dim"))
    where = report.cache_dir if report.kept else f"{report.cache_dir} (removed; --keep keeps it)"
    if not report.temporary:
        where = report.cache_dir
    console.print(f"cache: {where}")
    if report.log_path:
        console.print(f"log: {report.log_path}")
    style = "bold red" if report.failed else "bold green"
    console.print(Text(report.summary_line(), style=style))


def not_stored_lines(refused: Sequence[NotStored]) -> list[str]:
    """Each module JAX would not store: JAX's reason, what it rests on, JAX's line, advice."""
    lines = []
    for n in refused:
        lines.append(f"NOT STORED {n.module}: {n.summary}; it is compiled afresh every run")
        lines.append(f"  evidence ({n.source}): {n.evidence}")
        if n.jax_log and n.source != "JAX's log":
            lines.append(f"  JAX's log: {n.jax_log}")
        lines.append(f"  → {n.advice}")
    return lines


def _render_verify(v: VerifyResult, console: Console) -> None:
    """Each key the verify run compared (the pair on an ``entries:`` line), then what is left."""
    same = sum(1 for c in v.checks if c.outcome == Outcome.SAME)
    missing = sum(1 for c in v.checks if c.outcome == Outcome.NOT_CACHED)
    console.print(
        f"run {v.run} (--verify): exit {v.returncode}, {v.seconds:.1f} s; compiled "
        f"{count(len(v.checks), 'key')} afresh with the cache read, not trusted: {same} hold "
        f"the same program, {len(v.stale)} another or unknown, {missing} not in the cache"
    )
    for c in v.checks:
        if c.outcome in (Outcome.STALE, Outcome.UNKNOWN):
            label = "STALE" if c.outcome == Outcome.STALE else "UNKNOWN"
            console.print(Text(f"{label} {c.module}: {c.detail}", style="bold red"))
            console.print(f"  entries: {c.entries}")
    for module in v.not_checked:
        console.print(Text(f"NOT CHECKED {module}: {v.reason}", style="yellow"))


def check_document(report: CheckReport) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "cachedoctor", "version": __version__},
        "command": "check",
        "argv": list(report.argv),
        "cache_dir": report.cache_dir,
        "temporary": report.temporary,
        "kept": report.kept,
        "log": report.log_path,
        "failed": report.failed,
        "runs": to_plain(report.runs),
        "modules": list(report.modules),
        "compiled_in_run1": list(report.compiled_in_run1),
        "nothing_checked": report.nothing_checked,
        "unstable": [
            {**to_plain(m), "explanation": m.explanation_lines()} for m in report.unstable
        ],
        "observe": to_plain(report.observe),
        "verify": _verify_dict(report.verify),
        "not_stored": list(report.not_stored),
        "not_stored_reasons": [to_plain(n) for n in report.refused],
        "command_failed": to_plain(report.command_failed),
        "per_process": [
            {"module": m, "process_index": p, "fields": list(f)} for m, p, f in report.per_process
        ],
    }


def _verify_dict(verify: VerifyResult | None) -> dict[str, Any] | None:
    if verify is None:
        return None
    return {
        **to_plain(verify),
        "complete": verify.complete,
        "checks": [{**to_plain(c), "stale": c.stale} for c in verify.checks],
        "stale": [c.key for c in verify.stale],
        "verified_modules": list(verify.verified_modules),
    }
