"""The one renderer interface: every format the commands offer is in the registry, and each
format writes the reports it supports the way its per-format function does."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from cachedoctor.cli._common import CI_FORMATS
from cachedoctor.commands import lint, scan
from cachedoctor.render.formats import FORMATS, render_to_string, renderer
from cachedoctor.render.jsonout import dumps, scan_document


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=120, no_color=True, highlight=False), buf


def test_every_ci_format_is_registered() -> None:
    assert set(CI_FORMATS) <= set(FORMATS)
    assert all(FORMATS[name].name == name for name in FORMATS)


def test_formats_write_a_real_lint_report(seed_cache: Path) -> None:
    report = lint.lint_directory(str(seed_cache), fail_on=scan.Severity.ERROR, ignore=())
    console, buf = _console()
    renderer("json").render(report, console)
    doc = json.loads(buf.getvalue())
    assert doc["command"] == "lint" and doc["cache_dir"] == str(seed_cache)
    assert len(doc["findings"]) == len(report.findings) > 0
    xml = render_to_string(report, "junit")
    found_kinds = {lf.finding.kind for lf in report.findings}
    quiet_kinds = [k for k in scan.FindingKind if k not in found_kinds]  # one "no finding" case
    assert xml.startswith("<?xml")
    assert xml.count("<testcase") == len(report.findings) + len(quiet_kinds)
    github = render_to_string(report, "github").splitlines()
    assert len([line for line in github if line.startswith("::")]) == len(report.findings)
    assert github[-1].startswith(f"cachedoctor lint {seed_cache}: ")
    assert render_to_string(report, "text").splitlines()[-1] == report.summary_line()


def test_scan_json_and_table(seed_cache: Path) -> None:
    report = scan.scan_directory(seed_cache, now=2e9)
    assert render_to_string(report, "json") == dumps(scan_document(report)) + "\n"
    console, buf = _console()
    renderer("text", max_modules=1).render(report, console)
    assert f"{len(report.modules) - 1} more modules (use --json)" in buf.getvalue()


def test_a_format_refuses_a_report_it_has_no_output_for(seed_cache: Path) -> None:
    report = scan.scan_directory(seed_cache, now=2e9)
    with pytest.raises(TypeError, match="no junit output for a ScanReport"):
        renderer("junit").render(report, _console()[0])
