"""The Python API: what the commands compute, as typed reports, for notebooks and scripts.

Each function returns the same frozen dataclass the CLI renders; ``report.to_dict()`` gives
plain JSON-ready data. Bad input raises :class:`cachedoctor.CachedoctorError` (its message is
the one line the CLI prints). Nothing here changes a cache: ``prune_plan`` only plans.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cachedoctor.errors import CachedoctorError
from cachedoctor.stablekeys.settings import resolve_cache_dir

if TYPE_CHECKING:
    from cachedoctor.core.diff.report import DiffReport
    from cachedoctor.core.prune.actions import Plan
    from cachedoctor.core.scan.report import ScanReport
    from cachedoctor.core.stats import StatsReport

PathLike = str | os.PathLike[str]


def _dir(cache_dir: PathLike | None) -> str:
    return resolve_cache_dir(os.fspath(cache_dir) if cache_dir is not None else None)


def scan(cache_dir: PathLike | None = None) -> ScanReport:
    """What ``cachedoctor scan`` reports: summary, modules, entries and findings.

    ``cache_dir`` may be a ``gs://`` / ``s3://`` URL; None means ``$JAX_COMPILATION_CACHE_DIR``,
    then the directory ``cachedoctor enable`` configured.
    """
    from cachedoctor.core.scan.run import scan_directory
    from cachedoctor.storage.stores import one_line_errors, open_store
    from cachedoctor.storage.urls import is_url

    where = _dir(cache_dir)
    with one_line_errors(where):
        try:
            return scan_directory(open_store(where) if is_url(where) else where)
        except FileNotFoundError:
            raise CachedoctorError(f"no such directory: {where}", slug="no-such-dir") from None


def diff(a: PathLike, b: PathLike) -> DiffReport:
    """Why two entry files are different entries (``cachedoctor diff A B``): a verdict with
    its evidence, and the option, HLO and executable differences."""
    from cachedoctor.core.diff.compare import diff_entries

    return diff_entries(a, b)


def stats(
    cache_dir: PathLike | None = None,
    *,
    since: str | float | None = None,
    module: str | None = None,
) -> StatsReport:
    """What ``cachedoctor stats`` reports from the processes' records: totals, per module (never
    hit first, with the reason), per day and per host. ``since``: ``"7d"``, ``"2026-01-31"`` or
    a Unix time; ``module``: a name or glob."""
    from cachedoctor.core.stats import collect_stats, parse_since

    start = parse_since(since) if isinstance(since, str) else since
    return collect_stats(_dir(cache_dir), since=start, module=module)


def prune_plan(
    cache_dir: PathLike | None = None,
    *,
    older_than: str | None = None,
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
    its options); it deletes nothing. Apply it with ``cachedoctor prune ... --apply``."""
    from cachedoctor.core.prune.options import PruneOptions
    from cachedoctor.core.prune.planner import plan_prune
    from cachedoctor.units import parse_duration, parse_size

    try:
        size = parse_size(max_size) if isinstance(max_size, str) else max_size
        age = parse_duration(older_than) if older_than is not None else None
    except ValueError as exc:
        raise CachedoctorError(str(exc), slug="usage") from None
    options = PruneOptions(
        older_than_s=age,
        max_size=size,
        duplicates=duplicates,
        corrupt=corrupt,
        orphans=orphans,
        relocated=relocated,
        stale_jax=stale_jax,
        module=module,
        xla_subcaches=xla_subcaches,
    )
    return plan_prune(_dir(cache_dir), options)
