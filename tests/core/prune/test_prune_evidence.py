"""`prune` removes an entry only on evidence that no run uses it (issue 39, Trust III).

Each cache is written by real JAX runs in subprocesses; the oracle is JAX's own log of the runs
after ``--apply`` (``JAX_LOG_COMPILES=1``: "Persistent compilation cache hit for '...' with key
'...'"), compared with what the same runs hit before: no hit lost.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from cachedoctor.core.prune.actions import Plan, Selector
from cachedoctor.core.prune.apply import apply
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.planner import plan_prune
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.layout import MANIFEST_DIRNAME
from cachedoctor.storage import mounts
from cachedoctor.storage.location import Location
from tests.support import hookrun

pytestmark = pytest.mark.slow

HIT_RE = hookrun.HIT_KEY_RE
SIZES = ("16", "24")  # two programs of the plain kind: two entries of jit_g


def run_plain(cache: Path, size: str, mode: str = "none") -> set[str]:
    """One run of the plain program; the keys JAX says it hit."""
    return run_plain_with(cache, size, sys.executable, mode)


def run_all(cache: Path, mode: str = "none") -> set[str]:
    """One run of the plain program at every size (one process: a run per size cost a JAX
    start-up each); the keys JAX says it hit."""
    return run_plain(cache, ",".join(SIZES), mode)


def removed(plan: Plan) -> set[str]:
    return {a.name for a in plan.actions if a.rules and a.op.value == "remove-entry"}


def entry_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*-cache"))


def companions(cache: Path, key: str) -> int:
    """The bytes of what goes with an entry: its -atime file, its manifest and module text."""
    beside = [cache / f"{key}-atime", *(cache / MANIFEST_DIRNAME).glob(f"{key}.*")]
    return sum(p.stat().st_size for p in beside if p.is_file())


def needs_relatime(where: Path) -> None:
    mount = mounts.mount_of(str(where))
    if mount is None or mount.policy != "relatime":
        pytest.skip(f"needs a relatime mount (Linux's default); {where} is on {mount}")


def test_a_read_a_relatime_mount_hides_keeps_the_entry(tmp_path: Path) -> None:
    """Case 1: written, read, read again later. relatime recorded only the first read, so
    "last used" is at or after it and up to a day later: --older-than removes nothing the
    last run hit (the old rule took the first read for the last: every entry went). The issue
    saw it with 70 s and ``1m``; 8 s and ``5s`` are the same case, cheaper. (Moving the times
    back with utime would not do: it sets ctime, and relatime records the next read then.)"""
    cache = tmp_path / "cache"
    needs_relatime(tmp_path)
    assert run_all(cache) == set()  # written
    first = run_all(cache)  # read: the kernel moves the access time past the write
    assert first
    recorded = {f.name: f.stat().st_atime_ns for f in entry_files(cache)}
    time.sleep(8)
    assert run_all(cache) == first  # read again, now...
    assert {f.name: f.stat().st_atime_ns for f in entry_files(cache)} == recorded  # ...unseen

    plan = plan_prune(Location.parse(cache), PruneOptions.from_selectors(older_than="5s"))
    assert removed(plan) == set()
    apply(plan)
    assert run_all(cache) == first  # no hit lost


def written_then_read_days_ago(tmp_path: Path) -> Path:
    """A cache written 4 days ago and first read 3 days ago (the kernel's record of it)."""
    cache = tmp_path / "cache"
    needs_relatime(tmp_path)
    run_all(cache)
    run_all(cache)
    now = time.time_ns()
    for f in entry_files(cache):
        os.utime(f, ns=(now - 3 * 86400 * 10**9, now - 4 * 86400 * 10**9))
    return cache


def test_an_access_time_older_than_its_window_dates_the_last_use(tmp_path: Path) -> None:
    """The window's end bounds the last read: first read 3 days ago, so last used at most 2
    days ago; --older-than 1d takes it and says both."""
    cache = written_then_read_days_ago(tmp_path)
    plan = plan_prune(Location.parse(cache), PruneOptions.from_selectors(older_than="1d"))
    assert removed(plan) == {f.name[: -len("-cache")] for f in entry_files(cache)}
    for a in plan.actions:
        assert "last used 3 days ago (access time)" in a.reason
        assert "at most 2 days ago" in a.reason and "relatime" in a.reason
    plan = plan_prune(Location.parse(cache), PruneOptions.from_selectors(older_than="3d"))
    assert removed(plan) == set()


def test_a_read_between_plan_and_apply_cancels_an_age_removal(tmp_path: Path) -> None:
    cache = written_then_read_days_ago(tmp_path)
    plan = plan_prune(Location.parse(cache), PruneOptions.from_selectors(older_than="1d"))
    assert len(removed(plan)) == len(entry_files(cache))
    hit = run_all(cache)  # a day past the recorded read: the kernel records this one
    result = apply(plan)
    assert {o.status.value for o in result.outcomes} == {"skipped"}
    assert run_all(cache) == hit


def test_hard_linked_entries_count_once(tmp_path: Path) -> None:
    """Case 5: the stable hook adopts a plain entry by a hard link, so a warmed cache has two
    names per file. scan's "on disk" counts the file once, and --max-size 5 % above the real
    bytes removes nothing (the old rule counted both names and removed entries that freed
    nothing; the next runs missed)."""
    cache = tmp_path / "cache"
    run_all(cache)  # plain keys
    assert run_all(cache, "stable")  # the hook re-keys: a second name, and JAX hits it
    files = entry_files(cache)
    linked = [f for f in files if f.stat().st_nlink == 2]
    assert len(linked) >= 2 * len(SIZES)  # jit_g's entries at least
    real = sum(st.st_size for st in {f.stat().st_ino: f.stat() for f in files}.values())
    assert scan_directory(Location.parse(cache)).summary.bytes_on_disk == real

    plain_hits, stable_hits = run_all(cache), run_all(cache, "stable")
    budget = int(real * 1.05)
    plan = plan_prune(Location.parse(cache), PruneOptions.from_selectors(max_size=budget))
    assert removed(plan) == set()
    apply(plan)
    assert (run_all(cache), run_all(cache, "stable")) == (plain_hits, stable_hits)

    # under the real bytes, a file goes with every name it has, and its bytes count once
    plan = plan_prune(Location.parse(cache), PruneOptions.from_selectors(max_size=real - 1))
    gone = [a for a in plan.actions if Selector.MAX_SIZE in a.rules]
    inodes = {(cache / f"{a.name}-cache").stat().st_ino for a in gone}
    names = {f.name[: -len("-cache")] for f in files if f.stat().st_ino in inodes}
    assert {a.name for a in gone} == names
    assert len(gone) == 2 * len(inodes)
    for ino in inodes:  # the file's bytes once, beside each name's -atime and manifest files
        size = next(f.stat().st_size for f in files if f.stat().st_ino == ino)
        named = [a for a in gone if (cache / f"{a.name}-cache").stat().st_ino == ino]
        beside = sum(companions(cache, a.name) for a in named)
        assert sum(a.bytes for a in named) == size + beside


def test_relocated_through_another_spelling_of_this_folder_keeps_the_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 3: the jobs spell the cache absolutely; `prune r --relocated` typed from the
    parent, or through a link, judged every entry relocated for *its* spelling and removed
    what the jobs hit. Another spelling of this very folder is kept until the user says how
    the jobs spell it; a true copy elsewhere still goes."""
    cache = tmp_path / "r"
    run_all(cache)  # written for /abs/.../r (jax <= 0.10 hashes the autotune dir under it)
    copy = tmp_path / "copy"
    shutil.copytree(cache, copy)  # times kept: never read, written for /abs/.../r
    hit = run_all(cache)
    link = tmp_path / "link"
    link.symlink_to(cache)
    monkeypatch.chdir(tmp_path)
    for spelled in ("r", "r/", str(link), "link"):
        plan = plan_prune(Location.parse(spelled), PruneOptions.from_selectors(relocated=True))
        assert removed(plan) == set(), spelled
        kept = [s for s in plan.skipped if s.rule is Selector.RELOCATED]
        assert kept and all("--jobs-cache-dir" in s.reason for s in kept), spelled
    told = PruneOptions.from_selectors(relocated=True, jobs_cache_dir="r")
    plan = plan_prune(
        Location.parse("r"), told
    )  # the user's word against the record: the record wins
    assert removed(plan) == set()
    assert all("a run that spells the cache so looks it up" in s.reason for s in plan.skipped)

    apply(plan_prune(Location.parse("r"), PruneOptions.from_selectors(relocated=True)))
    assert run_all(cache) == hit  # no hit lost
    plan = plan_prune(Location.parse("copy"), PruneOptions.from_selectors(relocated=True))
    assert removed(plan) == {k.name[:-6] for k in entry_files(copy)}  # another folder, unread
    told = PruneOptions.from_selectors(relocated=True, jobs_cache_dir=str(copy))
    assert removed(plan_prune(Location.parse("copy"), told)) == {
        k.name[:-6] for k in entry_files(copy)
    }


def test_stale_jax_keeps_what_another_jax_version_sharing_the_cache_uses(
    tmp_path: Path,
) -> None:
    """Case 4: jax 0.8.3 and the installed JAX share a cache (a CI matrix). The other version's
    entries it used since the installed one first wrote here are kept (with a flag to remove
    them anyway); those it wrote before and never used since go. Oracle: its next run's hits."""
    from tests.support.caches import other_jax_python

    other = other_jax_python()
    cache = tmp_path / "shared"
    run_plain_with(cache, "16", other)  # 0.8.3 alone, before the upgrade
    old = set(hookrun.entries(cache))
    time.sleep(1.1)
    run_all(cache)  # the installed JAX starts writing here
    run_plain_with(cache, "24", other)  # 0.8.3 still runs: writes...
    later_hits = run_plain_with(cache, "24", other)  # ...and hits
    assert later_hits
    newer = set(hookrun.entries(cache)) - old
    plan = plan_prune(Location.parse(cache), PruneOptions.from_selectors(stale_jax=True))
    gone = removed(plan)
    assert gone and gone <= old - later_hits
    assert not later_hits & gone
    kept = {s.name for s in plan.skipped if s.rule is Selector.STALE_JAX}
    assert later_hits <= kept and all(k in newer | old for k in kept)
    assert all("--stale-jax-in-use" in s.reason for s in plan.skipped if s.name in kept)
    anyway = plan_prune(Location.parse(cache), PruneOptions.from_selectors(stale_jax_in_use=True))
    assert later_hits <= removed(anyway)
    apply(plan)
    assert run_plain_with(cache, "24", other) == later_hits  # no hit lost


def run_plain_with(cache: Path, size: str, python: str, mode: str = "none") -> set[str]:
    """One run of the plain program by ``python`` (another JAX's interpreter, say): the keys
    JAX's own log says it hit."""
    env = hookrun.base_env(
        cache,
        JAX_LOG_COMPILES="1",
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        CACHEDOCTOR_PLAIN_SIZE=size,
    )
    run = hookrun.run_program("plain", cache, mode=mode, env=env, python=python)
    return set(HIT_RE.findall(run.stderr + run.stdout))
