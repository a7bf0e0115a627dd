"""The CLI run in the test process, as the console script runs it (``cachedoctor.cli.main``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner

from cachedoctor.cli import main


def invoke(*args: str, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``cachedoctor ARGS`` (its one-line errors included).

    ``env``: the whole environment the command sees, as a subprocess's ``env=`` (what it
    starts inherits it too; ``os.environ`` is restored after)."""
    code: int | str | None = 0
    overrides: dict[str, str | None] | None = None
    if env is not None:
        overrides = {k: None for k in os.environ if k not in env}
        overrides.update(env)
    with CliRunner().isolation(env=overrides) as streams:
        try:
            code = main(list(args))  # the console script exits with what main returns
        except SystemExit as exc:
            code = exc.code
        out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    return int(code or 0), out, err


def run_cli(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess, as CI runs it (``check`` starts processes and tees output)."""
    return subprocess.run(
        [sys.executable, "-m", "cachedoctor", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
        timeout=600,
    )
