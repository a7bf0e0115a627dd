"""`cachedoctor preflight [DIR]`."""

from __future__ import annotations

import click

from cachedoctor.cli._common import json_flag
from cachedoctor.cli.params import LOCATION, complete_dir
from cachedoctor.core.preflight import predict
from cachedoctor.core.where import Location, cache_location, job_spelling, open_cache_dir
from cachedoctor.errors import ExitCode, path_error
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer


@click.command()
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@click.option(
    "--as",
    "spelled_as",
    metavar="PATH",
    help="The cache dir as the job will spell it (default: $JAX_COMPILATION_CACHE_DIR or the"
    " configured dir when it is DIR, else DIR made absolute): the sub-cache paths under it are"
    " hashed into the compile options.",
)
@click.option("--module", metavar="NAME", help="Only this module (a glob such as 'jit_*' works).")
@click.option("--strict", is_flag=True, help="Fail (exit 1) on modules it cannot tell about, too.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "github"]),
    default="text",
    show_default=True,
    help="github: an annotation per module that will miss (or cannot be told, with --strict).",
)
@json_flag(same_as_format=True)
@click.pass_context
def preflight(
    ctx: click.Context,
    directory: Location | None,
    spelled_as: str | None,
    module: str | None,
    strict: bool,
    fmt: str,
    as_json: bool,
) -> None:
    """Will this cache hit here: per module, before the program runs.

    Sets each entry's recorded key (a stats record or key manifest: `cachedoctor enable
    --stats-only`, or the hook in any mode, keeps them) against what JAX installed here would
    hash: jaxlib and backend versions, XLA flags in force (run it with the job's XLA_FLAGS),
    devices, compression, the compile options the environment and the cache dir's spelling
    set. A JAX setting that changes the program it lowers (x64, matmul precision) makes it
    "cannot tell" (the precision not for a stored program with no dot, convolution or custom
    call), as do entries without a record, unless their own bytes prove a miss (another
    platform, another jaxlib, more devices). DIR defaults as for `scan`; gs:// and s3:// work.

    Exit status: 0 no module will miss, 1 some module will miss (with --strict: or cannot be
    told), 2 usage or I/O error, or JAX not usable here.
    """
    cache_dir = cache_location(directory)
    open_cache_dir(cache_dir)
    try:
        spelling = job_spelling(cache_dir, spelled_as)
        report = predict(cache_dir, cache_dir=spelling, module=module)
    except OSError as exc:
        raise path_error(exc, exc.filename or cache_dir.spelling) from None
    report.strict = strict
    renderer("json" if as_json else fmt).render(report, stdout_console())
    if report.problem:
        ctx.exit(int(ExitCode.USAGE))
    ctx.exit(int(ExitCode.FINDINGS if report.failing() else ExitCode.OK))
