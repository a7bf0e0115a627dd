"""Text and JSON output of the CI commands, ``lint`` and ``check``."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from cachedoctor._version import __version__
from cachedoctor.core.check.report import CheckReport
from cachedoctor.core.lint import LintReport
from cachedoctor.core.scan.report import SCHEMA_VERSION
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
            + (" (--verify)" if run.verify else "")
        )
    console.print(f"observe: {report.observe.detail}")
    if report.verify is not None:
        v = report.verify
        for mm in v.mismatches:
            style = "dim" if mm.stale is False else "bold red"
            label = "STALE" if mm.stale else ("UNCLEAR" if mm.stale is None else "nondeterministic")
            console.print(Text(f"{label} {mm.key}: {mm.detail}", style=style))
        if not v.complete:
            console.print(
                f"verify: JAX stopped run {v.run} at the first mismatch; "
                f"{len(v.not_checked)} modules were not checked (neither hit nor miss is known)"
            )
            for module in v.not_checked:
                console.print(Text(f"NOT CHECKED {module}", style="yellow"))
        elif not v.mismatches:
            console.print(
                f"verify: run {v.run} recompiled every cache hit and compared it with the cached "
                f"executable ({len(v.hit_modules)} modules hit, {v.entries_before} entries "
                "before the run): no difference"
            )
    for module in report.not_stored:
        console.print(
            Text(
                f"NOT STORED {module}: JAX does not write cache entries for modules that use "
                "host callbacks (pure_callback, io_callback, jax.debug.print, equinox checks), "
                "so it recompiles every run",
                style="yellow",
            )
        )
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
        "verify": to_plain(report.verify),
        "not_stored": list(report.not_stored),
        "per_process": [
            {"module": m, "process_index": p, "fields": list(f)} for m, p, f in report.per_process
        ],
    }
