"""The progress bar: on a terminal's stderr only, once work runs past a second, gone at the end,
and never beside JSON or CI output."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO
from unittest import mock

import pytest

from cachedoctor.cli import _common, cli


class Terminal:
    """A pseudo-terminal to put in place of stderr, and what was drawn on it."""

    def __init__(self) -> None:
        self.master, slave = pty.openpty()
        self.err: TextIO = open(slave, "w", encoding="utf-8")  # noqa: SIM115
        os.set_blocking(self.master, False)
        self._drawn = bytearray()

    def drawn(self) -> str:
        self.err.flush()
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.master, 1 << 16):
                self._drawn.extend(chunk)
        return self._drawn.decode(errors="replace")

    def close(self) -> None:
        self.err.close()
        os.close(self.master)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[Terminal]:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(_common, "PROGRESS_DELAY_S", 0.0)  # the seed cache scans in no time
    term = Terminal()
    yield term
    term.close()


def _run(
    args: list[str], terminal: Terminal, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """Run the CLI in-process with stderr on the terminal (set here: capsys replaces stderr
    once the test starts) and stdout captured."""
    with mock.patch.object(sys, "stderr", terminal.err), pytest.raises(SystemExit) as exit_:
        cli.main(args, prog_name="cachedoctor")
    return int(exit_.value.code or 0), capsys.readouterr().out


@pytest.mark.slow
def test_scan_draws_a_bar_on_a_terminal(
    seed_cache: Path, terminal: Terminal, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(["scan", str(seed_cache)], terminal, capsys)
    assert code in (0, 1)
    drawn = terminal.drawn()
    n = len(list(seed_cache.glob("*-cache")))
    assert "scanning" in drawn and f"{n}/{n}" in drawn
    assert "scanning" not in out  # the report itself is untouched


@pytest.mark.slow
@pytest.mark.parametrize(
    "args", [["scan", "--json"], ["lint", "--format", "json"], ["lint", "--format", "github"]]
)
def test_no_bar_beside_json_or_ci_formats(
    seed_cache: Path,
    terminal: Terminal,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
) -> None:
    _, out = _run([*args, str(seed_cache)], terminal, capsys)
    assert "scanning" not in terminal.drawn()
    if "json" in args:
        json.loads(out)


@pytest.mark.slow
def test_no_bar_in_ci(
    seed_cache: Path,
    terminal: Terminal,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "true")
    _run(["lint", str(seed_cache)], terminal, capsys)
    assert "scanning" not in terminal.drawn()


@pytest.mark.slow
def test_prune_plan_draws_a_bar_but_not_beside_json(
    seed_cache: Path, terminal: Terminal, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(["prune", "--duplicates", "--json", str(seed_cache)], terminal, capsys)
    assert "planning" not in terminal.drawn()
    _, out = _run(["prune", "--duplicates", str(seed_cache)], terminal, capsys)
    assert "planning" in terminal.drawn()
    assert "planning" not in out
