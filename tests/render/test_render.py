"""The one renderer interface: every format the commands offer is in the registry, and each
format writes the reports it supports the way its per-format function does."""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from cachedoctor.cli._common import CI_FORMATS
from cachedoctor.core import lint
from cachedoctor.core.findings import FindingKind, Severity
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.render.formats import (
    FORMATS,
    KINDS,
    TEXT_WRITERS,
    Format,
    render_to_string,
    renderer,
)
from cachedoctor.render.jsonout import dumps, scan_document
from cachedoctor.storage.location import Location


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=120, no_color=True, highlight=False), buf


def test_every_ci_format_is_registered() -> None:
    assert set(CI_FORMATS) <= set(FORMATS)
    assert all(FORMATS[name].name == name for name in FORMATS)


def test_every_report_kind_is_a_class_with_a_text_writer() -> None:
    """The registry names each report class by its module; each must resolve to that class
    (a renamed or moved class fails here, not in a user's terminal)."""
    for kind in KINDS:
        importlib.import_module(kind.module)
        cls = kind.resolve()
        assert isinstance(cls, type) and cls.__name__ == kind.name, kind
        assert kind in TEXT_WRITERS, kind
    for fmt in FORMATS.values():
        assert isinstance(fmt, Format) and set(fmt.writers) <= set(KINDS)


def test_dispatch_is_by_type_not_by_class_name() -> None:
    """A class that merely shares a report's name is not that report; a subclass is."""
    from cachedoctor.core.findings import Finding
    from cachedoctor.render.formats import FindingList

    impostor = type("FindingList", (), {"findings": ()})()
    with pytest.raises(TypeError, match="no text output for a FindingList"):
        renderer("text").render(impostor, _console()[0])

    class Narrowed(FindingList):
        pass

    console, buf = _console()
    finding = Finding(FindingKind.ORPHAN, Severity.INFO, "m", "a", "e")
    renderer("text").render(Narrowed((finding,)), console)
    assert "orphan" in buf.getvalue()


def test_stats_json_has_a_schema_version_and_the_report() -> None:
    from cachedoctor.core.stats import summarise

    report = summarise("/nowhere", [], [], None)
    doc = json.loads(render_to_string(report, "json"))
    assert doc == {"schema_version": 1, **report.to_dict()}
    assert next(iter(doc)) == "schema_version"


@pytest.mark.slow
def test_formats_write_a_real_lint_report(seed_cache: Path) -> None:
    report = lint.lint_directory(Location.parse(str(seed_cache)), fail_on=Severity.ERROR, ignore=())
    console, buf = _console()
    renderer("json").render(report, console)
    doc = json.loads(buf.getvalue())
    assert doc["command"] == "lint" and doc["cache_dir"] == str(seed_cache)
    assert len(doc["findings"]) == len(report.findings) > 0
    xml = render_to_string(report, "junit")
    found_kinds = {lf.finding.kind for lf in report.findings}
    quiet_kinds = [k for k in FindingKind if k not in found_kinds]  # one "no finding" case
    assert xml.startswith("<?xml")
    assert xml.count("<testcase") == len(report.findings) + len(quiet_kinds)
    github = render_to_string(report, "github").splitlines()
    assert len([line for line in github if line.startswith("::")]) == len(report.findings)
    assert github[-1].startswith(f"cachedoctor lint {seed_cache}: ")
    assert render_to_string(report, "text").splitlines()[-1] == report.summary_line()


@pytest.mark.slow
def test_scan_json_and_table(seed_cache: Path) -> None:
    report = scan_directory(Location.parse(seed_cache), now=2e9)
    assert render_to_string(report, "json") == dumps(scan_document(report)) + "\n"
    console, buf = _console()
    renderer("text", max_modules=1).render(report, console)
    assert f"{len(report.modules) - 1} more modules (use --json)" in buf.getvalue()


@pytest.mark.slow
def test_a_format_refuses_a_report_it_has_no_output_for(seed_cache: Path) -> None:
    report = scan_directory(Location.parse(seed_cache), now=2e9)
    with pytest.raises(TypeError, match="no junit output for a ScanReport"):
        renderer("junit").render(report, _console()[0])


def _finding(kind: str, message: str, advice: str = "do this", evidence: str = "seen that") -> Any:
    from cachedoctor.core.findings import Finding, FindingKind, Severity

    severity = Severity.ERROR if kind == "corrupt" else Severity.INFO
    return Finding(FindingKind(kind), severity, message, advice, evidence)


def test_findings_with_one_advice_share_it() -> None:
    """Consecutive findings of one kind with the same advice and evidence (100 corrupt entries,
    thousands of same-program ones) print one line each and the advice once; the order stays."""
    from cachedoctor.render.table import render_finding_list

    a = [_finding("corrupt", f"jit_f-{n}: cut short") for n in range(3)]
    other = _finding("same-program", "jit_g: the same program under 2 keys", "diff jit_g")
    console, buf = _console()
    render_finding_list([*a, other, a[0]], console)
    assert buf.getvalue() == (
        "5 findings\n"
        "error   corrupt         jit_f-0: cut short\n"
        "error   corrupt         jit_f-1: cut short\n"
        "error   corrupt         jit_f-2: cut short\n"
        "        → (the 3 above) do this\n"
        "        evidence: (the 3 above) seen that\n"
        "info    same-program    jit_g: the same program under 2 keys\n"
        "        → diff jit_g\n"
        "        evidence: seen that\n"
        "error   corrupt         jit_f-0: cut short\n"
        "        → do this\n"
        "        evidence: seen that\n"
    )


def test_a_lone_finding_prints_as_before_in_colour() -> None:
    """A finding alone is printed as it always was (the same bytes with colour)."""
    from rich.text import Text

    from cachedoctor.render.table import SEVERITY_STYLE, render_finding_list

    f = _finding("corrupt", "jit_f-0: cut \x07short")
    outputs = []
    for build in ("renderer", "reference"):
        buf = io.StringIO()
        console = Console(file=buf, width=120, force_terminal=True, color_system="truecolor")
        if build == "renderer":
            render_finding_list([f], console)
        else:  # the layout of every finding before groups existed
            console.print(Text("1 finding", style="bold"))
            lines = Text()
            lines.append(f"{f.severity.label:7} ", style=SEVERITY_STYLE[f.severity])
            lines.append(f"{f.kind.value:15} ", style="bold")
            lines.append(f.message)
            lines.append(f"\n        → {f.advice}\n", style="dim")
            lines.append(f"        evidence: {f.evidence}\n", style="dim")
            lines.rstrip()
            console.print(lines, soft_wrap=True)
        outputs.append(buf.getvalue())
    assert outputs[0] == outputs[1] and "\x1b[" in outputs[0] and "\x07" not in outputs[0]


@pytest.mark.parametrize("per_call", [2, 3, 200])
def test_findings_without_colour_are_the_coloured_text_unstyled(
    per_call: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off a terminal no span is built (thousands of findings), and the text is what rich
    exports from the coloured output: control characters, tabs, wide and odd names alike,
    wherever the calls split the lines."""
    from cachedoctor.render import console as console_mod
    from cachedoctor.render.table import render_finding_list

    monkeypatch.setattr(console_mod, "LINES_PER_CALL", per_call)

    odd = ["jit_f-0: cut \x07short", "tab\there", "wide ＡＢＣ 名前", "bad \udcff byte", "x" * 300]
    odd += ["名\tafter wide", "\ttab first\t\tand twice", "cr\r\nlf, vt\x0b ff\x0c bs\x08", "nl\n"]
    findings = [_finding("corrupt", m) for m in odd]
    findings += [_finding("same-program", "jit_g: 2 keys", "diff\tjit_g", "seen\x1b[31m that")]
    plain_buf = io.StringIO()
    plain = Console(file=plain_buf, width=120, highlight=False, soft_wrap=False)
    assert plain.color_system is None
    render_finding_list(findings, plain)
    coloured = Console(
        file=io.StringIO(), width=120, force_terminal=True, color_system="truecolor", record=True
    )
    render_finding_list(findings, coloured)
    assert "\x1b[" in coloured.file.getvalue()  # type: ignore[attr-defined]
    assert plain_buf.getvalue() == coloured.export_text(styles=False)
    assert "\t" not in plain_buf.getvalue() and "\r" not in plain_buf.getvalue()

    def through_rich(console: Console, text: str) -> None:  # what the direct write stands for
        from rich.text import Text

        console.print(Text(text), soft_wrap=True)

    monkeypatch.setattr(console_mod, "_write_as_rich_would", through_rich)
    by_rich = Console(file=io.StringIO(), width=120, highlight=False, soft_wrap=False)
    render_finding_list(findings, by_rich)
    assert by_rich.file.getvalue() == plain_buf.getvalue()  # type: ignore[attr-defined]
    monkeypatch.setattr(console_mod, "LINES_PER_CALL", 10**6)  # all in one call, as before
    one_call = Console(file=io.StringIO(), width=120, force_terminal=True, color_system="truecolor")
    render_finding_list(findings, one_call)
    assert coloured.file.getvalue() == one_call.file.getvalue()  # type: ignore[attr-defined]


def _lint_as_before(report: Any, console: Console) -> None:
    """lint's text output as it was written before it was printed in one call: a print a line."""
    from rich.text import Text

    from cachedoctor.render.table import SEVERITY_STYLE

    if not report.findings:
        console.print(Text("no findings", style="green"))
    for lf in report.findings:
        f = lf.finding
        line = Text()
        mark = "FAIL" if lf.failing else ("base" if lf.baselined else "  ok")
        line.append(f"{mark} ", style="bold red" if lf.failing else "dim")
        line.append(f"{f.severity.label:7} ", style=SEVERITY_STYLE[f.severity])
        line.append(f"{f.kind.value:15} ", style="bold")
        line.append(f.message)
        console.print(line)
        console.print(Text(f"     → {f.advice}", style="dim"))
        console.print(Text(f"     evidence: {f.evidence}", style="dim"))
    for fp in report.fixed:
        console.print(Text(f"gone from the cache, still in the baseline: {fp}", style="cyan"))
    console.print(Text(report.summary_line(), style="bold"))


@pytest.mark.parametrize("per_call", [2, 3, 200])
@pytest.mark.parametrize("colour", [None, "truecolor"])
@pytest.mark.parametrize("fixed", [(), ("ab12", "cd34")])
@pytest.mark.parametrize("count", [0, 1, 4, 16])
def test_lint_text_in_few_calls_is_the_text_of_a_print_a_line(
    colour: str | None,
    fixed: tuple[str, ...],
    count: int,
    per_call: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Long lines wrap as if printed alone (120 columns off a terminal), in colour or not,
    wherever the calls split the lines."""
    from cachedoctor.core.lint import LintFinding, LintReport
    from cachedoctor.render import console as console_mod
    from cachedoctor.render.ci import render_lint

    monkeypatch.setattr(console_mod, "LINES_PER_CALL", per_call)

    wide = "tab\there, wide ＡＢＣ 名前, bell \x07"
    edge = ["y" * 120, "z" * 121, "x" * 118 + "    ", "ＷＩＤＥ" * 30, "ctrl \x1b[31m red"]
    # the lines of 29-character prefix and these are 120, 121 and 125 wide; short ones with a
    # control character that rich strips
    near = ["m" * 91, "n" * 92, "o" * 96, "bell\x07 short", "cr\r short"]
    messages = ["short", "word " * 60, "x" * 300, wide, "ends  ", *edge, *near]
    findings = tuple(
        LintFinding(
            _finding("corrupt" if n % 2 else "orphan", messages[n % len(messages)], "a " * 70),
            f"fp{n}",
            baselined=n == 2,
            failing=n % 2 == 1,
        )
        for n in range(count)
    )
    report = LintReport(
        scan=SimpleNamespace(cache_dir="/data/jax-cache"),  # type: ignore[arg-type]  # all it reads
        fail_on=Severity.ERROR,
        ignored_kinds=(),
        findings=findings,
        ignored=0,
        baseline_path=None,
        fixed=fixed,
    )
    outputs = []
    for render in (render_lint, _lint_as_before):
        buf = io.StringIO()
        console = Console(
            file=buf,
            width=120,
            highlight=False,
            color_system="truecolor" if colour else None,
            force_terminal=bool(colour),
        )
        render(report, console)
        outputs.append(buf.getvalue())
    assert outputs[0] == outputs[1]
    assert ("\x1b[1m" in outputs[0]) == bool(colour)  # bold: styles written, or none
    if count and not colour:  # it wrapped
        assert max(len(line) for line in outputs[0].splitlines()) <= 120 < len(messages[1])


@pytest.mark.parametrize("code", [7, 8, 11, 12, 13, 27, 0])
def test_each_control_character_alone_is_written_as_rich_writes_it(
    code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct write off a terminal against rich's own print, one control character at a
    time (rich strips BEL, BS, VT, FF and CR, and keeps the others)."""
    from rich.text import Text

    from cachedoctor.render import console as console_mod
    from cachedoctor.render.table import render_finding_list

    findings = [_finding("orphan", f"before {chr(code)} after")]
    outputs = []
    for direct in (True, False):
        if not direct:
            monkeypatch.setattr(
                console_mod,
                "_write_as_rich_would",
                lambda console, text: console.print(Text(text), soft_wrap=True),
            )
        console = Console(file=io.StringIO(), width=120, highlight=False, soft_wrap=False)
        render_finding_list(findings, console)
        outputs.append(console.file.getvalue())  # type: ignore[attr-defined]
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    "cells",
    [
        ["jit_f", "12", "3.4 KiB"],  # fits: printed without measuring
        ["jit_" + "x" * 150, "12", "3.4 KiB"],  # wider than the console: measured and widened
        ["[bold]jit_g[/bold]", "名前ＡＢＣ", "a\nbb"],  # markup, wide characters, two lines
        ["tab\there", "1", "2"],  # a tab may grow: measured
    ],
)
def test_a_table_prints_the_same_with_or_without_measuring_it_first(
    cells: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off a terminal a table that surely fits is printed at once; one that may not is measured
    and the console widened. Either way the text is what the measured path prints."""
    from rich.table import Table
    from rich.text import Text

    from cachedoctor.render import console as console_mod

    def table() -> Table:
        t = Table(title="modules " * 30, title_justify="left", show_edge=False)
        for name in ("module", "entries", "on disk"):
            t.add_column(name, overflow="fold")
        t.add_row(*cells)
        t.add_row(Text("styled", style="bold"), "7", "1 B", style="yellow")
        return t

    widest = console_mod._widest_possible(table())
    outputs = []
    for measured in (False, True):
        if measured:
            monkeypatch.setattr(console_mod, "_widest_possible", lambda table: None)
        console = Console(file=io.StringIO(), width=120, highlight=False, soft_wrap=False)
        console_mod.print_table(console, table())
        outputs.append(console.file.getvalue())  # type: ignore[attr-defined]
    assert outputs[0] == outputs[1]
    assert (widest is not None and widest <= 120) == (cells[0] in ("jit_f", "[bold]jit_g[/bold]"))
