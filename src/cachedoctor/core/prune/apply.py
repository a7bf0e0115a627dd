"""Carrying out a plan (``prune --apply``, ``rekey --apply``), one unit at a time."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cachedoctor import layout
from cachedoctor.core.prune import rekey
from cachedoctor.core.prune.actions import (
    WRITE_BITS,
    Action,
    ApplyReport,
    Op,
    Outcome,
    Plan,
    Selector,
    Status,
    _folder,
    open_dir,
    remove_companions,
)
from cachedoctor.errors import CachedoctorError, os_reason, path_error
from cachedoctor.layout import LOCKFILE, MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX, MANIFEST_SUFFIX
from cachedoctor.storage import fsops, stores
from cachedoctor.storage.fsops import Folder

if TYPE_CHECKING:
    from cachedoctor.storage.location import Location

Progress = Callable[[Outcome], None]


def plan_and_apply(
    make_plan: Callable[[], Plan],
    cache_dir: Location,
    do_apply: bool,
    lock_timeout: float,
    progress: Callable[[int], Progress | None] | None = None,
) -> tuple[Plan, ApplyReport | None]:
    """Build a plan and, only when told, apply it (``prune`` and ``rekey``); an OSError on the
    way is the user's one line naming the file, else ``cache_dir``. ``progress(total)`` gives
    the callback that follows the applied actions (the CLI's, on a terminal), or None."""
    try:
        plan = make_plan()
        result = (
            apply(
                plan,
                lock_timeout=lock_timeout,
                progress=None if progress is None else progress(len(plan.actions)),
            )
            if do_apply
            else None
        )
    except OSError as exc:
        raise path_error(exc, exc.filename or cache_dir.spelling) from exc
    return plan, result


def apply(
    plan: Plan, *, lock_timeout: float = 30.0, progress: Progress | None = None
) -> ApplyReport:
    """Carry out a plan, one unit at a time under JAX's lock; re-check every file first.

    On a bucket there is no lock to serialise on, and every delete is conditional on its own
    object, so the units run concurrently on the store's bounded pool.
    """
    outcomes = []
    where = plan.cache_dir
    with stores.one_line_errors(where.spelling), open_dir(where) as cd:
        if not where.has_locks:
            return ApplyReport(plan, tuple(_apply_remote(cd, plan, progress)), False)
        locked_any = cd.lstat(LOCKFILE) is not None
        for action in plan.actions:
            try:
                with cd.lock(lock_timeout) as locked:
                    locked_any |= locked
                    outcome = _APPLY[action.op](cd, action)
                cd.fsync()
            except fsops.LockTimeout as exc:
                outcome = Outcome(action, Status.FAILED, str(exc))
            except OSError as exc:
                outcome = Outcome(action, Status.FAILED, os_reason(exc))
            outcomes.append(outcome)
            if progress is not None:
                progress(outcome)
    return ApplyReport(plan, tuple(outcomes), locked_any)


def _apply_remote(cd: Folder, plan: Plan, progress: Progress | None) -> list[Outcome]:
    import threading

    lock = threading.Lock()

    def one(action: Action) -> Outcome:
        try:
            outcome = _APPLY[action.op](cd, action)
        except OSError as exc:
            outcome = Outcome(action, Status.FAILED, os_reason(exc))
        except CachedoctorError as exc:  # throttled past the retry budget
            outcome = Outcome(action, Status.FAILED, str(exc))
        if progress is not None:
            with lock:
                progress(outcome)
        return outcome

    return list(plan.cache_dir.store().map(one, list(plan.actions)))


def _apply_remove_entry(cd: Folder, a: Action) -> Outcome:
    cache_id = a.files[0]
    for fid in a.files[1:]:  # the -atime of a use-sensitive rule: used since the plan?
        st = cd.lstat(fid.name)
        if st is not None and not fid.matches(st):
            return Outcome(a, Status.SKIPPED, "used since the plan (its -atime changed)")
    result = cd.unlink_if(cache_id)
    if result == "changed":
        return Outcome(a, Status.SKIPPED, "changed since the plan")
    if result == "not-a-file":
        return Outcome(a, Status.SKIPPED, "no longer a regular file")
    freed = cache_id.size if result == "removed" else 0
    freed += remove_companions(cd, a.name)
    if result == "missing":
        return Outcome(a, Status.SKIPPED, "already gone", freed)
    return Outcome(a, Status.DONE, "", freed)


def _orphan_key(a: Action) -> str | None:
    """The key a planned orphan (an -atime file or a manifest) belongs to."""
    name = a.files[0].name
    for suffix in (layout.ATIME_SUFFIX, MANIFEST_SUFFIX, MANIFEST_IR_SUFFIX):
        if name.endswith(suffix) and (
            a.folder == MANIFEST_DIRNAME or suffix == layout.ATIME_SUFFIX
        ):
            return name[: -len(suffix)]
    return None


def _apply_remove_file(cd: Folder, a: Action) -> Outcome:
    if a.rules[0] is Selector.ORPHANS:
        key = _orphan_key(a)
        if key is not None and cd.lstat(key + layout.CACHE_SUFFIX) is not None:
            return Outcome(a, Status.SKIPPED, "its entry exists again")
    with _folder(cd, a.folder) as folder:
        if folder is None:
            return Outcome(a, Status.SKIPPED, "already gone")
        result = folder.unlink_if(a.files[0])
    if result == "removed":
        return Outcome(a, Status.DONE, "", a.files[0].size)
    return Outcome(a, Status.SKIPPED, {"missing": "already gone"}.get(result, result))


def _apply_recreate_atime(cd: Folder, a: Action) -> Outcome:
    st = cd.regular(a.files[0].name)
    if st is None:
        return Outcome(a, Status.SKIPPED, "entry is gone")
    stamp = st.st_mtime_ns.to_bytes(8, "little")
    if not cd.write_new(a.name + layout.ATIME_SUFFIX, stamp):
        return Outcome(a, Status.SKIPPED, "an -atime file appeared meanwhile")
    return Outcome(a, Status.DONE)


def _apply_fix_mode(cd: Folder, a: Action) -> Outcome:
    result = cd.chmod_nofollow(a.files[0].name, WRITE_BITS, a.files[0])
    return Outcome(
        a, Status.DONE if result == "done" else Status.SKIPPED, "" if result == "done" else result
    )


def _apply_rekey(cd: Folder, a: Action) -> Outcome:
    if cd.is_remote:
        return Outcome(a, Status.FAILED, "rekey works on local cache directories only")

    return rekey.apply_action(cd, a)


_APPLY: dict[Op, Callable[[Folder, Action], Outcome]] = {
    Op.REMOVE_ENTRY: _apply_remove_entry,
    Op.REMOVE_FILE: _apply_remove_file,
    Op.RECREATE_ATIME: _apply_recreate_atime,
    Op.FIX_MODE: _apply_fix_mode,
    Op.MOVE_ENTRY: _apply_rekey,
    Op.DROP_DUPLICATE: _apply_rekey,
}
