"""`cachedoctor pack [DIR] -o BUNDLE` and `cachedoctor unpack BUNDLE [DIR]`."""

from __future__ import annotations

from pathlib import Path

import click

from cachedoctor.cli._common import json_flag
from cachedoctor.cli.params import DURATION, LOCATION, complete_dir
from cachedoctor.core.bundle import LEAVE_OUT
from cachedoctor.core.bundle import pack as pack_cache
from cachedoctor.core.bundle import unpack as unpack_bundle
from cachedoctor.core.where import Location, cache_location, job_spelling, open_cache_dir
from cachedoctor.errors import ExitCode, path_error
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import renderer


@click.command()
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@click.option(
    "-o",
    "--output",
    "bundle",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The bundle file to write (a tar; `tar tf` lists it).",
)
@click.option(
    "--include",
    type=click.Choice(LEAVE_OUT),
    multiple=True,
    help="Also pack what is left out by default: damaged entries, pointer-keyed ones (JAX's key "
    "holds a custom_partitioning pointer), entries another jaxlib wrote.",
)
@click.option(
    "--jaxlib",
    metavar="VERSION",
    help="The jaxlib the bundle is for (default: the one installed here); entries recorded as "
    "written by another are left out.",
)
@click.option("--force", is_flag=True, help="Replace BUNDLE if it exists.")
@json_flag()
def pack(
    directory: Location | None,
    bundle: Path,
    include: tuple[str, ...],
    jaxlib: str | None,
    force: bool,
    as_json: bool,
) -> None:
    """Pack the entries of a cache that can still hit, with their key manifests and the stats
    records, into one file to unpack elsewhere (`cachedoctor unpack`).

    The bundle's header names the jax/jaxlib that packed it and, per entry, its module, size,
    SHA-256, platform, device count and the jaxlib that wrote it where the records say. DIR
    defaults as for `scan`; gs:// and s3:// work. Exit status: 0 packed, 2 usage or I/O error.
    """
    cache_dir = cache_location(directory)
    open_cache_dir(cache_dir)
    try:
        report = pack_cache(
            cache_dir, bundle, include=frozenset(include), jaxlib=jaxlib, overwrite=force
        )
    except OSError as exc:
        if exc.filename == str(bundle):
            raise path_error(exc, bundle, what="file", verb="write") from None
        raise path_error(exc, exc.filename or cache_dir.spelling) from None
    renderer("json" if as_json else "text").render(report, stdout_console())


@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.argument(
    "directory", required=False, metavar="[DIR]", type=LOCATION, shell_complete=complete_dir
)
@click.option(
    "--as",
    "spelled_as",
    metavar="PATH",
    help="The cache dir as the jobs will spell it (default: DIR made absolute, or the configured"
    " dir when it is DIR): the preflight judges the entries there.",
)
@click.option("--apply", "do_apply", is_flag=True, help="Write the entries (default: dry run).")
@click.option(
    "--no-relocate",
    is_flag=True,
    help="Leave relocated entries under their written keys (default: entries with observe-mode "
    "manifests move to their stable keys, as `rekey --relocated`).",
)
@click.option(
    "--lock-timeout",
    type=DURATION,
    default="30s",
    show_default=True,
    metavar="AGE",
    help="How long to wait for JAX's lock when moving relocated entries.",
)
@json_flag()
@click.pass_context
def unpack(
    ctx: click.Context,
    bundle: Path,
    directory: Location | None,
    spelled_as: str | None,
    do_apply: bool,
    no_relocate: bool,
    lock_timeout: float,
    as_json: bool,
) -> None:
    """Check a bundle, say what will hit here, and (with --apply) write it into a cache.

    Every member is checked against the size and SHA-256 its header names before anything is
    written; the preflight (`cachedoctor preflight`) judges each entry as this machine's JAX
    will see it at DIR. Each file is written whole (temp file and link; on a bucket a
    create-only PUT), never over an existing one: a JAX process using DIR sees an entry
    entirely or not at all. An entry that does not decode (scan's `corrupt`) is never written.
    Once a file is written, unpack finishes and says what it wrote and what failed. DIR
    defaults as for `scan` and is made when missing; gs:// and s3:// work. Exit status: 0 every
    entry will hit (and was written), 1 some entry will miss, cannot be told, does not decode or
    failed to write (or a manifest or record failed), 2 usage or I/O error before anything was
    written, not a bundle, or no JAX here to judge with and nothing written.
    """
    target = cache_location(directory)
    if target.local_path is None or Path(target.local_path).exists():
        open_cache_dir(target)
    try:
        report = unpack_bundle(
            bundle,
            target,
            apply=do_apply,
            cache_dir=job_spelling(target, spelled_as),
            relocate=not no_relocate,
            lock_timeout=lock_timeout,
        )
    except OSError as exc:
        if exc.filename in (None, str(bundle)):
            raise path_error(exc, bundle, what="file") from None
        raise path_error(exc, exc.filename) from None
    renderer("json" if as_json else "text").render(report, stdout_console())
    if report.problem and not report.actions().get("written"):
        ctx.exit(int(ExitCode.USAGE))  # no JAX here to judge with, and nothing written
    doubtful = any(e.verdict != "hit" for e in report.entries) or report.failed()
    ctx.exit(int(ExitCode.FINDINGS if doubtful else ExitCode.OK))
