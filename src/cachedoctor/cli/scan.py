"""`cachedoctor scan [DIR]`."""

from __future__ import annotations

import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import click

from cachedoctor.cache.executors import ExecutorChoice, open_executor
from cachedoctor.cli._common import SEVERITY_CHOICE, not_a_cache, progress_bar
from cachedoctor.cli.params import EXECUTOR, EXECUTOR_HELP, complete_dir, complete_kind
from cachedoctor.core.findings import Severity
from cachedoctor.core.scan.report import JsonScan, ProgressCallback, ScanReport
from cachedoctor.core.scan.run import scan_directory, scan_json
from cachedoctor.errors import ExitCode, count, path_error
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer, scan_parts
from cachedoctor.stablekeys.settings import resolve_cache_dir
from cachedoctor.storage.urls import is_url
from cachedoctor.units import format_bytes

if TYPE_CHECKING:
    from cachedoctor.storage.stores import Store


@click.command()
@click.argument("directory", required=False, metavar="[DIR]", shell_complete=complete_dir)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema_version 1).")
@click.option(
    "--fail-on",
    type=SEVERITY_CHOICE,
    default="error",
    show_default=True,
    help="Exit 1 when a finding reaches this severity.",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="KIND",
    shell_complete=complete_kind,
    help="Ignore findings of KIND (repeatable).",
)
@click.option(
    "--executor",
    type=EXECUTOR,
    default="local",
    show_default=True,
    metavar="WHERE",
    help=EXECUTOR_HELP,
)
@click.option(
    "--max-modules",
    default=25,
    show_default=True,
    type=click.IntRange(0),
    help="Rows in the module table.",
)
@click.pass_context
def scan(
    ctx: click.Context,
    directory: str | None,
    as_json: bool,
    fail_on: str,
    ignore: tuple[str, ...],
    executor: ExecutorChoice,
    max_modules: int,
) -> None:
    """Summarise a cache directory and report findings.

    DIR may be a gs://bucket/prefix or s3://bucket/prefix (the gcs or s3 extra: in a clone,
    pip install '.[gcs]' or '.[s3]'). It defaults to $JAX_COMPILATION_CACHE_DIR, then to the
    directory set by `cachedoctor enable`. --ignore KIND leaves a kind of finding out.
    --executor decodes the entries elsewhere (every worker must read DIR at the same path or
    URL); the report is the same.

    Exit status: 0 no finding at --fail-on or above, 1 there is one, 2 usage or I/O error, or DIR
    does not look like a JAX cache (files, but no entry, -atime file or sub-cache).
    """
    from cachedoctor.core.lint import parse_kinds

    ignored = parse_kinds(ignore)
    cache_dir = resolve_cache_dir(directory)
    try:
        with open_executor(executor) as pool, progress_bar(not as_json, "scanning") as progress:
            if is_url(cache_dir):
                shown = _scan_bucket(cache_dir, progress, as_json, pool, executor)
            else:
                shown = _scanned(cache_dir, progress, as_json, pool)
    except OSError as exc:
        raise path_error(exc, cache_dir) from None
    report = shown.report if isinstance(shown, JsonScan) else shown
    not_a_cache(report)
    shown = shown.without(ignored)
    fmt = "json" if as_json else "text"
    renderer(fmt, max_modules=max_modules).render(shown, stdout_console())
    failed = report.fails(Severity.parse(fail_on), ignored)
    ctx.exit(int(ExitCode.FINDINGS if failed else ExitCode.OK))


def _scanned(
    cache_dir: str | Store,
    progress: ProgressCallback | None,
    as_json: bool,
    pool: Executor | None,
) -> ScanReport | JsonScan:
    """The text report needs no entries; the JSON document has them all, as kept text when the
    scan memo holds it (``scan_json``)."""
    if as_json:
        return scan_json(cache_dir, scan_parts(), progress=progress, executor=pool)
    return scan_directory(cache_dir, progress=progress, entries=False, executor=pool)


def _scan_bucket(
    url: str,
    progress: ProgressCallback | None,
    as_json: bool,
    pool: Executor | None,
    choice: ExecutorChoice,
) -> ScanReport | JsonScan:
    """Scan a bucket prefix; the request and retry counts go to stderr."""
    from cachedoctor.storage.stores import open_store

    store = open_store(url)
    start = time.monotonic()
    shown = _scanned(store, progress, as_json, pool)
    report = shown.report if isinstance(shown, JsonScan) else shown
    where = f"{getattr(store, 'workers', 1)} workers" if pool is None else choice.label
    stats = store.stats
    reasons = ", ".join(f"{n}x {r}" for r, n in sorted(stats.retry_reasons.items()))
    click.echo(
        f"{store.url}: {count(report.summary.entries, 'entry', 'entries')}, "
        f"{format_bytes(stats.bytes_read)} read "
        f"on {where}, {stats.retries} retries"
        + (f" ({reasons})" if reasons else "")
        + f", {time.monotonic() - start:.2f} s",
        err=True,
    )
    return shown
