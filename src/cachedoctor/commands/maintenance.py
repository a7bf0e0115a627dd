"""``prune``: plan which entries and files to remove, and why (applied by :mod:`commands.apply`).

The rules choose (:mod:`cachedoctor.commands.prune_rules`, one function each);
:mod:`cachedoctor.commands.plan` holds the plan model and its safety rules.
"""

from __future__ import annotations

import fnmatch
import math
import os
import time
from dataclasses import dataclass

from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.commands import prune_rules as rules
from cachedoctor.commands import scan
from cachedoctor.commands.plan import Op, Plan, Rule, open_dir
from cachedoctor.commands.stats import plan_folder_bound
from cachedoctor.errors import CachedoctorError
from cachedoctor.storage import stores, urls

DEFAULT_STALE_AFTER_S = 24 * 3600  # temp files, manifests without entry (a compile may take hours)


@dataclass(frozen=True)
class PruneOptions:
    """What ``prune`` selects. Entry rules combine: an entry goes when any selected rule matches."""

    older_than_s: float | None = None
    max_size: int | None = None
    duplicates: bool = False
    corrupt: bool = False
    orphans: bool = False
    relocated: bool = False
    stale_jax: bool = False
    module: str | None = None  # alone: a rule; with other rules: limits them to these modules
    xla_subcaches: bool = False
    repair: bool = False
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    selectors: tuple[str, ...] = ()  # the user's spelling, for the report

    @property
    def entry_rules(self) -> bool:
        return any(
            (
                self.older_than_s is not None,
                self.max_size is not None,
                self.duplicates,
                self.corrupt,
                self.relocated,
                self.stale_jax,
            )
        )

    @property
    def anything(self) -> bool:
        return self.entry_rules or any(
            (self.orphans, self.module is not None, self.xla_subcaches, self.repair)
        )


# --- parsing user values -------------------------------------------------------------------------

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` -> seconds. Raises ValueError."""
    t = text.strip().lower()
    unit = t[-1:] if t[-1:] in _DURATION_UNITS else "s"
    number = t[:-1] if t[-1:] in _DURATION_UNITS else t
    value = float(number)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30d, 12h, 90m)")
    return value * _DURATION_UNITS[unit]


def parse_size(text: str) -> int:
    """``50GB`` (10^9), ``50GiB`` (2^30), ``800M``, ``1024`` -> bytes. Raises ValueError."""
    t = text.strip().lower().replace(" ", "")
    i = len(t)
    while i and not (t[i - 1].isdigit() or t[i - 1] == "."):
        i -= 1
    number, unit = t[:i], t[i:]
    if unit not in _SIZE_UNITS or not number:
        raise ValueError(f"not a size: {text!r} (use e.g. 50GB, 800MiB, 1000000)")
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a size: {text!r} (use e.g. 50GB, 800MiB, 1000000)")
    return int(value)


def plan_prune(
    cache_dir: str | os.PathLike[str],
    options: PruneOptions,
    *,
    now: float | None = None,
    jax_info: JaxInfo | None = None,
    progress: scan.ProgressCallback | None = None,
) -> Plan:
    """What ``prune`` would do with these options. Reads the directory; changes nothing.
    ``progress(done, total)`` follows the entries decoded (only some rules decode)."""
    if not options.anything:
        raise CachedoctorError(
            "nothing selected: give at least one of --older-than, --max-size, --duplicates, "
            "--corrupt, --orphans, --relocated, --stale-jax, --module, --xla-subcaches, --repair",
            slug="usage",
        )
    if options.repair and urls.is_url(cache_dir):
        raise CachedoctorError(
            "--repair works on local cache directories only: it recreates -atime files for "
            "JAX's LRU eviction and fixes file modes, and a gs:// or s3:// cache has neither",
            slug="usage",
        )
    now = time.time() if now is None else now
    jax_info = jax_info or installed_jax()
    with stores.one_line_errors(str(cache_dir)), open_dir(cache_dir) as cd:
        ctx = rules.PruneContext(cd, options, now, jax_info, os.fspath(cache_dir), progress)
        return _plan(ctx)


def _plan(ctx: rules.PruneContext) -> Plan:
    """The rules in order: entry rules mark entries (a marked entry is removed whole), then the
    files beside the entries, then the stats folder's bound."""
    options = ctx.options
    entries = rules.collect_entries(ctx)
    if options.module is not None:
        pattern = options.module
        entries = {k: e for k, e in entries.items() if fnmatch.fnmatchcase(e.module or "", pattern)}
        if not options.entry_rules:
            for e in entries.values():
                e.rules.append((Rule.MODULE, f"module matches {pattern}"))
    report = rules.decode_for_rules(ctx, entries)
    if report is not None:
        if options.corrupt:
            rules.rule_corrupt(ctx, entries, report)
        if options.relocated:
            rules.rule_relocated(ctx, entries, report)
        if options.stale_jax:
            rules.rule_stale_jax(ctx, entries)
    if options.older_than_s is not None:
        rules.rule_older_than(ctx, entries, options.older_than_s)
    if options.duplicates:
        rules.rule_duplicates(ctx, entries)
    if options.max_size is not None:
        rules.rule_max_size(entries, options.max_size)
    removed = {e.key for e in entries.values() if e.rules}
    ctx.actions += [rules.remove_entry(entries[key]) for key in entries if key in removed]
    rules.orphan_atimes(ctx)
    if options.orphans:
        rules.rule_orphans(ctx)
    if options.repair:
        rules.rule_repair(ctx, entries, removed)
    rules.rule_xla_subcaches(ctx)
    rules.report_foreign(ctx)
    stats_actions, stats_note = plan_folder_bound(ctx.cd)
    ctx.actions += stats_actions
    ctx.notes += [stats_note] if stats_note else []
    ctx.actions.sort(key=lambda a: (list(Op).index(a.op), a.name))
    return Plan(
        command="prune",
        cache_dir=ctx.cd.path,
        created_at=ctx.now,
        selectors=options.selectors,
        actions=tuple(ctx.actions),
        skipped=tuple(ctx.skipped),
        notes=tuple(ctx.notes),
        eviction_in_use=ctx.eviction_in_use,
        jax_version=ctx.jax.jax_version,
        jaxlib_version=ctx.jax.jaxlib_version,
    )
