"""`cachedoctor check`'s exit status says what happened (issue 28, item 5).

The reports are built here directly; tests/core/check/test_check_verify.py makes each verify
outcome with real JAX.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachedoctor.cli import cli
from cachedoctor.cli.check import exit_code
from cachedoctor.core.check import check as core
from cachedoctor.core.check.report import (
    CheckReport,
    CommandFailure,
    KeyCheck,
    ObserveStatus,
    Outcome,
    RunResult,
)
from cachedoctor.core.check.report import VerifyResult as Verify
from cachedoctor.errors import CachedoctorError, ExitCode

A, B = "jit_a-" + "a" * 64, "jit_b-" + "b" * 64


def report(verify: Verify | None, *, new_b: bool = False) -> CheckReport:
    runs = (RunResult(1, 0, 1.0, (A, B)), RunResult(2, 0, 1.0, ()))
    return CheckReport(
        argv=("python", "prog.py"),
        cache_dir="/tmp/c",
        temporary=True,
        kept=False,
        log_path=None,
        runs=runs,
        modules=("jit_a", "jit_b"),
        unstable=(),
        observe=ObserveStatus(False, 0, "off"),
        verify=verify,
    )


SAME = KeyCheck(A, "jit_a", Outcome.SAME, "p", "p", False, "cached entry vs fresh", "same program")
STALE = KeyCheck(A, "jit_a", Outcome.STALE, "p", "q", False, "cached entry vs fresh", "another")


@pytest.mark.parametrize(
    ("verify", "code"),
    [
        (None, 0),
        (Verify(3, 0, 1.0, 2, (SAME,)), 0),
        (Verify(3, 1, 1.0, 2, (SAME,), not_checked=("jit_b",), reason="it exited with 1"), 2),
        (Verify(3, 0, 1.0, 2, (SAME,), not_checked=("jit_b",), reason="not asked for"), 2),
        (Verify(3, 1, 1.0, 2, (STALE,), not_checked=("jit_b",), reason="it exited with 1"), 1),
    ],
)
def test_only_unchecked_modules_is_an_incomplete_run_not_a_finding(
    monkeypatch: pytest.MonkeyPatch, verify: Verify | None, code: int
) -> None:
    made = report(verify)
    monkeypatch.setattr(core, "run_check", lambda *a, **k: made)
    args = ["check", *(["--verify"] if verify else []), "--format", "json", "--", "python"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == code, result.output
    assert json.loads(result.stdout)["failed"] is (code != 0)


def test_help_says_what_each_exit_status_means() -> None:
    help_text = " ".join(CliRunner().invoke(cli, ["check", "--help"]).output.split())
    assert "1 an unstable key, a stale entry (--verify), or nothing checked" in help_text
    assert "the --verify run did not compile every module run 1 did (NOT CHECKED)" in help_text


def test_one_unchecked_module_is_singular() -> None:
    line = report(Verify(3, 1, 1.0, 2, (SAME,), ("jit_b",), "it exited with 1")).summary_line()
    assert "1 module was not checked by --verify (it exited with 1): jit_b" in line


def test_a_failed_command_still_writes_its_reports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """JSON on stdout and the --junit file, then the error (exit 2): CI uploads what it needs."""
    failure = CommandFailure(2, 3, "run 2/2 failed: `python` exited with 3 (output above)")
    runs = (RunResult(1, 0, 1.0, (A,)), RunResult(2, 3, 1.0, ()))
    made = replace(report(None), runs=runs, modules=(), command_failed=failure)
    monkeypatch.setattr(core, "run_check", lambda *a, **k: made)
    junit = tmp_path / "check.xml"
    result = CliRunner().invoke(
        cli, ["check", "--format", "json", "--junit", str(junit), "--", "python"]
    )
    assert isinstance(result.exception, CachedoctorError), result.output
    assert result.exception.slug == "command-failed" and result.exception.code == 2
    assert str(result.exception) == failure.message
    doc = json.loads(result.stdout)
    assert doc["failed"] is True and doc["nothing_checked"] is False
    assert doc["command_failed"] == {
        "run": 2, "returncode": 3, "message": failure.message, "slug": "command-failed"
    }  # fmt: skip
    assert exit_code(made) == ExitCode.USAGE
    (case,) = ET.parse(junit).getroot().iter("testcase")
    assert case.get("name") == "run 2" and case.find("failure") is not None
