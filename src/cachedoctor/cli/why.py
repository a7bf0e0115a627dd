"""`cachedoctor why [DIR]`."""

from __future__ import annotations

import fnmatch

import click

from cachedoctor.cli._common import json_flag
from cachedoctor.cli.params import LOCATION, complete_dir
from cachedoctor.core.where import Location, cache_location, open_cache_dir
from cachedoctor.core.why import explain_misses
from cachedoctor.errors import ExitCode, path_error
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer


@click.command()
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@click.option("--module", metavar="NAME", help="Only this module (a glob such as 'jit_*' works).")
@json_flag()
@click.pass_context
def why(ctx: click.Context, directory: Location | None, module: str | None, as_json: bool) -> None:
    """Why did a run miss: each recorded miss against the nearest earlier key of its module.

    For every key JAX looked up and did not find, in processes that record (`cachedoctor enable
    --stats-only`, or the hook in any mode), names each component of JAX's key that differs
    from the nearest earlier key of the same module, in words, first cause first: jaxlib
    version, backend, XLA flags, devices, compression, compile options, the program (a
    custom_partitioning pointer named as such, JAX's pointer flag turned on or off too).
    "unknown" says what to turn on where no record exists. DIR defaults as for `scan`; gs:// and
    s3:// work. Runs that used the cache read-only record outside it: DIR may be the cache or
    their records folder, and either way every record of the cache is read.

    Exit status: 0 every recorded miss explained or a first compile, 1 some miss unexplained
    (unknown, or misses without recorded components), 2 usage or I/O error.
    """
    cache_dir = cache_location(directory)
    open_cache_dir(cache_dir)
    try:
        report = explain_misses(cache_dir)
    except OSError as exc:
        raise path_error(exc, exc.filename or cache_dir.spelling) from None
    if module is not None:
        report.misses = [m for m in report.misses if fnmatch.fnmatchcase(m.module, module)]
        report.unrecorded = {
            k: v for k, v in report.unrecorded.items() if fnmatch.fnmatchcase(k, module)
        }
    renderer("json" if as_json else "text").render(report, stdout_console())
    unexplained = report.unrecorded or any(m.verdict == "unknown" for m in report.misses)
    ctx.exit(int(ExitCode.FINDINGS if unexplained else ExitCode.OK))
