"""`cachedoctor stats [DIR]`."""

from __future__ import annotations

import click

from cachedoctor.cli._common import json_flag
from cachedoctor.cli.params import LOCATION, SINCE, complete_dir
from cachedoctor.core.metrics import collect_metrics
from cachedoctor.core.stats import collect_stats, zero
from cachedoctor.core.where import Location, cache_location, open_cache_dir
from cachedoctor.errors import path_error
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer, write_report

METRIC_FORMATS = ("openmetrics", "prometheus")
STATS_FORMATS = ("text", "json", "markdown", *METRIC_FORMATS)


@click.command()
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@click.option(
    "--since",
    type=SINCE,
    metavar="WHEN",
    help="Only records since WHEN: a time ago (7d, 12h, 30min, 2w), a UTC date (YYYY-MM-DD) or "
    "a Unix time.",
)
@click.option("--module", metavar="NAME", help="Only this module (a glob such as 'jit_*' works).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(STATS_FORMATS),
    default=None,
    help="text (the default); json; markdown (GitHub-flavoured, for a CI job's summary: "
    "$GITHUB_STEP_SUMMARY); openmetrics (for a Prometheus scrape); prometheus (the text format "
    "0.0.4, for node_exporter's textfile collector).",
)
@json_flag(same_as_format=True)
@click.option(
    "--html", "html_file", metavar="FILE", help="Also write a self-contained HTML page to FILE."
)
@click.option(
    "--zero",
    "zero_stats",
    is_flag=True,
    help="Archive every record into cachedoctor-stats/archive-<UTC time>.jsonl, then delete "
    "them (with --apply; a dry run without).",
)
@click.option("--apply", is_flag=True, help="With --zero: really archive and reset.")
@click.option(
    "--max-modules",
    default=25,
    show_default=True,
    type=click.IntRange(0),
    help="Rows in the module table (markdown: also of findings; openmetrics, prometheus: modules "
    "with their own label, the rest add up as '(other modules)').",
)
def stats(
    directory: Location | None,
    since: float | None,
    module: str | None,
    fmt: str | None,
    as_json: bool,
    html_file: str | None,
    zero_stats: bool,
    apply: bool,
    max_modules: int,
) -> None:
    """Hit rate and compile time saved, from the records the hook writes at each process exit.

    Processes record when the hook runs in stable or observe mode, or with `cachedoctor enable
    --stats-only` / CACHEDOCTOR_HOOK=stats (keys unchanged). Shows, in this order: the totals,
    a hit-rate chart per day, the modules (most compile time spent on misses first, a first
    compile included; why a module missed, as the scan and the records tell it), the hosts and
    the findings. DIR defaults as for `scan`; gs:// and s3:// work. --format markdown writes
    the totals, the modules that missed and the findings for a CI job's summary; --format
    openmetrics the same figures as metrics, with the entries and bytes the cache holds now.

    Exit status: 0 shown (or archived), 2 usage or I/O error, or DIR is missing or does not
    look like a JAX cache.
    """
    if zero_stats:
        given = [
            name
            for name, value in (
                ("--since", since),
                ("--module", module),
                ("--format", fmt),
                ("--json", as_json or None),
                ("--html", html_file),
            )
            if value is not None
        ]
        if given:
            raise click.UsageError(
                f"--zero archives every record: it does not go with {', '.join(given)}"
            )
    elif apply:
        raise click.UsageError("--apply only goes with --zero")
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json is --format json: it does not go with --format {fmt}")
    fmt = "json" if as_json else fmt or "text"
    cache_dir = cache_location(directory)
    open_cache_dir(cache_dir, changes="stats --zero --apply" if zero_stats and apply else None)
    console = stdout_console()
    try:
        if zero_stats:
            renderer("text").render(zero(cache_dir, apply=apply), console)
            return
        metrics = None
        if fmt in METRIC_FORMATS:
            metrics = collect_metrics(
                cache_dir, since=since, module=module, max_modules=max_modules
            )
        report = metrics.stats if metrics else collect_stats(cache_dir, since=since, module=module)
    except OSError as exc:  # cachedoctor-stats/ itself a file, a link loop, unreadable
        raise path_error(exc, exc.filename or cache_dir.spelling) from None
    if html_file:
        write_report(html_file, report, "html")
    renderer(fmt, max_modules=max_modules).render(metrics or report, console)
