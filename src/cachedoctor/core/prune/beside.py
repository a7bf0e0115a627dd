"""``prune``'s rules for the files beside the entries: ``-atime`` files without entry,
``--orphans``, ``--repair``, XLA's sub-caches, links and unrecognised files (reported, never
removed), and the bound of ``cachedoctor-stats/``.

They run after the entry rules (``rules.RULES`` says why) and read which entries are planned
for removal from the :class:`PlanState`.
"""

from __future__ import annotations

import fnmatch
import os
import stat

from cachedoctor import layout
from cachedoctor.cache import listdir
from cachedoctor.cache.listdir import DirItem, FileKind
from cachedoctor.core.prune.actions import WRITE_BITS, Action, Op, Selector, Skip
from cachedoctor.core.prune.context import ORPHAN_ATIME_GRACE_S, PlanState, PruneContext
from cachedoctor.core.scan.build import tree_size
from cachedoctor.errors import count
from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX, STATS_DIRNAME
from cachedoctor.storage import fsops
from cachedoctor.storage.fileid import FileId
from cachedoctor.storage.fsops import Folder
from cachedoctor.units import format_age, format_bytes
from cachedoctor.xla import subcaches


def orphan_atimes(ctx: PruneContext, state: PlanState) -> None:
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
                Skip(item.name, "-atime without entry, but under a minute old", Selector.ORPHANS)
            )
            continue
        ctx.remove_file(item.name, st, Selector.ORPHANS, "-atime file without its entry")


def rule_orphans(ctx: PruneContext, state: PlanState) -> None:
    """``--orphans``: stale temporary files, manifests and module text without their entry, and
    interrupted manifest writes, each older than ``--stale-after`` (a write may be in progress)."""
    entry_keys = {i.key for i in ctx.listing.entries}
    if _module_scope(ctx) is None:
        stale_temps(ctx, Selector.ORPHANS)
    else:
        ctx.notes.append(
            f"--orphans with --module {ctx.options.module}: temporary files and interrupted "
            "writes name no module, so they are kept"
        )
    folder_name = MANIFEST_DIRNAME
    folder = ctx.cd.subdir(folder_name)
    if folder is None:
        return
    with folder:
        for m in ctx.manifests:
            if m.key in entry_keys or m.is_symlink or not _in_module_scope(ctx, m.key):
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
                        Selector.ORPHANS,
                    )
                )
                continue
            ctx.remove_file(m.file, st, Selector.ORPHANS, "manifest without its entry", folder_name)
            ir = folder.regular(m.key + MANIFEST_IR_SUFFIX)
            if ir is not None:
                ctx.remove_file(
                    m.key + MANIFEST_IR_SUFFIX,
                    ir,
                    Selector.ORPHANS,
                    "module text of a manifest without entry",
                    folder_name,
                )
        manifest_keys = {m.key for m in ctx.manifests}
        if _module_scope(ctx) is not None:
            return  # interrupted writes and module texts without a manifest: see the note
        for item in ctx.manifest_others:
            st = folder.regular(item.name)
            if st is None:
                continue
            stale = ctx.age_s(st.st_mtime_ns) >= ctx.options.stale_after_s
            if item.name.startswith(".") and item.name.endswith(".tmp") and stale:
                ctx.remove_file(
                    item.name, st, Selector.ORPHANS, "interrupted manifest write", folder_name
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
                    Selector.ORPHANS,
                    "module text without manifest or entry",
                    folder_name,
                )


def _module_scope(ctx: PruneContext) -> str | None:
    """The ``--module`` glob that narrows every rule, or None."""
    return ctx.options.module


def _in_module_scope(ctx: PruneContext, key: str) -> bool:
    """Whether a file of ``key`` (a manifest) is one of the modules ``--module`` names."""
    pattern = _module_scope(ctx)
    return pattern is None or fnmatch.fnmatchcase(listdir.module_of(key) or "", pattern)


def stale_temps(ctx: PruneContext, rule: Selector) -> None:
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


def rule_repair(ctx: PruneContext, state: PlanState) -> None:
    """``--repair``: missing ``-atime`` files while eviction is in use (recreated from the
    mtime), group/other write bits on files the user owns, stale temporary files."""
    if not ctx.eviction_in_use:
        ctx.notes.append(
            "--repair: LRU eviction is not in use (no entry has an -atime file, no .lockfile), "
            "so missing -atime files are not recreated"
        )
    me = os.getuid()
    for e in state.entries.values():
        if e.key in state.removed:
            continue
        if ctx.eviction_in_use and e.atime_item is None:
            ctx.actions.append(
                Action(
                    op=Op.RECREATE_ATIME,
                    name=e.key,
                    rules=(Selector.REPAIR,),
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
                        Selector.REPAIR,
                    )
                )
                continue
            ctx.actions.append(
                Action(
                    op=Op.FIX_MODE,
                    name=item.name,
                    rules=(Selector.REPAIR,),
                    reason=f"{stat.filemode(item.mode)}: writable by group/others",
                    module=e.module,
                    files=(fid,),
                )
            )
    if not ctx.options.orphans and _module_scope(ctx) is None:
        stale_temps(ctx, Selector.REPAIR)
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


def _subcaches(ctx: PruneContext) -> list[DirItem]:
    return [
        i
        for i in ctx.listing.items
        if i.kind in (FileKind.AUTOTUNE_SUBCACHE, FileKind.KERNEL_SUBCACHE)
    ]


def note_xla_subcaches(ctx: PruneContext, state: PlanState) -> None:
    """Without ``--xla-subcaches``: a note of the sub-caches' size."""
    subs = _subcaches(ctx)
    if not subs:
        return
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


def rule_xla_subcaches(ctx: PruneContext, state: PlanState) -> None:
    """``--xla-subcaches``: XLA's autotune and kernel sub-caches, by their names; with
    ``--module``, none (their files are not per module: a narrowing never widens)."""
    if _module_scope(ctx) is not None:
        for item in _subcaches(ctx):
            ctx.skipped.append(
                Skip(
                    item.name,
                    f"--xla-subcaches with --module {ctx.options.module}: XLA's sub-caches "
                    "are not per module, so they are kept",
                    Selector.XLA_SUBCACHES,
                )
            )
        return
    for item in _subcaches(ctx):
        if item.is_symlink:
            ctx.skipped.append(Skip(item.name, "symbolic link: never followed or removed"))
        elif item.kind is FileKind.KERNEL_SUBCACHE and not item.is_dir:
            st = ctx.cd.regular(item.name)
            if st is not None:
                ctx.remove_file(item.name, st, Selector.XLA_SUBCACHES, "XLA kernel cache file")
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
                ctx.remove_file(
                    child, st, Selector.XLA_SUBCACHES, "per-fusion autotune result", name
                )
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
                                Selector.XLA_SUBCACHES,
                                "interrupted autotune write",
                                f"{rel}",
                            )
            else:
                ctx.skipped.append(Skip(rel, "not recognised: never removed"))


def report_foreign(ctx: PruneContext, state: PlanState) -> None:
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
    cd: Folder, max_bytes: int = MAX_FOLDER_BYTES
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
                rules=(Selector.STATS_BOUND,),
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


def rule_stats_bound(ctx: PruneContext, state: PlanState) -> None:
    """The bound of ``cachedoctor-stats/`` (:func:`plan_folder_bound`), whatever the selectors."""
    actions, note = plan_folder_bound(ctx.cd)
    ctx.actions += actions
    ctx.notes += [note] if note else []
