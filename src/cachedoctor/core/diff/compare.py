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
from cachedoctor.core.diff.hlo import hlo_section
from cachedoctor.core.diff.load import load_detail, load_item, side_of
from cachedoctor.core.diff.manifest import manifest_section
from cachedoctor.core.diff.options import options_section
from cachedoctor.core.diff.report import DEFAULT_CONTEXT, DiffReport, ModuleDiffReport
from cachedoctor.core.diff.verdict import decide
from cachedoctor.errors import CachedoctorError, EntryNotFoundError, path_error
from cachedoctor.storage import stores
from cachedoctor.storage.location import Location, Where


def diff_details(
    a: EntryDetail,
    b: EntryDetail,
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> DiffReport:
    """Compare two decoded entries (see :func:`diff_entries`)."""
    if not (Location.parse(a.info.path).is_local and Location.parse(b.info.path).is_local):
        same_file = a.info.path == b.info.path
    else:
        try:
            same_file = os.path.samefile(a.info.path, b.info.path)
        except OSError:
            same_file = False
    side_a, side_b = side_of(a.info), side_of(b.info)
    options = options_section(a, b)
    hlo = hlo_section(a, b, context, raw_hlo)
    execs = executable_section(a, b)
    manifest = manifest_section(side_a, side_b, context)
    verdict = decide(a, b, same_file, options, hlo, execs, manifest)
    return DiffReport(verdict, side_a, side_b, manifest, options, hlo, execs)


def diff_entries(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> DiffReport:
    """Explain the difference between two entry files. Raises CachedoctorError for bad input."""
    return diff_details(load_detail(a), load_detail(b), context=context, raw_hlo=raw_hlo)


def diff_module(
    cache_dir: Where,
    module: str,
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> ModuleDiffReport:
    """Every entry of ``module`` against the most recently written one."""
    where = Location.parse(cache_dir)
    store: stores.Store | None = None
    if not where.is_local:
        root = where.spelling
        store = where.store()
    else:
        root = os.path.abspath(where.spelling)
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
        diff_details(detail, latest_detail, context=context, raw_hlo=raw_hlo)
        for _, detail in decoded[:-1]
    )
    return ModuleDiffReport(module, root, latest.key, reports, tuple(undecodable))
