"""Options and helpers shared by commands."""

from __future__ import annotations

import os
import sys

import click

from cachedoctor.commands.scan import Severity
from cachedoctor.render.console import stderr_console

CI_FORMATS = ("text", "json", "github", "junit")  # `lint` and `check` output formats
SEVERITY_CHOICE = click.Choice([s.label for s in Severity], case_sensitive=False)


def progress_to_stderr(enabled: bool):  # type: ignore[no-untyped-def]
    """A scan progress callback that writes to stderr on a terminal, or None."""
    if not enabled or not sys.stderr.isatty() or os.environ.get("CI"):
        return None
    err = stderr_console()

    def report(done: int, total: int) -> None:
        if done == total or done % 200 == 0:
            err.print(f"\rscanned {done}/{total} entries", end="")
            if done == total:
                err.print("\r" + " " * 40 + "\r", end="")

    return report
