"""Explain why two cache entries are two entries: the core of ``cachedoctor diff``.

``diff_entries(a, b)`` returns a frozen :class:`DiffReport` whose first field is the verdict: the
same executable under two keys (key instability), the same program with different compile
options, different programs, or different JAX/platform/target/topology. Every statement names
the data it comes from; nothing here guesses a cause the entries do not show.

What an entry holds is the *compiled* module and the compile options, not the pre-compilation
module that JAX hashes into the key. When the stable-key hook recorded key manifests
(``stablekeys.manifest``), the key's components are compared too; otherwise the report says so.
"""

from __future__ import annotations

import os

from cachedoctor.cache import listdir
from cachedoctor.cache.model import EntryDetail
from cachedoctor.core.diff.executable import executable_section
from cachedoctor.core.diff.hlo import hlo_section, kernel_section
from cachedoctor.core.diff.load import load_detail, load_item, side_of
from cachedoctor.core.diff.manifest import manifest_section
from cachedoctor.core.diff.options import options_section
from cachedoctor.core.diff.report import DEFAULT_CONTEXT, DiffReport, ModuleDiffReport
from cachedoctor.core.diff.verdict import decide
from cachedoctor.errors import CachedoctorError, EntryNotFoundError, path_error
from cachedoctor.storage import stores
from cachedoctor.storage.location import Location


def diff_details(
    a: EntryDetail,
    b: EntryDetail,
    at: tuple[Location, Location],
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> DiffReport:
    """Compare two decoded entries, read from ``at`` (their files or objects; see
    :func:`diff_entries`)."""
    if at[0].local_path is None or at[1].local_path is None:  # an object: the same URL
        same_file = a.info.path == b.info.path
    else:
        try:
            same_file = os.path.samefile(a.info.path, b.info.path)
        except OSError:
            same_file = False
    side_a, side_b = side_of(a.info, at[0]), side_of(b.info, at[1])
    options = options_section(a, b)
    hlo = hlo_section(a, b, context, raw_hlo)
    execs = executable_section(a, b)
    manifest = manifest_section(side_a, side_b, context)
    dirs = (str(side_a.cache_dir), str(side_b.cache_dir))
    kernels = kernel_section(a, b)
    verdict = decide(a, b, same_file, options, hlo, execs, manifest, dirs, kernels)
    return DiffReport(verdict, side_a, side_b, manifest, options, hlo, execs, kernels)


def diff_entries(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> DiffReport:
    """Explain the difference between two entry files. Raises CachedoctorError for bad input."""
    at = (Location.local(os.path.abspath(a)), Location.local(os.path.abspath(b)))
    return diff_details(load_detail(a), load_detail(b), at, context=context, raw_hlo=raw_hlo)


def diff_module(
    where: Location,
    module: str,
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> ModuleDiffReport:
    """Every entry of ``module`` in ``where`` against the most recently written one."""
    store: stores.Store | None = None
    folder = where.local_path
    if folder is None:  # a bucket: listed and read through its store
        root = where.spelling
        store = where.store()
    else:
        root = os.path.abspath(folder)
    try:
        with stores.one_line_errors(root):
            listing = listdir.list_cache(store if store is not None else root)
    except OSError as exc:
        raise path_error(exc, root) from exc
    items = [
        i
        for i in listing.entries
        if i.key and listdir.parse_key(i.key) and listdir.parse_key(i.key)[1] == module  # type: ignore[index]
    ]
    if not items:
        known = sorted(
            {
                m
                for i in listing.entries
                if i.key and (p := listdir.parse_key(i.key)) and (m := p[1])
            }
        )
        hint = f"; modules here: {', '.join(known[:8])}" if known else ""
        raise EntryNotFoundError(f"no entries of module {module!r} in {root}{hint}")
    items.sort(key=lambda i: (i.mtime_ns, i.name))
    latest = items[-1]

    def load(item: listdir.DirItem) -> EntryDetail:
        return load_item(store, item) if store is not None else load_detail(listing.path(item))

    def at(item: listdir.DirItem) -> Location:
        """The entry's object, or its file as the decoder names it (absolute)."""
        if store is not None:
            return where.child(item.name)
        return Location.local(os.path.abspath(listing.path(item)))

    decoded: list[tuple[listdir.DirItem, EntryDetail]] = []
    undecodable: list[str] = []
    for item in items:
        try:
            decoded.append((item, load(item)))
        except CachedoctorError as exc:  # one bad entry must not hide the pairs that compare
            undecodable.append(f"{item.key}: {exc}")
    if not decoded:
        return ModuleDiffReport(module, root, None, (), tuple(undecodable))
    latest, latest_detail = decoded[-1]
    reports = tuple(
        diff_details(
            detail, latest_detail, (at(item), at(latest)), context=context, raw_hlo=raw_hlo
        )
        for item, detail in decoded[:-1]
    )
    return ModuleDiffReport(module, root, latest.key, reports, tuple(undecodable))
