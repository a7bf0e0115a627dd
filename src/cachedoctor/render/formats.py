"""One renderer interface and one registry of output formats (pip-audit's ``_format`` model).

Every format implements one method, ``render(report, console)``; ``FORMATS`` maps the names the
commands accept (``--format``/``--json``) to them. A format knows each kind of report (scan,
lint, check, plan, diff, module diff) by its class name and imports the per-format function
(``table``, ``jsonout``, ``ci``, ``github``, ``junit``, ``plan``, ``difftext``, ``diffjson``) only
when it writes that report, so rendering a scan loads no diff or check code.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console

if TYPE_CHECKING:
    from cachedoctor.core.prune.actions import ApplyReport, Plan


class Renderer(Protocol):
    """One output format."""

    @property
    def name(self) -> str:
        """The name the commands accept."""

    def render(self, report: Any, console: Console) -> None:
        """Write ``report`` to ``console`` (machine formats write plain text to its file)."""


@dataclass(frozen=True)
class PlanReport:
    """What ``prune`` and ``rekey`` show: the plan, and what applying it did (None: dry run)."""

    plan: Plan
    result: ApplyReport | None = None


Writer = Callable[[Any, Console], None]


@dataclass(frozen=True)
class Format:
    """A format as a table of writers, one per kind of report it supports."""

    name: str
    writers: Mapping[str, Writer] = field(repr=False)

    def render(self, report: Any, console: Console) -> None:
        writer = self.writers.get(type(report).__name__)
        if writer is None:
            raise TypeError(f"no {self.name} output for a {type(report).__name__}")
        writer(report, console)


def renderer(name: str, *, max_modules: int = 25) -> Renderer:
    """The format called ``name``; ``max_modules`` bounds the scan table's module rows."""
    if name == "text":
        return Format("text", {**TEXT_WRITERS, "ScanReport": _scan_table(max_modules)})
    return FORMATS[name]


def render_to_string(report: Any, name: str) -> str:
    """The report as text for a file (``-o FILE``): no colour, 120 columns."""
    buf = io.StringIO()
    renderer(name).render(report, Console(file=buf, width=120, no_color=True, highlight=False))
    return buf.getvalue()


def _write(console: Console, text: str) -> None:
    """Machine output goes to the console's file as it is (no markup, wrapping or colour)."""
    console.file.write(text if text.endswith("\n") else text + "\n")
    console.file.flush()


# --- text ------------------------------------------------------------------------------------


def _scan_table(max_modules: int) -> Writer:
    def write(report: Any, console: Console) -> None:
        from cachedoctor.render.table import render_scan

        render_scan(report, console, max_modules=max_modules)

    return write


def _lint_text(report: Any, console: Console) -> None:
    from cachedoctor.render.ci import render_lint

    render_lint(report, console)


def _check_text(report: Any, console: Console) -> None:
    from cachedoctor.render.ci import render_check

    render_check(report, console)


def _plan_text(report: PlanReport, console: Console) -> None:
    from cachedoctor.render.plan import render_plan

    render_plan(report.plan, console, result=report.result)


def _diff_text(report: Any, console: Console) -> None:
    from cachedoctor.render.difftext import render_diff

    render_diff(report, console)


def _module_diff_text(report: Any, console: Console) -> None:
    from cachedoctor.render.difftext import render_module

    render_module(report, console)


TEXT_WRITERS: Mapping[str, Writer] = {
    "ScanReport": _scan_table(25),
    "LintReport": _lint_text,
    "CheckReport": _check_text,
    "PlanReport": _plan_text,
    "DiffReport": _diff_text,
    "ModuleDiffReport": _module_diff_text,
}


# --- json ------------------------------------------------------------------------------------


def _json(document: Callable[[Any], dict[str, Any]]) -> Writer:
    def write(report: Any, console: Console) -> None:
        from cachedoctor.render.jsonout import dumps

        _write(console, dumps(document(report)))

    return write


def _scan_json(report: Any, console: Console) -> None:
    """Streamed, one entry at a time: a 50k-entry document is never held whole."""
    from cachedoctor.render.jsonout import iter_scan_json

    for piece in iter_scan_json(report):
        console.file.write(piece)
    console.file.write("\n")
    console.file.flush()


def _lint_document(report: Any) -> dict[str, Any]:
    from cachedoctor.render.ci import lint_document

    return lint_document(report)


def _check_document(report: Any) -> dict[str, Any]:
    from cachedoctor.render.ci import check_document

    return check_document(report)


def _plan_document(report: PlanReport) -> dict[str, Any]:
    from cachedoctor.render.plan import plan_document

    return plan_document(report.plan, report.result)


def _diff_document(report: Any) -> dict[str, Any]:
    from cachedoctor.render.diffjson import diff_document

    return diff_document(report)


def _module_diff_document(report: Any) -> dict[str, Any]:
    from cachedoctor.render.diffjson import module_document

    return module_document(report)


# --- github, junit (CI commands only) ----------------------------------------------------------


def _lint_github(report: Any, console: Console) -> None:
    from cachedoctor.render.github import lint_lines

    _write(console, "\n".join(lint_lines(report)))


def _check_github(report: Any, console: Console) -> None:
    from cachedoctor.render.github import check_lines

    _write(console, "\n".join(check_lines(report)))


def _lint_junit(report: Any, console: Console) -> None:
    from cachedoctor.render.junit import lint_xml

    _write(console, lint_xml(report))


def _check_junit(report: Any, console: Console) -> None:
    from cachedoctor.render.junit import check_xml

    _write(console, check_xml(report))


FORMATS: Mapping[str, Renderer] = {
    "text": Format("text", TEXT_WRITERS),
    "json": Format(
        "json",
        {
            "ScanReport": _scan_json,
            "LintReport": _json(_lint_document),
            "CheckReport": _json(_check_document),
            "PlanReport": _json(_plan_document),
            "DiffReport": _json(_diff_document),
            "ModuleDiffReport": _json(_module_diff_document),
        },
    ),
    "github": Format("github", {"LintReport": _lint_github, "CheckReport": _check_github}),
    "junit": Format("junit", {"LintReport": _lint_junit, "CheckReport": _check_junit}),
}
