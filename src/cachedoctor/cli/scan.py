"""`cachedoctor scan [DIR]`."""

from __future__ import annotations

import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import click

from cachedoctor.cli._common import SEVERITY_CHOICE, json_flag, not_a_cache, progress_bar
from cachedoctor.cli.params import EXECUTOR, EXECUTOR_HELP, LOCATION, complete_dir, complete_kind
from cachedoctor.core.findings import Severity
from cachedoctor.core.scan.report import JsonScan, ProgressCallback, ScanReport
from cachedoctor.core.scan.run import scan_directory, scan_json
from cachedoctor.core.where import Location, cache_location, open_executor
from cachedoctor.errors import ExitCode, count, path_error
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer, scan_parts
from cachedoctor.units import format_bytes

if TYPE_CHECKING:
    from cachedoctor.core.where import ExecutorChoice


@click.command()
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@json_flag()
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
    directory: Location | None,
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
    cache_dir = cache_location(directory)
    try:
        with open_executor(executor) as pool, progress_bar(not as_json, "scanning") as progress:
            start = time.monotonic()
            shown = _scanned(cache_dir, progress, as_json, pool)
            report = shown.report if isinstance(shown, JsonScan) else shown
            if not cache_dir.is_local:
                where = "" if pool is None else executor.label
                _bucket_requests(cache_dir, report, time.monotonic() - start, where)
    except OSError as exc:
        raise path_error(exc, cache_dir.spelling) from None
    not_a_cache(report)
    shown = shown.without(ignored)
    fmt = "json" if as_json else "text"
    renderer(fmt, max_modules=max_modules).render(shown, stdout_console())
    failed = report.fails(Severity.parse(fail_on), ignored)
    ctx.exit(int(ExitCode.FINDINGS if failed else ExitCode.OK))


def _scanned(
    cache_dir: Location,
    progress: ProgressCallback | None,
    as_json: bool,
    pool: Executor | None,
) -> ScanReport | JsonScan:
    """The text report needs no entries; the JSON document has them all, as kept text when the
    scan memo holds it (``scan_json``)."""
    if as_json:
        return scan_json(cache_dir, scan_parts(), progress=progress, executor=pool)
    return scan_directory(cache_dir, progress=progress, entries=False, executor=pool)


def _bucket_requests(where: Location, report: ScanReport, seconds: float, on: str) -> None:
    """After a bucket scan: its request and retry counts, to stderr (``on``: the executor's
    label, when the entries were decoded on one)."""
    store = where.store()  # the one the scan read through, with its counts
    on = on or f"{getattr(store, 'workers', 1)} workers"
    stats = store.stats
    reasons = ", ".join(f"{n}x {r}" for r, n in sorted(stats.retry_reasons.items()))
    click.echo(
        f"{store.url}: {count(report.summary.entries, 'entry', 'entries')}, "
        f"{format_bytes(stats.bytes_read)} read "
        f"on {on}, {stats.retries} retries"
        + (f" ({reasons})" if reasons else "")
        + f", {seconds:.2f} s",
        err=True,
    )
