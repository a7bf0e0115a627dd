"""`cachedoctor show KEY|PREFIX|PATH`."""

from __future__ import annotations

import click

from cachedoctor.cli._common import json_flag
from cachedoctor.cli.params import LOCATION, complete_dir
from cachedoctor.core.diff.load import resolve_entry
from cachedoctor.core.where import Location, default_location
from cachedoctor.errors import CachedoctorError, ExitCode
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import ShowReport, renderer


@click.command()
@click.argument("entry")
@click.option(
    "--dir",
    "directory",
    type=LOCATION,
    shell_complete=complete_dir,
    metavar="DIR",
    help="Cache directory to look the key up in.",
)
@click.option("--hlo", is_flag=True, help="Also print the HLO text (rendered by jaxlib).")
@json_flag()
@click.option(
    "--extract",
    type=click.Path(dir_okay=False, writable=True),
    metavar="FILE",
    help="Write the decompressed serialized executable to FILE.",
)
@click.pass_context
def show(
    ctx: click.Context,
    entry: str,
    directory: Location | None,
    hlo: bool,
    as_json: bool,
    extract: str | None,
) -> None:
    """Show everything known about one cache entry.

    ENTRY is a key, a unique prefix of a key (or of its hash), or a path to a -cache file,
    or the gs:// or s3:// URL of one. --dir may be a gs://bucket/prefix or s3://bucket/prefix.
    """
    cache_dir = default_location(directory)  # --dir, $JAX_COMPILATION_CACHE_DIR, `enable`'s
    detail, where = resolve_entry(Location.parse(entry), cache_dir)
    hlo_text = original_text = None
    if hlo:
        from cachedoctor.core.show import hlo_text_of

        if detail.hlo_module is None:
            raise CachedoctorError("this entry holds no readable HLO module", slug="no-hlo")
        hlo_text = hlo_text_of(detail.hlo_module)
        if detail.original_module is not None:
            original_text = hlo_text_of(detail.original_module)
    if extract:
        from cachedoctor.core.show import extract_to_file

        written = extract_to_file(where, extract)
        click.echo(f"wrote {written} bytes to {extract}", err=True)
    from cachedoctor.core.show import entry_kernels

    report = ShowReport(detail, hlo_text, entry_kernels(detail), original_text)
    renderer("json" if as_json else "text").render(report, stdout_console())
    ctx.exit(int(ExitCode.OK if detail.info.ok else ExitCode.FINDINGS))
