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
    from collections.abc import Sequence
    from concurrent.futures import Executor

    from cachedoctor.core.diff.report import DiffReport
    from cachedoctor.core.lint import LintReport
    from cachedoctor.core.metrics import StatsMetrics
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


def _since(value: str | float | None) -> float | None:
    """``since`` read as ``--since`` reads it."""
    from cachedoctor.units import parse_since

    try:
        return None if value is None else parse_since(value)
    except ValueError as exc:
        raise _usage(f"since: {exc}") from None


def _executor(value: object) -> Executor | None:
    from concurrent.futures import Executor

    if value is None or isinstance(value, Executor):
        return value
    raise _usage(f"executor: expected a concurrent.futures.Executor or None, not {value!r:.60}")


def scan(
    cache_dir: PathLike | Location | None = None, *, executor: Executor | None = None
) -> ScanReport:
    """What ``cachedoctor scan`` reports: summary, modules, entries and findings.

    ``cache_dir`` may be a ``gs://`` / ``s3://`` URL or a ``Location``; None means
    ``$JAX_COMPILATION_CACHE_DIR``, then the directory ``cachedoctor enable`` configured.
    ``executor`` (a thread or process pool, a Dask client's ``get_executor()``) decodes the
    entries instead of cachedoctor's own pool, in chunks; the report is the same
    (``--executor``).
    """
    from cachedoctor.core.scan.run import scan_directory
    from cachedoctor.errors import NotACacheError, path_error
    from cachedoctor.storage.stores import one_line_errors

    pool = _executor(executor)
    where = _location(cache_dir)
    with one_line_errors(where.spelling):
        try:
            report = scan_directory(where, executor=pool)
        except OSError as exc:
            raise path_error(exc, where.spelling) from None
    if not report.looks_like_cache:
        raise NotACacheError(where.spelling, report.other_file_count)
    return report


def lint(
    cache_dir: PathLike | Location | None = None,
    *,
    fail_on: str = "error",
    ignore: Sequence[str] = (),
    baseline: PathLike | None = None,
    executor: Executor | None = None,
) -> LintReport:
    """What ``cachedoctor lint`` judges: the scan's and the stats records' findings, each with
    its fingerprint, whether ``baseline`` (a ``--write-baseline`` file) accepts it and whether
    it fails at ``fail_on`` (``"info"``, ``"warning"``, ``"error"``); ``ignore``: finding kinds
    to leave out. ``executor`` as for :func:`scan`."""
    from cachedoctor.core import lint as core
    from cachedoctor.core.findings import Severity
    from cachedoctor.errors import NotACacheError
    from cachedoctor.storage.stores import one_line_errors

    try:
        severity = Severity.parse(fail_on) if isinstance(fail_on, str) else None
    except KeyError:
        severity = None
    if severity is None:
        raise _usage(f"fail_on: expected 'info', 'warning' or 'error', not {fail_on!r:.60}")
    if isinstance(ignore, str) or not all(isinstance(k, str) for k in ignore):
        raise _usage(f"ignore: expected a sequence of finding kinds, not {ignore!r:.60}")
    kinds = core.parse_kinds(ignore)
    pool = _executor(executor)
    where = _location(cache_dir)
    path = None if baseline is None else _path(baseline, "baseline")
    with one_line_errors(where.spelling):
        report = core.lint_directory(
            where, fail_on=severity, ignore=kinds, baseline_path=path, executor=pool
        )
    if not report.scan.looks_like_cache:
        raise NotACacheError(where.spelling, report.scan.other_file_count)
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

    start = _since(since)
    pattern = _optional_str(module, "module")
    where = _dir(cache_dir)
    try:
        return collect_stats(where, since=start, module=pattern)
    except OSError as exc:
        raise path_error(exc, exc.filename or where.spelling) from None


def metrics(
    cache_dir: PathLike | Location | None = None,
    *,
    since: str | float | None = None,
    module: str | None = None,
    max_modules: int = 25,
) -> StatsMetrics:
    """What ``cachedoctor stats --format openmetrics`` prints, as plain data: ``families``, each
    with its ``name``, ``type``, ``unit``, ``help`` and ``samples`` (name, labels, value);
    ``value(sample, **labels)`` reads one, ``stats`` is the report they come from.
    ``since`` and ``module`` as for :func:`stats`; ``max_modules`` modules have their own
    ``module`` label, the rest add up under ``(other modules)``."""
    from cachedoctor.core.metrics import collect_metrics
    from cachedoctor.errors import path_error

    if isinstance(max_modules, bool) or not isinstance(max_modules, int) or max_modules < 0:
        raise _usage(f"max_modules: expected a count (an int, 0 or more), not {max_modules!r:.60}")
    start = _since(since)
    pattern = _optional_str(module, "module")
    where = _dir(cache_dir)
    try:
        return collect_metrics(where, since=start, module=pattern, max_modules=max_modules)
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
    jobs_cache_dir: str | None = None,
    stale_jax: bool = False,
    stale_jax_in_use: bool = False,
    module: str | None = None,
    xla_subcaches: bool = False,
) -> Plan:
    """The plan ``cachedoctor prune`` would carry out with these selectors (the same names as
    its options); it deletes nothing. Apply it with ``cachedoctor prune ... --apply``.
    ``older_than``: ``"30d"``, ``"2w"`` or seconds; ``max_size``: ``"50GB"``, ``"800MiB"`` or
    bytes; ``jobs_cache_dir``: the cache dir as the jobs spell it (``--relocated``)."""
    from cachedoctor.core.prune.options import PruneOptions
    from cachedoctor.core.prune.planner import plan_prune
    from cachedoctor.errors import path_error

    try:
        options = PruneOptions.from_selectors(
            older_than=older_than,
            max_size=max_size,
            duplicates=duplicates,
            corrupt=corrupt,
            orphans=orphans,
            relocated=relocated,
            jobs_cache_dir=jobs_cache_dir,
            stale_jax=stale_jax,
            stale_jax_in_use=stale_jax_in_use,
            module=module,
            xla_subcaches=xla_subcaches,
        )
    except ValueError as exc:
        raise _usage(str(exc)) from None
    where = _dir(cache_dir)
    try:
        return plan_prune(where, options)
    except OSError as exc:
        raise path_error(exc, exc.filename or where.spelling) from None
