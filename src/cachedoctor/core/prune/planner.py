"""Core of ``cachedoctor prune``: the plan of what to remove, from the rules run in order over
one ``PruneContext`` (``rules.RULES``). Planning never changes the cache; ``apply.py`` does.
"""

from __future__ import annotations

import time

from cachedoctor.cache.jaxenv import JaxInfo, installed_jax
from cachedoctor.core.prune import context
from cachedoctor.core.prune.actions import Action, Op, Plan, open_dir
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.rules import RULES
from cachedoctor.core.scan.report import ProgressCallback
from cachedoctor.errors import CachedoctorError
from cachedoctor.storage import stores
from cachedoctor.storage.location import Location


def plan_prune(
    cache_dir: Location,
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
    where = cache_dir
    if options.repair and not where.has_modes:
        raise CachedoctorError(
            "--repair works on local cache directories only: it recreates -atime files for "
            "JAX's LRU eviction and fixes file modes, and a gs:// or s3:// cache has neither",
            slug="usage",
        )
    now = time.time() if now is None else now
    jax_info = jax_info or installed_jax()
    with stores.one_line_errors(where.spelling), open_dir(where) as cd:
        ctx = context.PruneContext(cd, options, now, jax_info, where, progress)
        return _plan(ctx)


def _plan_order(a: Action) -> tuple[int, str]:
    """Actions by kind; within a kind by name, save the entry removals, which keep the order
    ``rules.remove_marked`` gave them (``--max-size``'s in eviction order; the sort is stable)."""
    return list(Op).index(a.op), "" if a.op is Op.REMOVE_ENTRY else a.name


def _plan(ctx: context.PruneContext) -> Plan:
    """Every selected rule of ``rules.RULES``, in its order, over the cache's entries."""
    options = ctx.options
    ctx.notes.append(options.understood())
    state = context.PlanState(context.collect_entries(ctx))
    for rule in RULES:
        if rule.selected(options):
            rule.apply(ctx, state)
    ctx.actions.sort(key=_plan_order)
    return Plan(
        command="prune",
        cache_dir=ctx.where.resolved(),
        created_at=ctx.now,
        selectors=options.selectors,
        actions=tuple(ctx.actions),
        skipped=tuple(ctx.skipped),
        notes=tuple(ctx.notes),
        eviction_in_use=ctx.eviction_in_use,
        jax_version=ctx.jax.jax_version,
        jaxlib_version=ctx.jax.jaxlib_version,
    )
