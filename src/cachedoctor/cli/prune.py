"""`cachedoctor prune [DIR] [selectors] [--repair] [--apply]`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cachedoctor.cli._common import json_flag, progress_bar
from cachedoctor.cli.params import DURATION, LOCATION, SIZE, as_typed, complete_dir
from cachedoctor.core.where import Location, cache_location, open_cache_dir
from cachedoctor.errors import ExitCode
from cachedoctor.render.console import stdout_console

if TYPE_CHECKING:
    from cachedoctor.core.prune.actions import ApplyReport, Plan


@click.command()
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@click.option(
    "--older-than",
    type=DURATION,
    metavar="AGE",
    help=(
        "Entries whose last use, as far as records bound it, is longer ago (30d, 12h, 90min, "
        "2w); an entry no record dates is kept."
    ),
)
@click.option(
    "--max-size",
    type=SIZE,
    metavar="SIZE",
    help=(
        "Evict least recently used entries until the cache fits (50GB, 800MiB), as JAX's LRU; "
        "a hard-linked file counts once."
    ),
)
@click.option(
    "--duplicates",
    is_flag=True,
    help=(
        "Same program under keys that change per run: remove the copies whose writer's "
        "record shows a per-process pointer in the key; keep the rest."
    ),
)
@click.option("--corrupt", is_flag=True, help="Entries JAX cannot load (truncated, damaged).")
@click.option(
    "--orphans",
    is_flag=True,
    help="Manifests without entry and stale temp files (-atime files without entry go always).",
)
@click.option(
    "--relocated",
    is_flag=True,
    help="Entries keyed for another spelling of the cache path (JAX misses them).",
)
@click.option(
    "--jobs-cache-dir",
    metavar="PATH",
    help=(
        "With --relocated: the cache dir as your jobs spell it (their "
        "JAX_COMPILATION_CACHE_DIR); without it, entries written for another spelling of "
        "this folder are kept."
    ),
)
@click.option(
    "--stale-jax",
    is_flag=True,
    help="Entries written by another jaxlib; those another JAX version used lately are kept.",
)
@click.option(
    "--stale-jax-in-use",
    is_flag=True,
    help="As --stale-jax, and also the entries another JAX version sharing the cache uses.",
)
@click.option(
    "--module",
    metavar="GLOB",
    help="Alone: entries of matching modules. With other selectors: only these modules.",
)
@click.option("--xla-subcaches", is_flag=True, help="Also clear XLA's autotune/kernel sub-caches.")
@click.option(
    "--repair",
    is_flag=True,
    help="Fix instead of delete: recreate missing -atime files, drop stale temp files, chmod go-w.",
)
@click.option(
    "--stale-after",
    type=DURATION,
    default="24h",
    show_default=True,
    metavar="AGE",
    help="Age after which temp files and manifests without entry count as left over.",
)
@click.option("--apply", "do_apply", is_flag=True, help="Make the changes (default: dry run).")
@json_flag()
@click.option(
    "--lock-timeout",
    type=DURATION,
    default="30s",
    show_default=True,
    metavar="AGE",
    help="How long to wait for JAX's lock.",
)
@click.pass_context
def prune(
    ctx: click.Context,
    directory: Location | None,
    older_than: float | None,
    max_size: int | None,
    duplicates: bool,
    corrupt: bool,
    orphans: bool,
    relocated: bool,
    jobs_cache_dir: str | None,
    stale_jax: bool,
    stale_jax_in_use: bool,
    module: str | None,
    xla_subcaches: bool,
    repair: bool,
    stale_after: float,
    do_apply: bool,
    as_json: bool,
    lock_timeout: float,
) -> None:
    """Remove cache entries by rule, safely next to running JAX processes.

    Selectors combine: an entry is removed when any selected rule matches, and the plan says
    which rule took it. Without --apply nothing changes. With it, each entry goes with its
    -atime file and manifest, under JAX's own lock, re-checked right before removal.
    DIR may be gs://bucket/prefix or s3://bucket/prefix: there, each delete is conditional on
    the object's generation/ETag at planning time (an object rewritten since is kept).
    Exit status: 0 done (or dry run), 1 some action failed, 2 usage or I/O error, or DIR does
    not look like a JAX cache.
    """
    from cachedoctor.core.prune.apply import plan_and_apply
    from cachedoctor.core.prune.options import PruneOptions
    from cachedoctor.core.prune.planner import plan_prune

    # click's types have checked each value with units.py's grammar; the options read the
    # spelling the user typed (the plan reports it), as the API's do
    options = PruneOptions.from_selectors(
        older_than=as_typed(ctx, "older_than"),
        max_size=as_typed(ctx, "max_size"),
        duplicates=duplicates,
        corrupt=corrupt,
        orphans=orphans,
        relocated=relocated,
        jobs_cache_dir=jobs_cache_dir,
        stale_jax=stale_jax,
        stale_jax_in_use=stale_jax_in_use,
        module=module,
        xla_subcaches=xla_subcaches,
        repair=repair,
        stale_after=as_typed(ctx, "stale_after") or stale_after,
    )
    cache_dir = cache_location(directory)
    open_cache_dir(cache_dir, changes="prune --apply" if do_apply else None)
    with progress_bar(not as_json, "planning") as progress:
        plan, result = plan_and_apply(
            lambda: plan_prune(cache_dir, options, progress=progress),
            cache_dir,
            do_apply,
            lock_timeout,
            apply_progress,
        )
    _render(plan, result, as_json)
    failed = result is not None and any(o.status.value == "failed" for o in result.outcomes)
    ctx.exit(int(ExitCode.FINDINGS if failed else ExitCode.OK))


def apply_progress(total: int):  # type: ignore[no-untyped-def]
    """A callback printing ``applied N/M`` to stderr on a terminal (not in CI), or None."""
    import os
    import sys

    if total < 200 or not sys.stderr.isatty() or os.environ.get("CI"):
        return None
    from cachedoctor.render.console import stderr_console

    err = stderr_console()
    done = 0

    def report(_outcome: object) -> None:
        nonlocal done
        done += 1
        if done % 100 == 0 or done == total:
            err.print(f"\rapplied {done}/{total}", end="" if done < total else "\n")

    return report


def _render(plan: Plan, result: ApplyReport | None, as_json: bool) -> None:
    from cachedoctor.render.formats import PlanReport, renderer

    renderer("json" if as_json else "text").render(PlanReport(plan, result), stdout_console())
