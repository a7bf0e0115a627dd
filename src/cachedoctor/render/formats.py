"""One renderer interface and one registry of output formats (pip-audit's ``_format`` model).

Every command hands its report to ``renderer(name).render(report, console)``; ``FORMATS`` maps
the names the commands accept (``--format``, ``--json``, ``--html``) to them. A format is a table
of writers, one per kind of report it supports, and picks the writer by the report's type
(``isinstance`` against the report class itself). Each kind names its class by the module that
defines it and is resolved only once that module is loaded (a report of that kind exists only
then): the registry imports no report module, and a writer imports its per-format function
(``table``, ``jsonout``, ``ci``, ``github``, ``junit``, ``plan``, ``difftext``, ``diffjson``,
``stats``, ``markdown``, ``openmetrics``, ``status``) only when it writes, so rendering a scan
loads no diff, check or stats code. ``tests/render/test_render.py`` resolves every kind, so a
renamed class fails there.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console

from cachedoctor.render.console import file_console

if TYPE_CHECKING:
    from cachedoctor.cache.model import EntryDetail
    from cachedoctor.core.bundle import PackReport, UnpackReport
    from cachedoctor.core.check.report import CheckReport
    from cachedoctor.core.diff.report import DiffReport, ModuleDiffReport
    from cachedoctor.core.findings import Finding
    from cachedoctor.core.lint import LintReport
    from cachedoctor.core.metrics import StatsMetrics
    from cachedoctor.core.preflight import PreflightReport
    from cachedoctor.core.prune.actions import ApplyReport, Plan
    from cachedoctor.core.scan.report import JsonScan, PartWriters, ScanReport
    from cachedoctor.core.show import KernelView
    from cachedoctor.core.stats import StatsReport, ZeroReport
    from cachedoctor.core.suite import SuiteReport
    from cachedoctor.core.why import WhyReport
    from cachedoctor.stablekeys.activation import StatusReport


class Renderer(Protocol):
    """One output format."""

    @property
    def name(self) -> str:
        """The name the commands accept."""

    def render(self, report: Any, console: Console) -> None:
        """Write ``report`` to ``console`` (machine formats write plain text to its file)."""


# --- reports that are views of others ----------------------------------------------------------


@dataclass(frozen=True)
class PlanReport:
    """What ``prune`` and ``rekey`` show: the plan, and what applying it did (None: dry run)."""

    plan: Plan
    result: ApplyReport | None = None


@dataclass(frozen=True)
class ShowReport:
    """What ``show`` shows: one entry in detail, its Pallas kernels, and its HLO text with
    ``--hlo`` (on a TPU also the module before optimisation)."""

    detail: EntryDetail
    hlo_text: str | None = None
    kernels: tuple[KernelView, ...] = ()
    original_hlo_text: str | None = None


@dataclass(frozen=True)
class FindingList:
    """Findings alone, as ``scan`` prints them (``demo`` shows its scan's findings so)."""

    findings: Sequence[Finding]


# --- the registry --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportKind:
    """A report class, named by the module that defines it (see the module docstring)."""

    module: str
    name: str

    def resolve(self) -> type | None:
        """The class, or None while its module is not loaded (no report of it can exist)."""
        loaded = sys.modules.get(self.module)
        cls = getattr(loaded, self.name, None) if loaded is not None else None
        return cls if isinstance(cls, type) else None

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


SCAN = ReportKind("cachedoctor.core.scan.report", "ScanReport")
SCAN_JSON = ReportKind("cachedoctor.core.scan.report", "JsonScan")
LINT = ReportKind("cachedoctor.core.lint", "LintReport")
CHECK = ReportKind("cachedoctor.core.check.report", "CheckReport")
DIFF = ReportKind("cachedoctor.core.diff.report", "DiffReport")
MODULE_DIFF = ReportKind("cachedoctor.core.diff.report", "ModuleDiffReport")
STATS = ReportKind("cachedoctor.core.stats", "StatsReport")
ZERO = ReportKind("cachedoctor.core.stats", "ZeroReport")
METRICS = ReportKind("cachedoctor.core.metrics", "StatsMetrics")
STATUS = ReportKind("cachedoctor.stablekeys.activation", "StatusReport")
WHY = ReportKind("cachedoctor.core.why", "WhyReport")
SUITE = ReportKind("cachedoctor.core.suite", "SuiteReport")  # the pytest plugin's
PREFLIGHT = ReportKind("cachedoctor.core.preflight", "PreflightReport")
PACK = ReportKind("cachedoctor.core.bundle", "PackReport")
UNPACK = ReportKind("cachedoctor.core.bundle", "UnpackReport")
PLAN = ReportKind(__name__, "PlanReport")
SHOW = ReportKind(__name__, "ShowReport")
FINDINGS = ReportKind(__name__, "FindingList")
KINDS = (
    SCAN, SCAN_JSON, LINT, CHECK, DIFF, MODULE_DIFF, STATS, ZERO, METRICS, STATUS, WHY, PREFLIGHT,
    PACK, UNPACK, PLAN, SHOW, FINDINGS, SUITE
)  # fmt: skip


@dataclass(frozen=True)
class Options:
    """What a command's options change in its output."""

    max_modules: int = 25  # rows of the scan's and stats' module tables


Writer = Callable[[Any, Console, Options], None]


@dataclass(frozen=True)
class Format:
    """A format as a table of writers, one per kind of report it supports."""

    name: str
    writers: Mapping[ReportKind, Writer] = field(repr=False)
    options: Options = Options()

    def render(self, report: Any, console: Console) -> None:
        self.writer_for(report)(report, console, self.options)

    def writer_for(self, report: Any) -> Writer:
        for kind, writer in self.writers.items():
            cls = kind.resolve()
            if cls is not None and isinstance(report, cls):
                return writer
        raise TypeError(f"no {self.name} output for a {type(report).__name__}")


def renderer(name: str, *, max_modules: int = 25) -> Renderer:
    """The format called ``name``; ``max_modules`` bounds the module tables' rows."""
    fmt = FORMATS[name]
    assert isinstance(fmt, Format)
    return Format(fmt.name, fmt.writers, Options(max_modules=max_modules))


def render_to_string(report: Any, name: str) -> str:
    """The report as text for a file (``-o FILE``, ``--html FILE``): no colour, nothing wrapped
    or padded (``console.file_console``)."""
    buf = io.StringIO()
    console = file_console(buf, no_color=True)
    renderer(name).render(report, console)
    console.file.flush()
    return buf.getvalue()


def write_report(path: str, report: Any, name: str) -> None:
    """Write the report in format ``name`` to the file ``path``, whole or not at all (the one
    atomic write, ``storage/files``; the mode ``open()`` would give); a failure is a one-line
    ``CachedoctorError``."""
    from cachedoctor.errors import path_error
    from cachedoctor.storage.files import new_file_mode, write_atomic

    data = render_to_string(report, name).encode("utf-8")
    try:
        write_atomic(path, data, mode=new_file_mode())
    except OSError as exc:
        raise path_error(exc, path, what="file", verb="write") from None


def _write(console: Console, text: str) -> None:
    """Machine output goes to the console's file as it is (no markup, wrapping or colour)."""
    console.file.write(text if text.endswith("\n") else text + "\n")
    console.file.flush()


# --- text ------------------------------------------------------------------------------------


def _scan_text(report: ScanReport | JsonScan, console: Console, options: Options) -> None:
    from cachedoctor.core.scan.report import JsonScan
    from cachedoctor.render.table import render_scan

    scan = report.report if isinstance(report, JsonScan) else report  # its text is the report's
    render_scan(scan, console, max_modules=options.max_modules)


def _lint_text(report: LintReport, console: Console, options: Options) -> None:
    from cachedoctor.render.ci import render_lint

    render_lint(report, console)


def _check_text(report: CheckReport, console: Console, options: Options) -> None:
    from cachedoctor.render.ci import render_check

    render_check(report, console)


def _plan_text(report: PlanReport, console: Console, options: Options) -> None:
    from cachedoctor.render.plan import render_plan

    render_plan(report.plan, console, result=report.result)


def _diff_text(report: DiffReport, console: Console, options: Options) -> None:
    from cachedoctor.render.difftext import render_diff

    render_diff(report, console)


def _module_diff_text(report: ModuleDiffReport, console: Console, options: Options) -> None:
    from cachedoctor.render.difftext import render_module

    render_module(report, console)


def _stats_text(report: StatsReport, console: Console, options: Options) -> None:
    from cachedoctor.render.stats import render_stats

    render_stats(report, console, max_modules=options.max_modules)


def _metrics_text(report: StatsMetrics, console: Console, options: Options) -> None:
    """The figures' text is the stats report's."""
    _stats_text(report.stats, console, options)


def _zero_text(report: ZeroReport, console: Console, options: Options) -> None:
    from cachedoctor.render.stats import render_zero

    render_zero(report, console)


def _status_text(report: StatusReport, console: Console, options: Options) -> None:
    from cachedoctor.render.status import status_lines

    _write(console, "\n".join(status_lines(report)))


def _why_text(report: WhyReport, console: Console, options: Options) -> None:
    from cachedoctor.render.why import why_lines

    _write(console, "\n".join(why_lines(report)))


def _suite_text(report: SuiteReport, console: Console, options: Options) -> None:
    from cachedoctor.render.suite import suite_lines

    _write(console, "\n".join(suite_lines(report, top=options.max_modules)))


def _bundle_text(report: PackReport | UnpackReport, console: Console, options: Options) -> None:
    from cachedoctor.render.bundle import bundle_lines

    _write(console, "\n".join(bundle_lines(report)))


def _preflight_text(report: PreflightReport, console: Console, options: Options) -> None:
    from cachedoctor.render.preflight import preflight_lines

    _write(console, "\n".join(preflight_lines(report)))


def _show_text(report: ShowReport, console: Console, options: Options) -> None:
    from cachedoctor.render.table import render_show

    render_show(report.detail, console, report.hlo_text, report.kernels, report.original_hlo_text)


def _findings_text(report: FindingList, console: Console, options: Options) -> None:
    from cachedoctor.render.table import render_finding_list

    render_finding_list(report.findings, console)


TEXT_WRITERS: Mapping[ReportKind, Writer] = {
    SCAN: _scan_text,
    SCAN_JSON: _scan_text,
    LINT: _lint_text,
    CHECK: _check_text,
    PLAN: _plan_text,
    DIFF: _diff_text,
    MODULE_DIFF: _module_diff_text,
    STATS: _stats_text,
    ZERO: _zero_text,
    METRICS: _metrics_text,
    STATUS: _status_text,
    WHY: _why_text,
    SUITE: _suite_text,
    PREFLIGHT: _preflight_text,
    PACK: _bundle_text,
    UNPACK: _bundle_text,
    SHOW: _show_text,
    FINDINGS: _findings_text,
}


# --- json: every document has schema_version (docs/json-schema.md) ---------------------------


def _json(document: Callable[[Any], dict[str, Any]]) -> Writer:
    def write(report: Any, console: Console, options: Options) -> None:
        from cachedoctor.render.jsonout import dumps

        _write(console, dumps(document(report)))

    return write


def scan_parts() -> PartWriters:
    """How the json format writes the long parts of a scan document: the text ``scan_json``
    keeps beside the scan memo for ``scan --json``."""
    from cachedoctor.render.jsonout import SCAN_PARTS

    return SCAN_PARTS


def _scan_json(report: ScanReport | JsonScan, console: Console, options: Options) -> None:
    """Streamed, one entry (or one piece of kept text) at a time: a 50k-entry document is
    never held whole."""
    from cachedoctor.render.jsonout import iter_scan_pieces

    out = console.file
    raw = _ascii_bytes_sink(out)
    text = True  # what was written last: the text stream's buffer is flushed before bytes
    for piece in iter_scan_pieces(report):
        if isinstance(piece, str):
            out.write(piece)
            text = True
        elif raw is None:
            out.write(piece.decode("ascii"))
        else:  # kept text, 29 MB for cache-10k: spare decoding it and encoding it again
            if text:
                out.flush()
                text = False
            raw.write(piece)
    out.write("\n")
    out.flush()


def _ascii_bytes_sink(out: Any) -> Any:
    """The byte stream under the text stream ``out`` when ASCII written there lands as it is
    (a UTF-8 or ASCII encoding, no newline translation), else None."""
    import codecs
    import os

    raw, encoding = getattr(out, "buffer", None), getattr(out, "encoding", None)
    if raw is None or not isinstance(encoding, str) or os.linesep != "\n":
        return None
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        return None
    return raw if name in ("utf-8", "ascii") else None


def _lint_document(report: LintReport) -> dict[str, Any]:
    from cachedoctor.render.ci import lint_document

    return lint_document(report)


def _check_document(report: CheckReport) -> dict[str, Any]:
    from cachedoctor.render.ci import check_document

    return check_document(report)


def _plan_document(report: PlanReport) -> dict[str, Any]:
    from cachedoctor.render.plan import plan_document

    return plan_document(report.plan, report.result)


def _diff_document(report: DiffReport) -> dict[str, Any]:
    from cachedoctor.render.diffjson import diff_document

    return diff_document(report)


def _module_diff_document(report: ModuleDiffReport) -> dict[str, Any]:
    from cachedoctor.render.diffjson import module_document

    return module_document(report)


def _why_document(report: WhyReport) -> dict[str, Any]:
    from cachedoctor.render.why import why_document

    return why_document(report)


def _suite_document(report: SuiteReport) -> dict[str, Any]:
    from cachedoctor.render.suite import suite_document

    return suite_document(report)


def _preflight_document(report: PreflightReport) -> dict[str, Any]:
    from cachedoctor.render.preflight import preflight_document

    return preflight_document(report)


def _bundle_document(report: PackReport | UnpackReport) -> dict[str, Any]:
    from cachedoctor.render.bundle import bundle_document

    return bundle_document(report)


def _stats_document(report: StatsReport) -> dict[str, Any]:
    from cachedoctor.render.stats import stats_document

    return stats_document(report)


def _status_json(report: StatusReport, console: Console, options: Options) -> None:
    from cachedoctor.render.status import status_json

    _write(console, status_json(report))


def _show_document(report: ShowReport) -> dict[str, Any]:
    from cachedoctor.render.jsonout import show_document

    return show_document(report.detail, report.hlo_text, report.kernels, report.original_hlo_text)


JSON_WRITERS: Mapping[ReportKind, Writer] = {
    SCAN: _scan_json,
    SCAN_JSON: _scan_json,
    LINT: _json(_lint_document),
    CHECK: _json(_check_document),
    PLAN: _json(_plan_document),
    DIFF: _json(_diff_document),
    MODULE_DIFF: _json(_module_diff_document),
    STATS: _json(_stats_document),
    STATUS: _status_json,
    WHY: _json(_why_document),
    SUITE: _json(_suite_document),
    PREFLIGHT: _json(_preflight_document),
    PACK: _json(_bundle_document),
    UNPACK: _json(_bundle_document),
    SHOW: _json(_show_document),
}


# --- github, junit (CI commands only); html, markdown, openmetrics, prometheus (stats) ---------


def _lint_github(report: LintReport, console: Console, options: Options) -> None:
    from cachedoctor.render.github import lint_lines

    _write(console, "\n".join(lint_lines(report)))


def _check_github(report: CheckReport, console: Console, options: Options) -> None:
    from cachedoctor.render.github import check_lines

    _write(console, "\n".join(check_lines(report)))


def _preflight_github(report: PreflightReport, console: Console, options: Options) -> None:
    from cachedoctor.render.github import preflight_lines

    _write(console, "\n".join(preflight_lines(report)))


def _lint_junit(report: LintReport, console: Console, options: Options) -> None:
    from cachedoctor.render.junit import lint_xml

    _write(console, lint_xml(report))


def _check_junit(report: CheckReport, console: Console, options: Options) -> None:
    from cachedoctor.render.junit import check_xml

    _write(console, check_xml(report))


def _stats_html(report: StatsReport, console: Console, options: Options) -> None:
    from cachedoctor.render.stats import html_page

    _write(console, html_page(report))


def _stats_markdown(report: StatsReport, console: Console, options: Options) -> None:
    from cachedoctor.render.markdown import stats_markdown

    _write(console, stats_markdown(report, max_modules=options.max_modules))


def _openmetrics(report: StatsMetrics, console: Console, options: Options) -> None:
    from cachedoctor.render.openmetrics import openmetrics_text

    _write(console, openmetrics_text(report))


def _prometheus(report: StatsMetrics, console: Console, options: Options) -> None:
    from cachedoctor.render.openmetrics import prometheus_text

    _write(console, prometheus_text(report))


FORMATS: Mapping[str, Renderer] = {
    "text": Format("text", TEXT_WRITERS),
    "json": Format("json", JSON_WRITERS),
    "github": Format(
        "github", {LINT: _lint_github, CHECK: _check_github, PREFLIGHT: _preflight_github}
    ),
    "junit": Format("junit", {LINT: _lint_junit, CHECK: _check_junit}),
    "html": Format("html", {STATS: _stats_html}),
    "markdown": Format("markdown", {STATS: _stats_markdown}),
    "openmetrics": Format("openmetrics", {METRICS: _openmetrics}),
    "prometheus": Format("prometheus", {METRICS: _prometheus}),
}
