"""The suite runs as ``nox -s mutation`` starts it: mutmut 3 runs pytest in one process with
pyproject's ``pytest_add_cli_args`` (``-p no:xdist``), so nothing in the suite's own options or
conftest may need xdist (``--dist`` in addopts once stopped every such run before a test)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_suite_runs_with_mutmut_s_own_pytest_arguments() -> None:
    mutmut = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    argv = [*mutmut["pytest_add_cli_args"], "-q", "tests/test_units.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    assert " passed" in done.stdout
