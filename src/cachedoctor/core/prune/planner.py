"""Core of ``cachedoctor prune``: the plan of what to remove, from the rules run in order over
one ``PruneContext`` (``rules.py``). Planning never changes the cache; ``apply.py`` does.
"""

from __future__ import annotations

import fnmatch
import time

from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.core.prune import context, rules
from cachedoctor.core.prune.actions import Op, Plan, Rule, open_dir
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.rules import plan_folder_bound
from cachedoctor.core.scan.report import ProgressCallback
from cachedoctor.errors import CachedoctorError
from cachedoctor.storage import stores
from cachedoctor.storage.location import Location, Where


def plan_prune(
    cache_dir: Where,
    options: PruneOptions,
    *,
    now: float | None = None,
    jax_info: JaxInfo | None = None,
    progress: ProgressCallback | None = None,
) -> Plan:
    """What ``prune`` would do with these options. Reads the directory; changes nothing.
    ``progress(done, total)`` follows the entries decoded (only some rules decode)."""
    if not options.anything:
        raise CachedoctorError(
            "nothing selected: give at least one of --older-than, --max-size, --duplicates, "
            "--corrupt, --orphans, --relocated, --stale-jax, --module, --xla-subcaches, --repair",
            slug="usage",
        )
    where = Location.parse(cache_dir)
    if options.repair and not where.has_modes:
        raise CachedoctorError(
            "--repair works on local cache directories only: it recreates -atime files for "
            "JAX's LRU eviction and fixes file modes, and a gs:// or s3:// cache has neither",
            slug="usage",
        )
    now = time.time() if now is None else now
    jax_info = jax_info or installed_jax()
    with stores.one_line_errors(where.spelling), open_dir(where) as cd:
        ctx = context.PruneContext(cd, options, now, jax_info, where.spelling, progress)
        return _plan(ctx)


def _plan(ctx: context.PruneContext) -> Plan:
    """The rules in order: entry rules mark entries (a marked entry is removed whole), then the
    files beside the entries, then the stats folder's bound."""
    options = ctx.options
    entries = context.collect_entries(ctx)
    if options.module is not None:
        pattern = options.module
        entries = {k: e for k, e in entries.items() if fnmatch.fnmatchcase(e.module or "", pattern)}
        if not options.entry_rules:
            for e in entries.values():
                e.rules.append((Rule.MODULE, f"module matches {pattern}"))
    report = context.decode_for_rules(ctx, entries)
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
    ctx.actions += [context.remove_entry(entries[key]) for key in entries if key in removed]
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
