"""`cachedoctor show KEY|PREFIX|PATH`."""

from __future__ import annotations

import click

from cachedoctor.cache import model, reader
from cachedoctor.cache.locate import locate_entry, locate_in_store
from cachedoctor.cache.reader import decode_item
from cachedoctor.cli.params import complete_dir
from cachedoctor.errors import CachedoctorError, ExitCode
from cachedoctor.render.console import stdout_console
from cachedoctor.render.formats import ShowReport, renderer
from cachedoctor.stablekeys.settings import default_cache_dir
from cachedoctor.storage.stores import one_line_errors
from cachedoctor.storage.urls import is_url


@click.command()
@click.argument("entry")
@click.option(
    "--dir",
    "directory",
    shell_complete=complete_dir,
    metavar="DIR",
    help="Cache directory to look the key up in.",
)
@click.option("--hlo", is_flag=True, help="Also print the HLO text (rendered by jaxlib).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document.")
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
    directory: str | None,
    hlo: bool,
    as_json: bool,
    extract: str | None,
) -> None:
    """Show everything known about one cache entry.

    ENTRY is a key, a unique prefix of a key (or of its hash), or a path to a -cache file,
    or the gs:// or s3:// URL of one. --dir may be a gs://bucket/prefix or s3://bucket/prefix.
    """
    cache_dir = default_cache_dir(directory)  # --dir, $JAX_COMPILATION_CACHE_DIR, `enable`'s
    store = item = None
    if is_url(entry) or is_url(cache_dir):
        store, item = locate_in_store(entry, cache_dir)
        path = store.url_of(item.name)
        with one_line_errors(path):
            detail = decode_item(store, item, detail=True)
    else:
        path = str(locate_entry(entry, cache_dir))
        detail = reader.decode_entry(path, detail=True)
    assert isinstance(detail, model.EntryDetail)
    hlo_text = None
    if hlo:
        from cachedoctor.xla.hlo import hlo_text as render_hlo

        if detail.hlo_module is None:
            raise CachedoctorError("this entry holds no readable HLO module", slug="no-hlo")
        hlo_text = render_hlo(detail.hlo_module) or "(jaxlib could not render this module)"
    if extract:
        from cachedoctor.core.show import extract_to_file

        written = extract_to_file(path, extract, store=store, item=item)
        click.echo(f"wrote {written} bytes to {extract}", err=True)
    report = ShowReport(detail, hlo_text)
    renderer("json" if as_json else "text").render(report, stdout_console())
    ctx.exit(int(ExitCode.OK if detail.info.ok else ExitCode.FINDINGS))
