"""``prune``'s rules, one function each, over a shared :class:`PruneContext`.

:func:`cachedoctor.core.prune.planner.plan_prune` runs them in order: collect the entries, decode
them when a rule needs scan's findings, mark entries (each rule appends its rule and reason to
``PlannedEntry.rules``), then plan the other files. Rules only read the cache; they add actions,
skips and notes to the context.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import stat
from typing import TYPE_CHECKING

from cachedoctor import layout
from cachedoctor.cache import listdir
from cachedoctor.cache.listdir import FileKind
from cachedoctor.core.findings import FindingKind, Severity
from cachedoctor.core.prune.actions import (
    WRITE_BITS,
    Action,
    Dir,
    Op,
    Rule,
    Skip,
)
from cachedoctor.core.scan.build import tree_size
from cachedoctor.core.scan.report import (
    ScanReport,
    real_problems,
)
from cachedoctor.core.scan.rules.keys import unstable_groups
from cachedoctor.errors import count
from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX
from cachedoctor.storage import fsops
from cachedoctor.storage.fsops import FileId
from cachedoctor.units import format_age, format_bytes
from cachedoctor.xla import subcaches

if TYPE_CHECKING:
    pass
from cachedoctor.core.prune.context import (
    ORPHAN_ATIME_GRACE_S,
    PlannedEntry,
    PruneContext,
    expected_format,
    last_use,
)
from cachedoctor.layout import STATS_DIRNAME


def rule_corrupt(ctx: PruneContext, entries: dict[str, PlannedEntry], report: ScanReport) -> None:
    """``--corrupt``: exactly scan's ``corrupt`` errors (the decoder's evidence); a truncation
    under a minute old and unreadable files are skipped, as scan says."""
    for f in report.findings:
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


def rule_relocated(ctx: PruneContext, entries: dict[str, PlannedEntry], report: ScanReport) -> None:
    """``--relocated``: exactly scan's ``relocated`` finding (compile options naming a cache path
    other than the one JAX builds from the directory as spelled here, in an option JAX hashes,
    with no stable-key manifest)."""
    from cachedoctor.storage.urls import jax_spelling

    spelled = jax_spelling(ctx.as_given)
    found = [f for f in report.findings if f.kind is FindingKind.RELOCATED]
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


def rule_stale_jax(ctx: PruneContext, entries: dict[str, PlannedEntry]) -> None:
    """``--stale-jax``: the jaxlib a manifest records, else the entry's payload layout, against
    the installed jaxlib."""
    installed = ctx.jax.jaxlib_version
    if installed is None:
        ctx.notes.append("--stale-jax: jaxlib is not installed here, so nothing is stale")
        return
    want = expected_format(installed)
    for e in entries.values():
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
        "entry's layout (pjrt_ifrt header since jaxlib 0.9.1); entries of another jaxlib with "
        "the same layout are not detected without a manifest"
    )


def rule_older_than(
    ctx: PruneContext, entries: dict[str, PlannedEntry], older_than_s: float
) -> None:
    """``--older-than``: the last use a record shows (JAX's ``-atime``, or a read's access
    time), else the file time."""
    limit_ns = (ctx.now - older_than_s) * 1e9
    for e in entries.values():
        last, source = last_use(e)
        if last < limit_ns:
            age = ctx.now - last / 1e9
            e.rules.append((Rule.OLDER_THAN, f"last used {format_age(age)} ago ({source})"))


def rule_duplicates(ctx: PruneContext, entries: dict[str, PlannedEntry]) -> None:
    """``--duplicates``: in scan's unstable-key groups (the stored HLO shows a per-run key
    input), remove only the entries that records show no process will look up again; an entry
    with a record of use, or a stable-key manifest, is always kept (``core/usage/lookups``)."""
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


def rule_max_size(entries: dict[str, PlannedEntry], budget: int) -> None:
    """JAX's ``_evict_if_needed``: pop the smallest (atime, key) until the total fits."""
    remaining = sorted(
        (e for e in entries.values() if not e.rules), key=lambda e: (e.last_used_ns, e.key)
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


# --- the files beside the entries ---------------------------------------------------------------


def orphan_atimes(ctx: PruneContext) -> None:
    """``-atime`` files whose entry is gone: JAX ignores them, every run removes them.

    They are what an interrupted removal leaves (the ``-cache`` file goes first), so the
    next run finishes the job whatever its selectors; ``--module`` still limits it.
    """
    entry_keys = {i.key for i in ctx.listing.entries}
    for item in ctx.listing.of_kind(FileKind.ATIME):
        if item.key in entry_keys:
            continue
        parsed = listdir.parse_key(item.key or "")
        module = parsed[1] if parsed else None
        if ctx.options.module is not None and not fnmatch.fnmatchcase(
            module or "", ctx.options.module
        ):
            continue
        st = ctx.cd.regular(item.name)
        if st is None:
            continue
        if ctx.age_s(st.st_mtime_ns) < ORPHAN_ATIME_GRACE_S:
            ctx.skipped.append(
                Skip(item.name, "-atime without entry, but under a minute old", Rule.ORPHANS)
            )
            continue
        ctx.remove_file(item.name, st, Rule.ORPHANS, "-atime file without its entry")


def rule_orphans(ctx: PruneContext) -> None:
    """``--orphans``: stale temporary files, manifests and module text without their entry, and
    interrupted manifest writes, each older than ``--stale-after`` (a write may be in progress)."""
    entry_keys = {i.key for i in ctx.listing.entries}
    stale_temps(ctx, Rule.ORPHANS)
    folder_name = MANIFEST_DIRNAME
    folder = ctx.cd.subdir(folder_name)
    if folder is None:
        return
    with folder:
        for m in ctx.manifests:
            if m.key in entry_keys or m.is_symlink:
                continue
            st = folder.regular(m.file)
            if st is None:
                continue
            age = ctx.age_s(st.st_mtime_ns)
            if age < ctx.options.stale_after_s:
                ctx.skipped.append(
                    Skip(
                        f"{folder_name}/{m.file}",
                        f"manifest without entry, only "
                        f"{format_age(age)} old (the hook writes it before JAX compiles)",
                        Rule.ORPHANS,
                    )
                )
                continue
            ctx.remove_file(m.file, st, Rule.ORPHANS, "manifest without its entry", folder_name)
            ir = folder.regular(m.key + MANIFEST_IR_SUFFIX)
            if ir is not None:
                ctx.remove_file(
                    m.key + MANIFEST_IR_SUFFIX,
                    ir,
                    Rule.ORPHANS,
                    "module text of a manifest without entry",
                    folder_name,
                )
        manifest_keys = {m.key for m in ctx.manifests}
        for item in ctx.manifest_others:
            st = folder.regular(item.name)
            if st is None:
                continue
            stale = ctx.age_s(st.st_mtime_ns) >= ctx.options.stale_after_s
            if item.name.startswith(".") and item.name.endswith(".tmp") and stale:
                ctx.remove_file(
                    item.name, st, Rule.ORPHANS, "interrupted manifest write", folder_name
                )
            elif (
                item.name.endswith(MANIFEST_IR_SUFFIX)
                and stale
                and (
                    item.name[: -len(MANIFEST_IR_SUFFIX)] not in manifest_keys
                    and item.name[: -len(MANIFEST_IR_SUFFIX)] not in entry_keys
                )
            ):
                ctx.remove_file(
                    item.name,
                    st,
                    Rule.ORPHANS,
                    "module text without manifest or entry",
                    folder_name,
                )


def stale_temps(ctx: PruneContext, rule: Rule) -> None:
    """JAX's and cachedoctor's temporary files older than ``--stale-after``."""
    for item in ctx.listing.items:
        own = item.kind is FileKind.CACHEDOCTOR and fsops.is_own_temp(item.name)
        if item.kind is not FileKind.TEMP and not own:
            continue
        st = ctx.cd.regular(item.name)
        if st is None:
            continue
        age = ctx.age_s(st.st_mtime_ns)
        limit = ctx.options.stale_after_s
        if age < limit:
            ctx.skipped.append(
                Skip(
                    item.name,
                    f"temporary file only {format_age(age)} old (a write may be in progress)",
                    rule,
                )
            )
            continue
        who = "cachedoctor" if own else "JAX"
        ctx.remove_file(item.name, st, rule, f"{who} temporary file, {format_age(age)} old")


def rule_repair(ctx: PruneContext, entries: dict[str, PlannedEntry], removed: set[str]) -> None:
    """``--repair``: missing ``-atime`` files while eviction is in use (recreated from the
    mtime), group/other write bits on files the user owns, stale temporary files."""
    if not ctx.eviction_in_use:
        ctx.notes.append(
            "--repair: LRU eviction is not in use (no entry has an -atime file, no .lockfile), "
            "so missing -atime files are not recreated"
        )
    me = os.getuid()
    for e in entries.values():
        if e.key in removed:
            continue
        if ctx.eviction_in_use and e.atime_item is None:
            ctx.actions.append(
                Action(
                    op=Op.RECREATE_ATIME,
                    name=e.key,
                    rules=(Rule.REPAIR,),
                    reason="missing while eviction is on (jax-ml/jax#39880); "
                    "from the entry's mtime",
                    module=e.module,
                    last_used_ns=e.item.mtime_ns,
                    files=(e.cache_id,),
                )
            )
        for item, fid in ((e.item, e.cache_id), (e.atime_item, e.atime_id)):
            if item is None or fid is None or not item.mode & WRITE_BITS:
                continue
            if item.uid != me:
                ctx.skipped.append(
                    Skip(
                        item.name,
                        f"writable by group/others but owned by uid {item.uid}",
                        Rule.REPAIR,
                    )
                )
                continue
            ctx.actions.append(
                Action(
                    op=Op.FIX_MODE,
                    name=item.name,
                    rules=(Rule.REPAIR,),
                    reason=f"{stat.filemode(item.mode)}: writable by group/others",
                    module=e.module,
                    files=(fid,),
                )
            )
    if not ctx.options.orphans:
        stale_temps(ctx, Rule.REPAIR)
    if ctx.eviction_in_use:
        blockers = [
            i.name
            for i in ctx.listing.items
            if i.name.endswith(layout.CACHE_SUFFIX)
            and (i.is_symlink or i.kind is not FileKind.ENTRY)
            and ctx.cd.lstat(i.name[: -len(layout.CACHE_SUFFIX)] + layout.ATIME_SUFFIX) is None
        ]
        if blockers:
            ctx.notes.append(
                "--repair: JAX's eviction (jax <= 0.10) fails on names that match "
                f"'*-cache' without an -atime file: {', '.join(blockers)}; cachedoctor never "
                "removes links or files it does not recognise, so move them out yourself"
            )


def rule_xla_subcaches(ctx: PruneContext) -> None:
    """``--xla-subcaches``: XLA's autotune and kernel sub-caches, by their names; without the
    flag, a note of their size."""
    subs = [
        i
        for i in ctx.listing.items
        if i.kind in (FileKind.AUTOTUNE_SUBCACHE, FileKind.KERNEL_SUBCACHE)
    ]
    if not subs:
        return
    if not ctx.options.xla_subcaches:
        total = sum(
            tree_size(ctx.listing.path(i))
            if i.is_dir and not ctx.listing.remote
            else i.size  # a bucket's listing gives a prefix's total
            for i in subs
        )
        ctx.notes.append(
            f"XLA sub-caches ({', '.join(i.name for i in subs)}, {format_bytes(total)}) are not "
            "touched without --xla-subcaches"
        )
        return
    for item in subs:
        if item.is_symlink:
            ctx.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
        elif item.kind is FileKind.KERNEL_SUBCACHE and not item.is_dir:
            st = ctx.cd.regular(item.name)
            if st is not None:
                ctx.remove_file(item.name, st, Rule.XLA_SUBCACHES, "XLA kernel cache file")
        elif item.kind is FileKind.AUTOTUNE_SUBCACHE and item.is_dir:
            _autotune_dir(ctx, item.name)
        else:
            ctx.skipped.append(Skip(item.name, "unexpected sub-cache layout; not touched"))


def _autotune_dir(ctx: PruneContext, name: str) -> None:
    """Autotune results by XLA's file name pattern, and interrupted autotune writes."""
    folder = ctx.cd.subdir(name)
    if folder is None:
        return
    with folder:
        for child in folder.listdir():
            st = folder.lstat(child)
            if st is None:
                continue
            rel = f"{name}/{child}"
            if stat.S_ISLNK(st.st_mode):
                ctx.skipped.append(Skip(rel, "symbolic link: never followed or removed"))
            elif stat.S_ISREG(st.st_mode) and subcaches.is_autotune_file_name(child):
                ctx.remove_file(child, st, Rule.XLA_SUBCACHES, "per-fusion autotune result", name)
            elif child == "tmp" and stat.S_ISDIR(st.st_mode):
                tmp = folder.subdir("tmp")
                if tmp is None:
                    continue
                with tmp:
                    for t in tmp.listdir():
                        tst = tmp.regular(t)
                        if (
                            tst is not None
                            and subcaches.is_autotune_tmp_name(t)
                            and (ctx.age_s(tst.st_mtime_ns) >= ctx.options.stale_after_s)
                        ):
                            ctx.remove_file(
                                t,
                                tst,
                                Rule.XLA_SUBCACHES,
                                "interrupted autotune write",
                                f"{rel}",
                            )
            else:
                ctx.skipped.append(Skip(rel, "not recognised: never removed"))


def report_foreign(ctx: PruneContext) -> None:
    """Links and unrecognised files: reported as skipped, never removed."""
    for item in ctx.listing.items:
        if item.kind is FileKind.ENTRY:
            continue  # entry links are reported in _entries
        if item.is_symlink:
            ctx.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
        elif item.kind is FileKind.UNKNOWN:
            what = "folder" if item.is_dir else "file"
            ctx.skipped.append(Skip(item.name, f"{what} not recognised: never removed"))
    for m in ctx.manifests:
        if m.is_symlink:
            ctx.skipped.append(
                Skip(f"{MANIFEST_DIRNAME}/{m.file}", "symbolic link: never followed")
            )
    for item in ctx.manifest_others:
        if item.is_symlink:
            ctx.skipped.append(
                Skip(f"{MANIFEST_DIRNAME}/{item.name}", "symbolic link: never followed")
            )


MAX_FOLDER_BYTES = 32 << 20  # prune keeps cachedoctor-stats/ under this (oldest files go first)


def plan_folder_bound(
    cd: Dir, max_bytes: int = MAX_FOLDER_BYTES
) -> tuple[list[Action], str | None]:
    """``prune``'s rule for ``cachedoctor-stats/``: the oldest records and archives go until
    the folder fits in ``max_bytes``. Returns the actions and a note counting the folder."""
    folder = cd.subdir(STATS_DIRNAME)
    if folder is None:
        return [], None
    with folder:
        files = []
        for name in folder.listdir():
            st = folder.regular(name)
            if st is not None:
                files.append((st.st_mtime_ns, name, st))
    total = sum(st.st_size for _, _, st in files)
    actions = []
    over = total - max_bytes
    for _, name, st in sorted(files, key=lambda f: (f[0], f[1])):
        if over <= 0:
            break
        over -= st.st_size
        actions.append(
            Action(
                op=Op.REMOVE_FILE,
                name=f"{STATS_DIRNAME}/{name}",
                rules=(Rule.STATS_BOUND,),
                reason=(
                    f"oldest stats file while {STATS_DIRNAME}/ is over {format_bytes(max_bytes)}"
                ),
                bytes=st.st_size,
                files=(FileId.of(name, st),),
                folder=STATS_DIRNAME,
            )
        )
    note = (
        f"{STATS_DIRNAME}/: {count(len(files), 'file')}, {format_bytes(total)} (kept under "
        f"{format_bytes(max_bytes)}; "
        "`cachedoctor stats --zero` archives the records)"
    )
    return actions, note
