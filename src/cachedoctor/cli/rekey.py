"""`cachedoctor rekey [DIR] [--apply]`."""

from __future__ import annotations

import click

from cachedoctor.cli._common import json_flag, progress_bar
from cachedoctor.cli.params import DURATION, LOCATION, complete_dir
from cachedoctor.cli.prune import apply_progress
from cachedoctor.core.where import Location, cache_location, open_cache_dir
from cachedoctor.errors import ExitCode
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import PlanReport, renderer


@click.command()
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@click.option("--apply", "do_apply", is_flag=True, help="Move the entries (default: dry run).")
@json_flag()
@click.option(
    "--relocated",
    is_flag=True,
    help="Also move relocated entries (keyed for another spelling of the cache path) that carry an "
    "observe-mode manifest to their stable key, which `cachedoctor enable` makes JAX use.",
)
@click.option(
    "--jobs-cache-dir",
    metavar="PATH",
    help="With --relocated: the cache dir as your jobs spell it; without it, entries written "
    "for another spelling of this folder stay.",
)
@click.option(
    "--lock-timeout",
    type=DURATION,
    default="30s",
    show_default=True,
    metavar="AGE",
    help="How long to wait for JAX's lock.",
)
@click.pass_context
def rekey(
    ctx: click.Context,
    directory: Location | None,
    do_apply: bool,
    as_json: bool,
    relocated: bool,
    jobs_cache_dir: str | None,
    lock_timeout: float,
) -> None:
    """Move manifest-bearing entries to the key the current stable hasher gives them.

    Entry, -atime file and manifest move together; if the new key already holds the same
    executable the old entry is dropped as a duplicate, if it holds a different one both are
    kept and the conflict is reported. Exit status: 0 done (or dry run), 1 conflicts or failures,
    2 usage or I/O error, or DIR does not look like a JAX cache.
    """
    from cachedoctor.core.prune.actions import Status
    from cachedoctor.core.prune.apply import plan_and_apply
    from cachedoctor.core.prune.rekey import plan_rekey

    cache_dir = cache_location(directory)
    open_cache_dir(cache_dir, changes="rekey --apply" if do_apply else None)
    with progress_bar(not as_json, "planning") as progress:
        plan, result = plan_and_apply(
            lambda: plan_rekey(
                cache_dir, progress=progress, relocated=relocated, jobs_cache_dir=jobs_cache_dir
            ),
            cache_dir,
            do_apply,
            lock_timeout,
            apply_progress,
        )
    renderer("json" if as_json else "text").render(PlanReport(plan, result), stdout_console())
    failed = bool(plan.conflicts) or (
        result is not None and any(o.status is Status.FAILED for o in result.outcomes)
    )
    ctx.exit(int(ExitCode.FINDINGS if failed else ExitCode.OK))
