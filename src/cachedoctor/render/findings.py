"""The findings as a list for a terminal: one line each, then its advice and evidence (scan's,
lint's and the stats records'; no import of the scan's report, so ``stats`` goes without it)."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

from cachedoctor.core.findings import Finding, Severity
from cachedoctor.errors import count
from cachedoctor.render.console import Line, print_lines

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def render_finding_list(findings: Sequence[Finding], console: Console) -> None:
    """One line per finding, then its advice and evidence; consecutive findings of one kind with
    the same advice and evidence (thousands of same-program findings in a large cache) share
    one advice and one evidence line, under the last of them (scan's, and the stats records')."""
    if not findings:
        console.print(Text("no findings", style="green"))
        return
    console.print(Text(count(len(findings), "finding"), style="bold"))
    lines: list[Line] = []
    for group in _runs(findings):
        for f in group:
            severity = (f"{f.severity.label:7} ", SEVERITY_STYLE[f.severity])
            lines.append([severity, (f"{f.kind.value:15} ", "bold"), (f.message, None)])
        shared = f"(the {len(group):,} above) " if len(group) > 1 else ""
        lines.append([(f"        → {shared}{group[0].advice}", "dim")])
        lines.append([(f"        evidence: {shared}{group[0].evidence}", "dim")])
    (text, style), *_ = lines[-1]
    lines[-1] = [(text.rstrip(), style)]  # the end, as Text.rstrip did
    print_lines(console, lines, soft_wrap=True)


def _runs(findings: Sequence[Finding]) -> list[list[Finding]]:
    """Consecutive findings of the same severity and kind, with the same advice and evidence."""
    same = operator.attrgetter("severity", "kind", "advice", "evidence")
    return [list(run) for _, run in itertools.groupby(findings, key=same)]
