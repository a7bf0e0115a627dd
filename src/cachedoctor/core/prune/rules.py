"""``prune``'s rules: one interface, :class:`PruneRule`, and one ordered list, :data:`RULES`.

:func:`cachedoctor.core.prune.planner.plan_prune` collects the entries and runs every selected
rule of ``RULES`` in order over one :class:`PruneContext` and one :class:`PlanState`: narrow the
entries to ``--module``, decode them when a rule needs scan's findings, mark entries (each rule
appends its rule and reason to ``PlannedEntry.rules``), plan the marked entries' removal, then
the files beside the entries (``beside.py``) and the stats folder's bound. Rules only read the
cache; they add actions, skips and notes to the context.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Callable
from dataclasses import dataclass

from cachedoctor.core.findings import FindingKind, Severity
from cachedoctor.core.prune import beside, context
from cachedoctor.core.prune.actions import Rule, Skip
from cachedoctor.core.prune.context import (
    PlannedEntry,
    PlanState,
    PruneContext,
    expected_format,
    last_use,
)
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.scan.report import ScanReport, real_problems
from cachedoctor.core.scan.rules.keys import unstable_groups
from cachedoctor.units import format_age
from cachedoctor.xla.optionschema import undefined_debug_fields


@dataclass(frozen=True)
class PruneRule:
    """One step of a plan: ``apply`` runs when ``selected`` says the options ask for it."""

    name: str  # the selector's spelling (a ``Rule`` value), else what the step does
    selected: Callable[[PruneOptions], bool]
    apply: Callable[[PruneContext, PlanState], None]
    decodes: bool = False  # needs the entries decoded and scan's report (``PlanState.report``)


def _always(options: PruneOptions) -> bool:
    return True


def _decoded(state: PlanState) -> ScanReport:
    if state.report is None:  # RULES puts "decode" before every rule that decodes
        raise AssertionError("a rule that reads scan's report ran before the entries were decoded")
    return state.report


# --- the steps before and after the entry rules -------------------------------------------------


def rule_module(ctx: PruneContext, state: PlanState) -> None:
    """``--module``: with other rules, limits them to the modules matching the glob; alone,
    selects those modules' entries."""
    pattern = ctx.options.module or ""
    entries = state.entries
    state.entries = {
        k: e for k, e in entries.items() if fnmatch.fnmatchcase(e.module or "", pattern)
    }
    if not ctx.options.entry_rules:
        for e in state.entries.values():
            e.rules.append((Rule.MODULE, f"module matches {pattern}"))


def decode(ctx: PruneContext, state: PlanState) -> None:
    state.report = context.decode_for_rules(ctx, state.entries)


def remove_marked(ctx: PruneContext, state: PlanState) -> None:
    """A marked entry is removed whole (``context.remove_entry``)."""
    marked = [e for e in state.entries.values() if e.rules]
    state.removed = {e.key for e in marked}
    ctx.actions += [context.remove_entry(e) for e in marked]


# --- the rules that mark entries ----------------------------------------------------------------


def rule_corrupt(ctx: PruneContext, state: PlanState) -> None:
    """``--corrupt``: exactly scan's ``corrupt`` errors (the decoder's evidence); a truncation
    under a minute old and unreadable files are skipped, as scan says."""
    entries = state.entries
    for f in _decoded(state).findings:
        if f.kind is FindingKind.UNREADABLE:  # scan says the same: never removed
            ctx.skipped.extend(
                Skip(k, f.message.partition(": ")[2], Rule.CORRUPT)
                for k in f.entries
                if k in entries
            )
            continue
        if f.kind is not FindingKind.CORRUPT:
            continue
        for key in f.entries:
            if key not in entries:
                continue
            if f.severity < Severity.ERROR:  # scan's "may be a write in progress"
                ctx.skipped.append(
                    Skip(
                        key,
                        "truncated but written under a minute ago: may be a JAX write in progress",
                        Rule.CORRUPT,
                    )
                )
                continue
            problem = real_problems(entries[key].info)[0]  # type: ignore[arg-type]
            entries[key].rules.append((Rule.CORRUPT, f"{problem.kind}: {problem.message}"))


def rule_relocated(ctx: PruneContext, state: PlanState) -> None:
    """``--relocated``: exactly scan's ``relocated`` finding (compile options naming a cache path
    other than the one JAX builds from the directory as spelled here, in an option JAX hashes,
    with no stable-key manifest)."""
    from cachedoctor.storage.urls import jax_spelling

    entries = state.entries
    spelled = jax_spelling(ctx.as_given)
    found = [f for f in _decoded(state).findings if f.kind is FindingKind.RELOCATED]
    if found:
        ctx.notes.append(
            f"--relocated is judged for the cache dir spelled {spelled}, as given: JAX hashes the "
            "spelling, not the directory, so if your runs spell it otherwise, plan with theirs"
        )
    for f in found:
        kernel = "xla_gpu_kernel_cache_file" in f.message  # the option this finding is about
        for key in f.entries:
            if key in entries:
                e = entries[key]
                where = (
                    (e.info.kernel_cache_file if kernel else e.info.autotune_dir) if e.info else ""
                )
                where_dir = os.path.dirname(where or "") or "."
                e.rules.append(
                    (
                        Rule.RELOCATED,
                        f"written for a cache spelled {where_dir}; JAX hashes the spelling, "
                        f"so it misses with the cache dir spelled {spelled}",
                    )
                )


def rule_stale_jax(ctx: PruneContext, state: PlanState) -> None:
    """``--stale-jax``: the jaxlib a manifest records, else the entry's payload layout, against
    the installed jaxlib."""
    installed = ctx.jax.jaxlib_version
    if installed is None:
        ctx.notes.append("--stale-jax: jaxlib is not installed here, so nothing is stale")
        return
    want = expected_format(installed)
    for e in state.entries.values():
        if e.manifest is not None and e.manifest.jaxlib:
            if e.manifest.jaxlib != installed:
                e.rules.append(
                    (
                        Rule.STALE_JAX,
                        f"manifest: written by jaxlib {e.manifest.jaxlib}, "
                        f"installed is {installed}",
                    )
                )
            continue
        info = e.info
        if info is None or any(p.kind != "unsupported" for p in info.problems):
            continue
        other = undefined_debug_fields(info.debug_fields)
        if other and other[0]:
            e.rules.append(
                (
                    Rule.STALE_JAX,
                    f"compile options: DebugOptions fields {min(other[0])} and "
                    f"{len(other[0]) - 1} more that jaxlib {installed} does not define",
                )
            )
            continue
        era = info.payload_format
        if want is not None and era is not None and era != want:
            e.rules.append(
                (
                    Rule.STALE_JAX,
                    f"format {info.format_label}: jaxlib {installed} writes {want} entries",
                )
            )
    ctx.notes.append(
        "--stale-jax decides from manifests (their jaxlib version) when present, else from the "
        "entry's compile options (DebugOptions fields the installed jaxlib does not define: "
        "another jaxlib's defaults), else its layout (pjrt_ifrt header since jaxlib 0.9.1)"
    )


def rule_older_than(ctx: PruneContext, state: PlanState) -> None:
    """``--older-than``: the last use a record shows (JAX's ``-atime``, or a read's access
    time), else the file time."""
    limit_ns = (ctx.now - (ctx.options.older_than_s or 0.0)) * 1e9
    for e in state.entries.values():
        last, source = last_use(e)
        if last < limit_ns:
            age = ctx.now - last / 1e9
            e.rules.append((Rule.OLDER_THAN, f"last used {format_age(age)} ago ({source})"))


def rule_duplicates(ctx: PruneContext, state: PlanState) -> None:
    """``--duplicates``: in scan's unstable-key groups (the stored HLO shows a per-run key
    input), remove only the entries that records show no process will look up again; an entry
    with a record of use, or a stable-key manifest, is always kept (``core/usage/lookups``)."""
    entries = state.entries
    infos = [e.info for e in entries.values() if e.info is not None]
    for group, _evidence in unstable_groups(infos):
        members = [entries[i.key] for i in group]
        removed = 0
        for m in members:
            why = _not_looked_up(m, members)
            if why is not None:
                if m.use is not None and m.use.read_since_written is False:
                    m.cache_id = dataclasses.replace(m.cache_id, unread=True)
                m.rules.append((Rule.DUPLICATES, why))
                removed += 1
        if not removed:
            module = members[0].module or "(unnamed)"
            uses = "; ".join(f"{m.key[-12:]}: {m.use.evidence}" for m in members if m.use)
            ctx.skipped.append(
                Skip(
                    module,
                    f"{len(members)} entries of one program kept: cannot tell which key runs "
                    f"use ({uses})",
                    Rule.DUPLICATES,
                )
            )
    ctx.notes.append(
        "--duplicates removes a copy of a program whose key changes between runs only on a "
        "record that no run looks it up again: its manifest shows a pointer in the key, it was "
        "never read while a later run wrote another key, or it has no manifest beside the "
        "stable key hooked runs look up; a copy with a record of use (-atime, access time, a "
        "hit in a stats record) or a stable-key manifest is kept"
    )


def _not_looked_up(m: PlannedEntry, group: list[PlannedEntry]) -> str | None:
    """The record that no process will look ``m`` up again, or None (then it is kept)."""
    use = m.use
    if use is None or use.looked_up_by_hook or use.read_since_written is True:
        return None
    same = "same program as " + ", ".join(o.key for o in group if o is not m)
    if use.pointer_key is not None:
        return f"{same}; {use.pointer_key}"
    written = m.cache_id.mtime_ns
    later = [o for o in group if o is not m and o.cache_id.mtime_ns > written]
    if use.read_since_written is False and later:
        after = min(later, key=lambda o: o.cache_id.mtime_ns)
        gap = format_age((after.cache_id.mtime_ns - written) / 1e9)
        return (
            f"{same}; {use.evidence}, while a later run wrote {after.key} {gap} after it "
            "instead of reading it"
        )
    stable = [o for o in group if o.use is not None and o.use.looked_up_by_hook]
    if stable and m.manifest is None:
        return (
            f"{same}; no manifest: a plain run's key, beside the stable key {stable[0].key} "
            f"that hooked runs look up ({use.evidence})"
        )
    return None


def rule_max_size(ctx: PruneContext, state: PlanState) -> None:
    """``--max-size``, as JAX's ``_evict_if_needed``: pop the smallest (atime, key) of the
    entries no other rule marked until the total fits."""
    budget = ctx.options.max_size or 0
    remaining = sorted(
        (e for e in state.entries.values() if not e.rules), key=lambda e: (e.last_used_ns, e.key)
    )
    total = sum(e.item.size for e in remaining)
    for e in remaining:
        if total <= budget:
            break
        e.rules.append(
            (
                Rule.MAX_SIZE,
                f"least recently used while the cache is over {budget} bytes ({total} bytes)",
            )
        )
        total -= e.item.size


# --- the one ordered list -----------------------------------------------------------------------

# The order is the plan's: first the scope (--module narrows the entries every later rule sees;
# the entries are decoded only then, and only for the rules that read the decode). Then the entry
# rules mark entries: an entry's first mark is the rule that "took" it, and --max-size comes last
# because it evicts only among the entries no other rule took. Then the marked entries become
# removals, and only then the files beside them: -atime files whose entry is gone, --orphans,
# --repair (which leaves the removed entries alone), XLA's sub-caches, the files never removed;
# last, the stats folder's bound.
RULES: tuple[PruneRule, ...] = (
    PruneRule("module", lambda o: o.module is not None, rule_module),
    PruneRule("decode", lambda o: any(r.decodes and r.selected(o) for r in RULES), decode),
    PruneRule("corrupt", lambda o: o.corrupt, rule_corrupt, decodes=True),
    PruneRule("relocated", lambda o: o.relocated, rule_relocated, decodes=True),
    PruneRule("stale-jax", lambda o: o.stale_jax, rule_stale_jax, decodes=True),
    PruneRule("older-than", lambda o: o.older_than_s is not None, rule_older_than),
    PruneRule("duplicates", lambda o: o.duplicates, rule_duplicates, decodes=True),
    PruneRule("max-size", lambda o: o.max_size is not None, rule_max_size),
    PruneRule("remove-marked", _always, remove_marked),
    PruneRule("orphan-atimes", _always, beside.orphan_atimes),
    PruneRule("orphans", lambda o: o.orphans, beside.rule_orphans),
    PruneRule("repair", lambda o: o.repair, beside.rule_repair),
    PruneRule("xla-subcaches", lambda o: o.xla_subcaches, beside.rule_xla_subcaches),
    PruneRule("xla-subcaches-note", lambda o: not o.xla_subcaches, beside.note_xla_subcaches),
    PruneRule("foreign", _always, beside.report_foreign),
    PruneRule("stats-bound", _always, beside.rule_stats_bound),
)
