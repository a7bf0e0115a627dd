"""``prune``'s rules: one interface, :class:`PruneRule`, and one ordered list, :data:`RULES`.

:func:`cachedoctor.core.prune.planner.plan_prune` collects the entries and runs every selected
rule of ``RULES`` in order over one :class:`PruneContext` and one :class:`PlanState`: narrow the
entries to ``--module``, decode them when a rule needs scan's findings, mark entries (each rule
appends its rule and reason to ``PlannedEntry.rules``), plan the marked entries' removal, then
the files beside the entries (``beside.py``) and the stats folder's bound. Rules only read the
cache; they add actions, skips and notes to the context.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from dataclasses import dataclass

from cachedoctor.core.findings import FindingKind, Severity
from cachedoctor.core.prune import beside, context, spelling
from cachedoctor.core.prune.actions import Selector, Skip
from cachedoctor.core.prune.context import (
    PlannedEntry,
    PlanState,
    PruneContext,
    expected_format,
    last_use,
    latest_use,
)
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.scan.report import ScanReport, real_problems
from cachedoctor.core.scan.rules.keys import unstable_groups
from cachedoctor.units import format_age
from cachedoctor.xla.optionschema import undefined_debug_fields


@dataclass(frozen=True)
class PruneRule:
    """One step of a plan: ``apply`` runs when ``selected`` says the options ask for it."""

    name: str  # the selector's spelling (a ``Selector`` value), else what the step does
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
    """``--module``: with any other selector, limits it to the modules matching the glob (a
    narrowing never widens: with ``--repair``, ``--orphans`` or ``--xla-subcaches`` it removes
    no entry); alone, selects those modules' entries."""
    pattern = ctx.options.module or ""
    entries = state.entries
    state.entries = {
        k: e for k, e in entries.items() if fnmatch.fnmatchcase(e.module or "", pattern)
    }
    o = ctx.options
    if not (o.entry_rules or o.orphans or o.repair or o.xla_subcaches):  # alone: it selects
        for e in state.entries.values():
            e.rules.append((Selector.MODULE, f"module matches {pattern}"))
    matched = sorted({e.module or "(unnamed)" for e in state.entries.values()})
    more = len(matched) - 10
    shown = ", ".join(matched[:10]) + (f" and {more} more" if more > 0 else "")
    ctx.notes.append(
        f"--module {pattern} matches {len(matched)} module{'' if len(matched) == 1 else 's'}"
        + (f": {shown}" if matched else "")
    )


def decode(ctx: PruneContext, state: PlanState) -> None:
    state.report = context.decode_for_rules(ctx, state.entries)


def remove_marked(ctx: PruneContext, state: PlanState) -> None:
    """A marked entry is removed whole (``context.remove_entry``): the entries the other rules
    took by name, then ``--max-size``'s in the order it evicts them (least recently used
    first), so the plan's rows, and ``--apply``, go in that order."""
    marked = [e for e in state.entries.values() if e.rules]
    state.removed = {e.key for e in marked}
    evicted = {key for unit in state.evicted for key in unit}
    taken = sorted((e for e in marked if e.key not in evicted), key=lambda e: e.key)
    ctx.actions += context.remove_entries(taken)
    for unit in state.evicted:
        ctx.actions += context.remove_entries([state.entries[key] for key in unit])


# --- the rules that mark entries ----------------------------------------------------------------


def rule_corrupt(ctx: PruneContext, state: PlanState) -> None:
    """``--corrupt``: exactly scan's ``corrupt`` errors (the decoder's evidence, or a stats
    record of JAX's own load failing on the very file); a truncation under a minute old and
    unreadable files are skipped, as scan says."""
    entries = state.entries
    for f in _decoded(state).findings:
        if f.kind is FindingKind.UNREADABLE:  # scan says the same: never removed
            ctx.skipped.extend(
                Skip(k, f.message.partition(": ")[2], Selector.CORRUPT)
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
                        Selector.CORRUPT,
                    )
                )
                continue
            info = entries[key].info
            problems = real_problems(info) if info is not None else []
            # the reader's evidence, or JAX's own failed load of this very file (a stats record)
            why = f"{problems[0].kind}: {problems[0].message}" if problems else f.evidence
            entries[key].rules.append((Selector.CORRUPT, why))


def rule_relocated(ctx: PruneContext, state: PlanState) -> None:
    """``--relocated``: scan's ``relocated`` finding (compile options naming a cache path other
    than the one JAX builds from the directory as the jobs spell it, in an option JAX hashes,
    with no stable-key manifest), less the entries a run may still hit (``spelling``)."""
    from cachedoctor.storage.urls import jax_spelling

    entries = state.entries
    jobs = ctx.options.jobs_cache_dir
    spelled = jax_spelling(jobs) if jobs else ctx.where.jax_spelling
    found = [f for f in _decoded(state).findings if f.kind is FindingKind.RELOCATED]
    if found and jobs is None:
        ctx.notes.append(
            f"--relocated is judged for the cache dir spelled {spelled}, as given: JAX hashes the "
            "spelling, not the directory, so if your runs spell it otherwise, plan with "
            "--jobs-cache-dir set to theirs"
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
                local = "" if ctx.cd.is_remote else ctx.cd.path
                keep = spelling.keep_reason(where_dir, local, jobs is not None, e.use)
                if keep is not None:
                    ctx.skipped.append(Skip(key, keep, Selector.RELOCATED))
                    continue
                e.rules.append(
                    (
                        Selector.RELOCATED,
                        f"written for a cache spelled {where_dir}; JAX hashes the spelling, "
                        f"so it misses with the cache dir spelled {spelled}",
                    )
                )


def rule_stale_jax(ctx: PruneContext, state: PlanState) -> None:
    """``--stale-jax``: the jaxlib a manifest records, else the entry's payload layout, against
    the installed jaxlib. An entry of another jaxlib that a record shows in use since the
    installed jaxlib first wrote to the cache is another version's live entry (a CI matrix, a
    team's shared cache): kept, unless ``--stale-jax-in-use``."""
    installed = ctx.jax.jaxlib_version
    if installed is None:
        ctx.notes.append("--stale-jax: jaxlib is not installed here, so nothing is stale")
        return
    want = expected_format(installed)
    candidates: list[tuple[PlannedEntry, str]] = []
    ours: list[int] = []  # when the installed jaxlib's entries were written
    for e in state.entries.values():
        other = _other_jaxlib(e, installed, want)
        if other is not None:
            candidates.append((e, other))
        elif _of_jaxlib(e, installed, want):
            ours.append(e.cache_id.mtime_ns)
    first = min(ours, default=None)
    for e, why in candidates:
        used, when = _used_since(ctx, e, first, installed)
        if not used:
            e.rules.append((Selector.STALE_JAX, f"{why}; {when}"))
        elif ctx.options.stale_jax_in_use:
            e.rules.append((Selector.STALE_JAX, f"{why}; {when} (removed: --stale-jax-in-use)"))
        else:
            ctx.skipped.append(
                Skip(e.key, f"{why}, but {when}; --stale-jax-in-use removes it", Selector.STALE_JAX)
            )
    ctx.notes.append(
        "--stale-jax decides from manifests (their jaxlib version) when present, else from the "
        "entry's compile options (DebugOptions fields the installed jaxlib does not define: "
        "another jaxlib's defaults), else its layout (pjrt_ifrt header since jaxlib 0.9.1). An "
        "entry of another jaxlib whose latest possible use is after the installed one first "
        "wrote here is kept: another JAX version shares the cache"
    )


def _other_jaxlib(e: PlannedEntry, installed: str, want: str | None) -> str | None:
    """Why ``e`` was written by another jaxlib than ``installed``, or None."""
    if e.manifest is not None and e.manifest.jaxlib:
        if e.manifest.jaxlib != installed:
            return f"manifest: written by jaxlib {e.manifest.jaxlib}, installed is {installed}"
        return None
    info = e.info
    if info is None or any(p.kind != "unsupported" for p in info.problems):
        return None
    other = undefined_debug_fields(info.debug_fields)
    if other and other[0]:
        return (
            f"compile options: DebugOptions fields {min(other[0])} and {len(other[0]) - 1} "
            f"more that jaxlib {installed} does not define"
        )
    era = info.payload_format
    if want is not None and era is not None and era != want:
        return f"format {info.format_label}: jaxlib {installed} writes {want} entries"
    return None


def _of_jaxlib(e: PlannedEntry, installed: str, want: str | None) -> bool:
    """Whether ``e`` may be the installed jaxlib's (its manifest says so, or its layout is the
    one it writes): the earliest such write is when that jaxlib may have started here."""
    if e.manifest is not None and e.manifest.jaxlib:
        return e.manifest.jaxlib == installed
    if e.info is None or want is None or e.info.payload_format != want:
        return False
    other = undefined_debug_fields(e.info.debug_fields)
    return not (other and other[0])


def _used_since(
    ctx: PruneContext, e: PlannedEntry, first: int | None, installed: str
) -> tuple[bool, str]:
    """Whether ``e`` may have been used since the installed jaxlib first wrote to the cache
    (then the version that wrote it may still run on it), and the times that decide it, in
    words: the decision is made on exactly the time it prints."""
    if first is None:
        return True, (
            f"jaxlib {installed} (installed here) wrote no entry in this cache, so cannot tell "
            "whether the version that wrote this one still runs on it"
        )
    latest, words = _version_use(ctx, e)
    if latest is None:
        return True, words
    since = f"jaxlib {installed} first wrote here {format_age(ctx.now - first / 1e9)} ago"
    if latest < first:
        return False, f"not used since {since}: {words}"
    return True, f"another JAX version may still use it: {since}, and it was {words}"


def _version_use(ctx: PruneContext, e: PlannedEntry) -> tuple[int | None, str]:
    """The latest moment ``e``'s last use can be, for ``--stale-jax``, in words.

    The bound is ``latest_use``'s, save one case: when the stats records' last hit of the key
    is as late as any read another record shows (the access time, ``-atime``), the processes
    that read it record their reads, and the records date the last use, as on a bucket; the
    relatime window (reads the kernel hides for a day after the access time) would only stand
    for a reader that records nothing. Where the access time is later than every recorded hit,
    such a reader exists, and the window stands (the entry is kept)."""
    latest, why = latest_use(e)
    if latest is None:
        return None, why
    recorded, source = last_use(e)
    if source == "stats record" and latest > recorded:
        return recorded, (
            f"last used {format_age(ctx.now - recorded / 1e9)} ago (stats record; the access "
            "time and -atime show no later read)"
        )
    return latest, _age_reason(ctx, e, latest, why)


def rule_older_than(ctx: PruneContext, state: PlanState) -> None:
    """``--older-than``: an entry goes only when the *latest* its last use can be is older than
    the limit (a relatime access time is the first read, and later reads hide for a day); an
    entry no record dates is kept and said so."""
    limit_s = ctx.options.older_than_s or 0.0
    limit_ns = (ctx.now - limit_s) * 1e9
    for e in state.entries.values():
        latest, why = latest_use(e)
        if latest is None:
            ctx.skipped.append(Skip(e.key, why, Selector.OLDER_THAN))
            continue
        if latest < limit_ns:
            e.rules.append((Selector.OLDER_THAN, _age_reason(ctx, e, latest, why)))


def _age_reason(ctx: PruneContext, e: PlannedEntry, latest: int, why: str) -> str:
    """``last used 3 days ago (…)``: the recorded use and, where it is a window, its end."""
    recorded, source = last_use(e)
    said = f"last used {format_age(ctx.now - recorded / 1e9)} ago ({source})"
    if latest > recorded:
        said += f"; at most {format_age(ctx.now - latest / 1e9)} ago: {why}"
    return said


REPLAYED = (
    "kept: JAX's key holds a custom_partitioning pointer, but its manifest records the "
    "partitioner calls, and a run with the stable hook (CACHEDOCTOR_HOOK=stable) whose calls "
    "reproduce them takes this key and hits it"
)


def rule_duplicates(ctx: PruneContext, state: PlanState) -> None:
    """``--duplicates``: in scan's unstable-key groups (the stored HLO shows a per-run key
    input), remove only the entries that records show no process will look up again; an entry
    with a record of use, or a stable-key manifest, is always kept (``core/usage/lookups``)."""
    entries = state.entries
    infos = [e.info for e in entries.values() if e.info is not None]
    for group, _evidence in unstable_groups(infos):
        members = [entries[i.key] for i in group]
        decided = 0  # removed, or kept with a reason of its own
        for m in members:
            why = _not_looked_up(m, members)
            if why is not None:
                m.rules.append((Selector.DUPLICATES, why))
                decided += 1
            elif m.use is not None and m.use.pointer_key and m.use.replayed_by_hook:
                ctx.skipped.append(Skip(m.key, REPLAYED, Selector.DUPLICATES))
                decided += 1
        if not decided:
            module = members[0].module or "(unnamed)"
            uses = "; ".join(f"{m.key[-12:]}: {m.use.evidence}" for m in members if m.use)
            ctx.skipped.append(
                Skip(
                    module,
                    f"{len(members)} entries of one program kept: cannot tell which key runs "
                    f"use ({uses}); what would tell it: the writers' records, from the "
                    "observe hook (CACHEDOCTOR_HOOK=observe: a manifest per key) or stats "
                    "records (CACHEDOCTOR_HOOK=stats: each writer's pointer flag)",
                    Selector.DUPLICATES,
                )
            )
    ctx.notes.append(
        "--duplicates removes a copy of a program whose key changes between runs only on a "
        "record of how its writer computed the key: a manifest or a stats record showing the "
        "custom_partitioning pointer in it (no later process computes that key). A copy with "
        "a record of use (-atime, access time, a hit in a stats record), a stable-key "
        "manifest, a manifest with recorded partitioner calls (the stable hook replays them), "
        "or no record of its writer (a plain run and one with JAX's pointer flag write alike) "
        "is kept"
    )


def _not_looked_up(m: PlannedEntry, group: list[PlannedEntry]) -> str | None:
    """The record that no process will look ``m`` up again, or None (then it is kept).

    Only a record of how ``m``'s own writer computed its key proves it: a manifest, or a stats
    record, showing the per-process pointer in the key. That a later run wrote another key
    instead of reading ``m`` proves nothing unless both runs computed keys the same way, and a
    plain run and one with JAX's pointer flag leave the same bytes (issue: the flag
    population's key removed before its second run)."""
    use = m.use
    if use is None or use.looked_up_by_hook or use.read_since_written is True:
        return None
    if use.replayed_by_hook:
        return None
    if use.pointer_key is not None:
        same = "same program as " + ", ".join(o.key for o in group if o is not m)
        return f"{same}; {use.pointer_key}"
    return None


def rule_max_size(ctx: PruneContext, state: PlanState) -> None:
    """``--max-size``, as JAX's ``_evict_if_needed`` but on what records can prove: pop the
    file whose last use is latest-bounded earliest (a relatime access time counts up to a day
    after it) until the total fits. A hard-linked file counts once and goes with all its
    names; one with a name outside the cache frees nothing and stays. A file no record dates
    is kept and said so."""
    budget = ctx.options.max_size or 0
    marked = {e.key for e in state.entries.values() if e.rules}
    dated: list[tuple[int, str, list[PlannedEntry], str]] = []
    undated: list[tuple[PlannedEntry, str]] = []
    total = 0
    for unit in context.file_units(list(state.entries.values())):
        left = [e for e in unit if e.key not in marked]
        if not left:
            continue
        total += left[0].item.size
        if len(unit) < unit[0].nlink:
            ctx.skipped.extend(
                Skip(
                    e.key,
                    "hard-linked from outside this cache: removing it frees nothing",
                    Selector.MAX_SIZE,
                )
                for e in left
            )
            continue
        bounds = [(latest_use(e), e) for e in left]
        unknown = [(e, why) for (latest, why), e in bounds if latest is None]
        if unknown:
            undated += unknown
            continue
        known = [(latest, why) for (latest, why), _ in bounds if latest is not None]
        latest, why = max(known)  # the file's last use: the latest of its names'
        dated.append((latest, min(x.key for x in left), left, why))
    dated.sort(key=lambda d: (d[0], d[1]))
    for latest, _key, left, why in dated:
        if total <= budget:
            break
        for e in left:
            e.rules.append(
                (
                    Selector.MAX_SIZE,
                    f"least recently used while the cache is over {budget} bytes ({total} "
                    "bytes): " + _age_reason(ctx, e, latest, why),
                )
            )
        state.evicted.append(tuple(e.key for e in left))
        total -= left[0].item.size
    if total > budget:
        ctx.skipped.extend(Skip(e.key, why, Selector.MAX_SIZE) for e, why in undated)


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
