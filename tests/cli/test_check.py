"""`cachedoctor check`'s exit status says what happened (issue 28, item 5).

The report of a verified run that JAX stopped early is built here directly: on CPU, a run that
stops at a nondeterministic-compilation mismatch only (no stale entry) cannot be produced on
demand; tests/core/check/test_check_verify.py makes the aborted run itself with real JAX.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cachedoctor.cli import cli
from cachedoctor.core.check import check as core
from cachedoctor.core.check.report import CheckReport, Mismatch, ObserveStatus, RunResult
from cachedoctor.core.check.report import VerifyResult as Verify

A, B = "jit_a-" + "a" * 64, "jit_b-" + "b" * 64


def report(verify: Verify | None, *, new_b: bool = False) -> CheckReport:
    runs = (RunResult(1, 0, 1.0, (A, B)), RunResult(2, 0 if verify is None else 1, 1.0, ()))
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


NONDETERMINISTIC = Mismatch(A, "jit_a", stale=False, detail="same program, other object code")
STALE = Mismatch(A, "jit_a", stale=True, detail="another program")


@pytest.mark.parametrize(
    ("verify", "code"),
    [
        (None, 0),
        (Verify(2, 2, ("jit_a", "jit_b"), (), complete=True), 0),
        (Verify(2, 2, (), (NONDETERMINISTIC,), complete=False, not_checked=("jit_b",)), 2),
        (Verify(2, 2, (), (STALE,), complete=False, not_checked=("jit_b",)), 1),
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
    assert "stopped the --verify run before it reached every module (NOT CHECKED)" in help_text


def test_one_unchecked_module_is_singular() -> None:
    line = report(Verify(2, 2, (), (NONDETERMINISTIC,), False, ("jit_b",))).summary_line()
    assert "1 module was not checked: jit_b" in line
