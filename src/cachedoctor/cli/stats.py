"""`cachedoctor stats [DIR]`."""

from __future__ import annotations

import click

from cachedoctor.core.stats import collect_stats, parse_since, zero
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer, write_report
from cachedoctor.stablekeys.settings import resolve_cache_dir


@click.command()
@click.argument("directory", required=False, metavar="[DIR]")
@click.option("--since", metavar="WHEN", help="Only records since WHEN: 7d, 12h, 30m or a date.")
@click.option("--module", metavar="NAME", help="Only this module (a glob such as 'jit_*' works).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option(
    "--html", "html_file", metavar="FILE", help="Also write a self-contained HTML page to FILE."
)
@click.option(
    "--zero",
    "zero_stats",
    is_flag=True,
    help="Archive the records into cachedoctor-stats/archive/ and reset (with --apply).",
)
@click.option("--apply", is_flag=True, help="With --zero: really archive and reset.")
@click.option("--max-modules", default=25, show_default=True, help="Rows in the module table.")
def stats(
    directory: str | None,
    since: str | None,
    module: str | None,
    as_json: bool,
    html_file: str | None,
    zero_stats: bool,
    apply: bool,
    max_modules: int,
) -> None:
    """Hit rate and compile time saved, from the records the hook writes at each process exit.

    Processes record when the hook runs in stable or observe mode, or with `cachedoctor enable
    --stats-only` / CACHEDOCTOR_HOOK=stats (keys unchanged). Shows totals, the modules that never
    hit first (with the reason the scan and the records give), a hit-rate chart per day, and
    hosts. DIR defaults as for `scan`; gs:// and s3:// work.
    """
    cache_dir = resolve_cache_dir(directory)
    console = stdout_console()
    if zero_stats:
        renderer("text").render(zero(cache_dir, apply=apply), console)
        return
    if apply:
        raise click.UsageError("--apply only goes with --zero")
    report = collect_stats(cache_dir, since=parse_since(since) if since else None, module=module)
    if html_file:
        write_report(html_file, report, "html")
    renderer("json" if as_json else "text", max_modules=max_modules).render(report, console)
