"""`cachedoctor diff A B` and `cachedoctor diff --module NAME`."""

from __future__ import annotations

import click

from cachedoctor.cli._common import json_flag
from cachedoctor.cli.params import LOCATION, complete_dir
from cachedoctor.core.where import Location, cache_location, default_location
from cachedoctor.errors import ExitCode
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer


@click.command()
@click.argument("a", required=False)
@click.argument("b", required=False)
@click.option(
    "--dir",
    "directory",
    type=LOCATION,
    shell_complete=complete_dir,
    metavar="DIR",
    help="Cache directory to look keys up in.",
)
@click.option(
    "--module",
    "module",
    metavar="NAME",
    help="Compare every entry of module NAME with its most recent entry.",
)
@json_flag()
@click.option(
    "--hlo-context",
    type=click.IntRange(0, 10_000),
    default=3,
    show_default=True,
    metavar="N",
    help="Lines of context in HLO diffs.",
)
@click.option("--raw-hlo", is_flag=True, help="Also diff the real HLO text (rendered by jaxlib).")
@click.pass_context
def diff(
    ctx: click.Context,
    a: str | None,
    b: str | None,
    directory: Location | None,
    module: str | None,
    as_json: bool,
    hlo_context: int,
    raw_hlo: bool,
) -> None:
    """Explain why two cache entries are different entries.

    A and B are keys, unique key prefixes or paths to -cache files (in one directory or two),
    or gs:// / s3:// URLs of entries; --dir may be a bucket prefix too.
    The verdict comes first: the same executable under two keys, the same program with other
    compile options, different programs, or a different JAX, platform or topology.

    Exit status: 0 when the entries are identical modulo volatile fields, 1 when they differ,
    2 on errors.
    """
    from cachedoctor.core.diff.compare import diff_details, diff_module
    from cachedoctor.core.diff.load import resolve_entry

    if module is not None:
        if a is not None or b is not None:
            raise click.UsageError("give either A and B, or --module NAME, not both")
        report = diff_module(
            cache_location(directory), module, context=hlo_context, raw_hlo=raw_hlo
        )
        renderer("json" if as_json else "text").render(report, stdout_console())
        ctx.exit(int(ExitCode.OK if report.equivalent else ExitCode.FINDINGS))
    if a is None or b is None:
        raise click.UsageError("give two entries (A and B), or --module NAME")
    cache_dir = default_location(directory)  # --dir, $JAX_COMPILATION_CACHE_DIR, `enable`'s
    first, at_a = resolve_entry(Location.parse(a), cache_dir, to_compare=True)
    second, at_b = resolve_entry(Location.parse(b), cache_dir, to_compare=True)
    result = diff_details(first, second, (at_a, at_b), context=hlo_context, raw_hlo=raw_hlo)
    renderer("json" if as_json else "text").render(result, stdout_console())
    ctx.exit(int(ExitCode.OK if result.equivalent else ExitCode.FINDINGS))
