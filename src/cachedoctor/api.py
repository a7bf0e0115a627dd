"""The Python API: what the commands compute, as typed reports, for notebooks and scripts.

Each function returns the same frozen dataclass the CLI renders; ``report.to_dict()`` gives
plain JSON-ready data. Bad input raises :class:`cachedoctor.CachedoctorError` (its message is
the one line the CLI prints). Nothing here changes a cache: ``prune_plan`` only plans.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cachedoctor.errors import CachedoctorError

if TYPE_CHECKING:
    from cachedoctor.core.diff.report import DiffReport
    from cachedoctor.core.prune.actions import Plan
    from cachedoctor.core.scan.report import ScanReport
    from cachedoctor.core.stats import StatsReport
    from cachedoctor.core.where import Location

PathLike = str | os.PathLike[str]


def _usage(message: str) -> CachedoctorError:
    return CachedoctorError(message, slug="usage")


def _path(value: object, name: str) -> str:
    """A path argument as a str; anything else (a number, bytes, None) is bad input."""
    if isinstance(value, str | os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str) and path:
            return path
    raise _usage(f"{name}: expected a path (str or os.PathLike), not {value!r:.60}")


def _location(cache_dir: object) -> Location:
    """The Location of the cache directory named (or the effective one): the API's edge."""
    from cachedoctor.core.where import Location, cache_location

    if isinstance(cache_dir, Location):
        return cache_dir
    return cache_location(None if cache_dir is None else _path(cache_dir, "cache_dir"))


def _dir(cache_dir: object) -> Location:
    """The cache directory named (or the effective one), checked: it exists, is readable and
    is empty or holds a JAX cache."""
    from cachedoctor.core.where import open_cache_dir

    where = _location(cache_dir)
    open_cache_dir(where)
    return where


def _optional_str(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _usage(f"{name}: expected a str or None, not {value!r:.60}")


def _flag(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _usage(f"{name}: expected True or False, not {value!r:.60}")


def scan(cache_dir: PathLike | Location | None = None) -> ScanReport:
    """What ``cachedoctor scan`` reports: summary, modules, entries and findings.

    ``cache_dir`` may be a ``gs://`` / ``s3://`` URL or a ``Location``; None means
    ``$JAX_COMPILATION_CACHE_DIR``, then the directory ``cachedoctor enable`` configured.
    """
    from cachedoctor.core.scan.run import scan_directory
    from cachedoctor.errors import NotACacheError, path_error
    from cachedoctor.storage.stores import one_line_errors

    where = _location(cache_dir)
    with one_line_errors(where.spelling):
        try:
            report = scan_directory(where)
        except OSError as exc:
            raise path_error(exc, where.spelling) from None
    if not report.looks_like_cache:
        raise NotACacheError(where.spelling, report.other_file_count)
    return report


def diff(a: PathLike, b: PathLike) -> DiffReport:
    """Why two entry files are different entries (``cachedoctor diff A B``): a verdict with
    its evidence, and the option, HLO and executable differences."""
    from cachedoctor.core.diff.compare import diff_entries
    from cachedoctor.errors import path_error

    first, second = _path(a, "a"), _path(b, "b")
    try:
        return diff_entries(first, second)
    except OSError as exc:
        raise path_error(exc, exc.filename or first, what="file") from None


def stats(
    cache_dir: PathLike | Location | None = None,
    *,
    since: str | float | None = None,
    module: str | None = None,
) -> StatsReport:
    """What ``cachedoctor stats`` reports from the processes' records: totals, per module (never
    hit first, with the reason), per day and per host. ``since``: ``"7d"``, ``"2w"``,
    ``"2026-01-31"`` or a Unix time (a number, or a string of one); ``module``: a name or glob."""
    from cachedoctor.core.stats import collect_stats
    from cachedoctor.errors import path_error
    from cachedoctor.units import parse_since

    try:
        start = None if since is None else parse_since(since)
    except ValueError as exc:
        raise _usage(f"since: {exc}") from None
    pattern = _optional_str(module, "module")
    where = _dir(cache_dir)
    try:
        return collect_stats(where, since=start, module=pattern)
    except OSError as exc:
        raise path_error(exc, exc.filename or where.spelling) from None


def prune_plan(
    cache_dir: PathLike | Location | None = None,
    *,
    older_than: str | float | None = None,
    max_size: str | int | None = None,
    duplicates: bool = False,
    corrupt: bool = False,
    orphans: bool = False,
    relocated: bool = False,
    stale_jax: bool = False,
    module: str | None = None,
    xla_subcaches: bool = False,
) -> Plan:
    """The plan ``cachedoctor prune`` would carry out with these selectors (the same names as
    its options); it deletes nothing. Apply it with ``cachedoctor prune ... --apply``.
    ``older_than``: ``"30d"``, ``"2w"`` or seconds; ``max_size``: ``"50GB"``, ``"800MiB"`` or
    bytes."""
    from cachedoctor.core.prune.options import PruneOptions
    from cachedoctor.core.prune.planner import plan_prune
    from cachedoctor.errors import path_error
    from cachedoctor.units import parse_duration, parse_size

    try:
        size = None if max_size is None else parse_size(max_size)
    except ValueError as exc:
        raise _usage(f"max_size: {exc}") from None
    try:
        age = None if older_than is None else parse_duration(older_than)
    except ValueError as exc:
        raise _usage(f"older_than: {exc}") from None
    options = PruneOptions(
        older_than_s=age,
        max_size=size,
        duplicates=_flag(duplicates, "duplicates"),
        corrupt=_flag(corrupt, "corrupt"),
        orphans=_flag(orphans, "orphans"),
        relocated=_flag(relocated, "relocated"),
        stale_jax=_flag(stale_jax, "stale_jax"),
        module=_optional_str(module, "module"),
        xla_subcaches=_flag(xla_subcaches, "xla_subcaches"),
    )
    where = _dir(cache_dir)
    try:
        return plan_prune(where, options)
    except OSError as exc:
        raise path_error(exc, exc.filename or where.spelling) from None
