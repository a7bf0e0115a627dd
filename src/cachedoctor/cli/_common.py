"""Options and helpers shared by commands."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import click

from cachedoctor.core.findings import Severity
from cachedoctor.errors import NotACacheError
from cachedoctor.render.console import stderr_console

if TYPE_CHECKING:
    from cachedoctor.core.scan.report import ScanReport

CI_FORMATS = ("text", "json", "github", "junit")  # `lint` and `check` output formats
SEVERITY_CHOICE = click.Choice([s.label for s in Severity], case_sensitive=False)


def json_flag(
    same_as_format: bool = False,
) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """``--json`` (the ``as_json`` parameter), in the same words in every command's --help;
    ``same_as_format``: the command also takes ``--format json``."""
    also = "; the same as --format json" if same_as_format else ""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help=f"Print one JSON document (schema_version 1, docs/json-schema.md{also}).",
    )


PROGRESS_DELAY_S = 1.0  # a bar for work that is over sooner would only flicker


@contextlib.contextmanager
def progress_bar(enabled: bool, what: str) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done, total)`` callback drawing a bar on stderr once the work has run past
    ``PROGRESS_DELAY_S``; None (no bar at all) unless ``enabled`` and stderr is a terminal
    outside CI. The bar is removed when the work ends, so nothing of it stays in the output."""
    if not enabled or not sys.stderr.isatty() or os.environ.get("CI"):
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    start = time.monotonic()
    bar: Progress | None = None
    task = None

    def report(done: int, total: int) -> None:
        nonlocal bar, task
        if bar is None:
            if done >= total or time.monotonic() - start < PROGRESS_DELAY_S:
                return
            bar = Progress(
                f"[progress.description]{what}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=stderr_console(),
                transient=True,
            )
            bar.start()
            task = bar.add_task(what, total=total)
        assert task is not None
        bar.update(task, completed=done, total=total)

    try:
        yield report
    finally:
        if bar is not None:
            bar.stop()


def not_a_cache(report: ScanReport) -> None:
    """Refuse a folder that holds files but nothing of a JAX cache: the user named the wrong one.

    An empty folder is a fresh cache and passes.
    """
    if not report.looks_like_cache:
        raise NotACacheError(report.cache_dir, report.other_file_count)
