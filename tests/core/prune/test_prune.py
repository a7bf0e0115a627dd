"""`prune` on real caches: every selector, dry run, --apply, --repair, links, foreign files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cachedoctor import layout
from cachedoctor.cache import listdir
from cachedoctor.cli import cli
from cachedoctor.core.check.runner import run_program
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.prune.actions import Op, Plan, Selector, Status
from cachedoctor.core.prune.apply import apply
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.planner import plan_prune
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.layout import MANIFEST_DIRNAME
from cachedoctor.storage import fsops
from cachedoctor.storage.location import Location
from cachedoctor.units import parse_duration, parse_size
from tests.support.caches import (
    EVICT,
    assert_usable,
    entry_keys,
    make_cache,
    other_jax_python,
    raw_payload_layout,
    snapshot,
    write_manifest,
)
from tests.support.sessioncache import SharedBuilds

HOUR_NS = 3600 * 10**9


def set_atime(root: Path, key: str, ns: int) -> None:
    """Write JAX's -atime format (8 bytes, little-endian ns) the way JAX's get() does."""
    (root / f"{key}-atime").write_bytes(ns.to_bytes(8, "little"))


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


def prune(root: Path, **options: object) -> tuple:  # type: ignore[type-arg]
    plan = plan_prune(Location.parse(root), PruneOptions(**options))  # type: ignore[arg-type]
    return plan, apply(plan)


def rules_by_name(plan: Plan) -> dict[str, tuple[Selector, ...]]:
    return {a.name: a.rules for a in plan.actions}


@pytest.fixture(scope="session")
def mixed_cache(shared_builds: SharedBuilds, seed_cache: Path) -> Path:
    """seed_cache plus entries written by jax 0.8.3 (no pjrt_ifrt header; otherjax.py)."""
    python = other_jax_python()

    def make(root: Path) -> None:
        shutil.copytree(seed_cache, root / "cache", symlinks=True)
        make_cache(root / "cache", [("plain", {"CACHEDOCTOR_PLAIN_SIZE": "40"})], python=python)

    root, _ = shared_builds("prune-mixed", make, str(seed_cache), python)
    return root / "cache"


def test_sizes_and_durations_parse_like_users_write_them() -> None:
    assert parse_size("50GB") == 50 * 10**9
    assert parse_size("800MiB") == 800 * 2**20
    assert parse_size("1024") == 1024
    assert parse_duration("30d") == 30 * 86400
    assert parse_duration("90min") == 5400
    with pytest.raises(ValueError):
        parse_size("lots")
    with pytest.raises(ValueError, match="minutes or months"):
        parse_duration("90m")


@pytest.mark.slow
def test_dry_run_changes_no_byte(copy_of: Callable[[Path], Path], seed_cache: Path) -> None:
    root = copy_of(seed_cache)
    keys = sorted(entry_keys(root))
    set_atime(root, keys[0], 1)
    write_manifest(root, keys[1], jaxlib="0.4.1")
    write_manifest(root, "jit_gone-" + "ab" * 32)
    (root / "_temp_x").write_bytes(b"partial")
    age(root / "_temp_x", 3 * 86400)
    (root / "notes.txt").write_text("mine")
    os.chmod(root / f"{keys[2]}-cache", 0o666)
    before = snapshot(root)
    result = CliRunner().invoke(
        cli,
        [
            "prune",
            str(root),
            "--older-than",
            "1s",
            "--max-size",
            "1",
            "--duplicates",
            "--corrupt",
            "--orphans",
            "--relocated",
            "--stale-jax",
            "--xla-subcaches",
            "--repair",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "dry run: would remove" in result.output
    assert snapshot(root) == before


@pytest.mark.slow
def test_older_than_uses_atime_then_file_time(
    copy_of: Callable[[Path], Path], evict_cache: Path
) -> None:
    root = copy_of(evict_cache)
    keys = sorted(entry_keys(root))
    now_ns = time.time_ns()
    for k in keys:
        set_atime(root, k, now_ns)
    age(root / f"{keys[0]}-cache", 3 * 86400)  # written three days ago...
    set_atime(root, keys[0], now_ns - 48 * HOUR_NS)  # ...used two days ago per JAX's -atime
    os.unlink(root / f"{keys[1]}-atime")  # no -atime: the file time decides
    age(root / f"{keys[1]}-cache", 3 * 86400)
    plan = plan_prune(Location.parse(root), PruneOptions(older_than_s=parse_duration("1d")))
    assert {a.name for a in plan.actions} == {keys[0], keys[1]}
    reasons = {a.name: a.reason for a in plan.actions}
    assert "(-atime)" in reasons[keys[0]] and "(its write: not read since)" in reasons[keys[1]]
    result = apply(plan)
    assert result.count(Status.DONE) == 2
    assert entry_keys(root) == set(keys[2:])
    assert not (root / f"{keys[0]}-atime").exists()
    assert_usable(root)
    assert plan_prune(Location.parse(root), PruneOptions(older_than_s=86400)).actions == ()


@pytest.mark.slow
def test_max_size_evicts_what_jax_would(
    copy_of: Callable[[Path], Path], evict_cache: Path, tmp_path: Path
) -> None:
    """The same files go as with JAX's own LRUCache._evict_if_needed at the same budget."""
    from jax._src.lru_cache import LRUCache

    ours = copy_of(evict_cache)
    theirs = tmp_path / "jax-evicts"
    shutil.copytree(ours, theirs, symlinks=True)
    keys = sorted(entry_keys(ours))
    assert len(keys) >= 4
    for i, k in enumerate(reversed(keys)):  # a use order that is not the name order
        for root in (ours, theirs):
            os.utime(root / f"{k}-cache", (1_600_000_000, 1_600_000_000))  # written before
            set_atime(root, k, 1_700_000_000 * 10**9 + i * 10**9)
    total = sum((ours / f"{k}-cache").stat().st_size for k in keys)
    budget = total // 2
    LRUCache(str(theirs), max_size=budget)._evict_if_needed()
    plan, result = prune(ours, max_size=budget)
    assert all(a.rules == (Selector.MAX_SIZE,) for a in plan.actions)
    assert result.count(Status.DONE) == len(plan.actions) > 0
    assert entry_keys(ours) == entry_keys(theirs)
    assert sum(p.stat().st_size for p in ours.glob("*-cache")) <= budget
    assert prune(ours, max_size=budget)[0].actions == ()


@pytest.mark.slow
def test_duplicates_without_a_record_of_the_writers_keep_the_group(
    copy_of: Callable[[Path], Path], seed_cache: Path
) -> None:
    """Three plain runs of the seed, unrecorded: a plain run and one with JAX's pointer flag
    write alike, so nothing tells that no run computes these keys again (issue 39): kept,
    saying what would tell (tests/core/prune/test_duplicates_usage.py has the recorded cases)."""
    root = copy_of(seed_cache)
    jit_f = sorted(k for k in entry_keys(root) if k.startswith("jit_f-"))
    assert len(jit_f) == 3
    for i, k in enumerate(jit_f):  # the middle one was used last
        age(root / f"{k}-cache", 1000 if i != 1 else 10)
    plan, result = prune(root, duplicates=True)
    assert plan.actions == () and result.count(Status.DONE) == 0
    (kept,) = [s for s in plan.skipped if s.rule is Selector.DUPLICATES]
    assert kept.name == "jit_f" and "cannot tell which key runs use" in kept.reason
    assert set(jit_f) <= entry_keys(root)


@pytest.mark.slow
def test_corrupt_removes_damage_but_not_a_write_in_progress(
    copy_of: Callable[[Path], Path], seed_cache: Path
) -> None:
    root = copy_of(seed_cache)
    keys = sorted(entry_keys(root))
    old, young = root / f"{keys[0]}-cache", root / f"{keys[1]}-cache"
    for p in (old, young):
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    age(old, 3600)
    plan, result = prune(root, corrupt=True)
    assert rules_by_name(plan) == {keys[0]: (Selector.CORRUPT,)}
    assert any(s.name == keys[1] and "in progress" in s.reason for s in plan.skipped)
    assert result.count(Status.DONE) == 1
    assert not old.exists() and young.exists()


@pytest.mark.slow
def test_orphans(copy_of: Callable[[Path], Path], evict_cache: Path) -> None:
    root = copy_of(evict_cache)
    gone = "jit_gone-" + "cd" * 32
    set_atime(root, gone, 5)
    age(root / f"{gone}-atime", 3600)
    old_manifest = write_manifest(root, gone)
    age(old_manifest, 3 * 86400)
    compiling = write_manifest(root, "jit_compiling-" + "ef" * 32)  # the hook writes it first
    for name in ("_temp_abc", layout.TEMP_PREFIX + "1-aa"):
        (root / name).write_bytes(b"x")
        age(root / name, 2 * 86400)
    plan, result = prune(root, orphans=True)
    names = {a.name for a in plan.actions}
    assert names == {
        f"{gone}-atime",
        f"{MANIFEST_DIRNAME}/{gone}.json",
        "_temp_abc",
        layout.TEMP_PREFIX + "1-aa",
    }
    assert any("compiling" in s.name for s in plan.skipped)
    assert result.count(Status.DONE) == 4
    assert compiling.exists() and not old_manifest.exists()
    assert prune(root, orphans=True)[0].actions == ()


@pytest.mark.slow
def test_any_run_finishes_an_interrupted_removal(
    copy_of: Callable[[Path], Path], evict_cache: Path
) -> None:
    """A kill between the -cache and the -atime leaves an -atime alone; the next run takes it."""
    root = copy_of(evict_cache)
    keys = sorted(entry_keys(root))
    os.unlink(root / f"{keys[0]}-cache")
    age(root / f"{keys[0]}-atime", 3600)
    plan, result = prune(root, older_than_s=30 * 86400, module=keys[0].rsplit("-", 1)[0])
    assert [(a.name, a.rules) for a in plan.actions] == [(f"{keys[0]}-atime", (Selector.ORPHANS,))]
    assert result.count(Status.DONE) == 1
    assert not (root / f"{keys[0]}-atime").exists()
    other = prune(root, older_than_s=30 * 86400, module="no_such_module*")[0]
    assert other.actions == ()


@pytest.mark.slow
def test_relocated_reuses_scans_finding(copy_of: Callable[[Path], Path], seed_cache: Path) -> None:
    root = copy_of(seed_cache)  # written for the session's path: relocated here
    make_cache(root, [("plain", {"CACHEDOCTOR_PLAIN_SIZE": "48"})])  # native entries
    finding = [
        f for f in scan_directory(Location.parse(root)).findings if f.kind is FindingKind.RELOCATED
    ]
    assert finding, "a moved cache must be relocated on this JAX"
    plan, result = prune(root, relocated=True)
    kept = {s.name: s.reason for s in plan.skipped if s.rule is Selector.RELOCATED}
    assert {a.name for a in plan.actions} | set(kept) == set(finding[0].entries)
    assert plan.actions and result.count(Status.DONE) == len(plan.actions)
    # the seed's second run hit its helper modules (copied with their access times): a run
    # that spells the cache as they were written looks them up, so they stay
    assert all("a run that spells the cache so looks it up" in why for why in kept.values())
    report = scan_directory(Location.parse(root))
    assert report.entries  # the native entries stay
    still = [f for f in report.findings if f.kind is FindingKind.RELOCATED]
    assert {k for f in still for k in f.entries} == set(kept)


@pytest.mark.slow
def test_stale_jax_from_layout_and_manifests(
    copy_of: Callable[[Path], Path], mixed_cache: Path
) -> None:
    root = copy_of(mixed_cache)
    report = scan_directory(Location.parse(root))
    layouts = {p.name[: -len("-cache")]: raw_payload_layout(p) for p in root.glob("*-cache")}
    old_layout = {key for key, layout in layouts.items() if layout == "pjrt"}
    assert old_layout, "jax 0.8.3 writes entries without the pjrt_ifrt header"
    current = sorted(key for key, layout in layouts.items() if layout != "pjrt")
    write_manifest(root, current[0], jaxlib="0.7.0")
    write_manifest(root, current[1], jaxlib=str(report.jax.jaxlib_version))
    for key in old_layout | {current[0]}:  # written, and last used, before the upgrade
        age(root / f"{key}-cache", 3 * 86400)
    plan, result = prune(root, stale_jax=True)
    assert {a.name for a in plan.actions} == old_layout | {current[0]}
    assert "manifest: written by jaxlib 0.7.0" in rules_reason(plan, current[0])
    assert result.count(Status.DONE) == len(plan.actions)
    assert not (root / MANIFEST_DIRNAME / f"{current[0]}.json").exists()
    assert (root / MANIFEST_DIRNAME / f"{current[1]}.json").exists()


def rules_reason(plan: Plan, name: str) -> str:
    return next(a.reason for a in plan.actions if a.name == name)


@pytest.mark.slow
def test_module_alone_and_as_a_limit(copy_of: Callable[[Path], Path], evict_cache: Path) -> None:
    root = copy_of(evict_cache)
    keys = entry_keys(root)
    g = {k for k in keys if k.startswith("jit_g-")}
    assert g and g != keys
    plan = plan_prune(Location.parse(root), PruneOptions(module="jit_g"))
    assert {a.name for a in plan.actions} == g
    assert all(a.rules == (Selector.MODULE,) for a in plan.actions)
    # with another rule, --module narrows it: everything is older than 0 s, only jit_g goes
    plan = plan_prune(Location.parse(root), PruneOptions(module="jit_g", older_than_s=0))
    assert {a.name for a in plan.actions} == g


@pytest.mark.slow
@pytest.mark.parametrize(
    "narrowed",
    [
        {"repair": True},
        {"orphans": True, "stale_after_s": 0},
        {"xla_subcaches": True},
        {"repair": True, "orphans": True, "xla_subcaches": True},
    ],
)
def test_module_never_widens_a_selector_that_removes_no_entry(
    copy_of: Callable[[Path], Path], evict_cache: Path, narrowed: dict[str, Any]
) -> None:
    """Trust IV: `--module 'jit_*' --repair` (or --orphans, --xla-subcaches) planned the removal
    of every entry of the matching modules. A narrowing never widens: no entry goes, the
    selector acts only on the modules named (-atime files recreated for jit_g alone), and what
    names no module (XLA's sub-caches) is kept."""
    root = copy_of(evict_cache)
    for name in os.listdir(root):  # every -atime file gone: --repair recreates them
        if name.endswith(layout.ATIME_SUFFIX):
            os.unlink(root / name)
    sub = root / layout.AUTOTUNE_DIR
    sub.mkdir(exist_ok=True)
    (sub / ("A" * 43 + ".textproto")).write_text("run_time { nanos: 5 }")
    before = entry_keys(root)
    plan, _ = prune(root, module="jit_g", **narrowed)
    assert not [a for a in plan.actions if a.op == Op.REMOVE_ENTRY], plan.actions
    assert entry_keys(root) == before  # applied: every entry is still there
    g = {k for k in before if k.startswith("jit_g-")}
    recreated = {a.name for a in plan.actions if a.op == Op.RECREATE_ATIME}
    assert recreated == (g if narrowed.get("repair") else set())
    assert not [a for a in plan.actions if a.rules == (Selector.XLA_SUBCACHES,)]
    assert (sub / ("A" * 43 + ".textproto")).exists()


@pytest.mark.slow
def test_xla_subcaches_only_when_asked(copy_of: Callable[[Path], Path], seed_cache: Path) -> None:
    root = copy_of(seed_cache)
    sub = root / layout.AUTOTUNE_DIR
    sub.mkdir(exist_ok=True)
    (sub / ("A" * 43 + ".textproto")).write_text("run_time { nanos: 5 }")
    (sub / "mine.txt").write_text("not XLA's")
    outside = root.parent / "outside.textproto"
    outside.write_text("keep")
    (sub / ("B" * 43 + ".textproto")).symlink_to(outside)
    plan = plan_prune(Location.parse(root), PruneOptions(orphans=True))
    assert not any(a.rules == (Selector.XLA_SUBCACHES,) for a in plan.actions)
    assert any("not touched without --xla-subcaches" in n for n in plan.notes)
    plan, result = prune(root, xla_subcaches=True)
    assert [a.name for a in plan.actions] == [f"{layout.AUTOTUNE_DIR}/{'A' * 43}.textproto"]
    assert result.count(Status.DONE) == 1
    assert (sub / "mine.txt").exists() and (sub / ("B" * 43 + ".textproto")).is_symlink()
    assert outside.read_text() == "keep"
    skipped = {s.name: s.reason for s in plan.skipped}
    assert "symbolic link" in skipped[f"{layout.AUTOTUNE_DIR}/{'B' * 43}.textproto"]
    assert "not recognised" in skipped[f"{layout.AUTOTUNE_DIR}/mine.txt"]


@pytest.mark.slow
def test_links_and_foreign_files_are_left_alone_and_reported(
    copy_of: Callable[[Path], Path], evict_cache: Path, tmp_path: Path
) -> None:
    root = copy_of(evict_cache)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious-cache").write_bytes(b"not yours")
    linked_key = "jit_link-" + "12" * 32
    (root / f"{linked_key}-cache").symlink_to(victim / "precious-cache")
    (root / f"{linked_key}-atime").symlink_to(victim / "precious-cache")
    (root / "README.txt").write_text("a user's note")
    (root / "somedir").mkdir()
    write_manifest(root, "jit_x-" + "34" * 32)
    os.symlink(victim, root / MANIFEST_DIRNAME / "escape.json")
    before_victim = snapshot(victim)
    plan, result = prune(root, older_than_s=0, orphans=True, stale_after_s=0, repair=True)
    assert result.count(Status.FAILED) == 0
    skipped = {s.name: s.reason for s in plan.skipped}
    for name in (f"{linked_key}-cache", f"{linked_key}-atime"):
        assert "symbolic link" in skipped[name]
        assert (root / name).is_symlink()
    assert "not recognised" in skipped["README.txt"] and (root / "README.txt").exists()
    assert "not recognised" in skipped["somedir"] and (root / "somedir").is_dir()
    assert (root / MANIFEST_DIRNAME / "escape.json").is_symlink()
    assert snapshot(victim) == before_victim
    assert entry_keys(root) == {linked_key}  # only the link is left of the entries


@pytest.mark.slow
def test_a_linked_manifests_folder_is_not_entered(
    copy_of: Callable[[Path], Path], seed_cache: Path, tmp_path: Path
) -> None:
    root = copy_of(seed_cache)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ("jit_gone-" + "56" * 32 + ".json")).write_text("{}")
    age(elsewhere / ("jit_gone-" + "56" * 32 + ".json"), 3 * 86400)
    (root / MANIFEST_DIRNAME).symlink_to(elsewhere)
    before = snapshot(elsewhere)
    plan, result = prune(root, orphans=True, stale_jax=True, stale_after_s=0)
    assert result.count(Status.FAILED) == 0
    assert "symbolic link" in {s.name: s.reason for s in plan.skipped}[MANIFEST_DIRNAME]
    assert snapshot(elsewhere) == before


@pytest.mark.slow
def test_a_file_changed_since_the_plan_is_skipped(
    copy_of: Callable[[Path], Path], evict_cache: Path
) -> None:
    root = copy_of(evict_cache)
    keys = sorted(entry_keys(root))
    plan = plan_prune(Location.parse(root), PruneOptions(older_than_s=0))
    set_atime(root, keys[0], time.time_ns())  # a JAX process used it meanwhile
    rewritten = root / f"{keys[1]}-cache"
    rewritten.write_bytes(rewritten.read_bytes())  # rewritten meanwhile (new mtime)
    os.utime(rewritten, ns=(0, 12345))
    result = apply(plan)
    status = {o.action.name: (o.status, o.detail) for o in result.outcomes}
    assert status[keys[0]] == (Status.SKIPPED, "used since the plan (its -atime changed)")
    assert status[keys[1]] == (Status.SKIPPED, "changed since the plan")
    assert entry_keys(root) == {keys[0], keys[1]}
    assert_usable(root)


@pytest.mark.slow
def test_repair_restores_a_cache_jax_can_write_again(
    copy_of: Callable[[Path], Path], evict_cache: Path
) -> None:
    root = copy_of(evict_cache)
    keys = sorted(entry_keys(root))
    os.unlink(root / f"{keys[0]}-atime")  # jax-ml/jax#39880: JAX's eviction now fails
    os.chmod(root / f"{keys[1]}-cache", 0o664)
    (root / "_temp_old").write_bytes(b"x")
    age(root / "_temp_old", 2 * 86400)
    broken = run_program("plain", str(root), {**EVICT, "CACHEDOCTOR_PLAIN_SIZE": "24"})
    assert "Error writing persistent compilation cache" in broken.stderr
    plan, result = prune(root, repair=True)
    ops = {(a.op, a.name) for a in plan.actions}
    assert (Op.RECREATE_ATIME, keys[0]) in ops
    assert (Op.FIX_MODE, f"{keys[1]}-cache") in ops
    assert (Op.REMOVE_FILE, "_temp_old") in ops
    assert result.count(Status.DONE) == len(plan.actions)
    stamp = listdir.read_atime(root / f"{keys[0]}-atime")
    assert stamp == (root / f"{keys[0]}-cache").stat().st_mtime_ns
    assert not (root / f"{keys[1]}-cache").stat().st_mode & 0o022
    fixed = run_program("plain", str(root), {**EVICT, "CACHEDOCTOR_PLAIN_SIZE": "24"})
    assert fixed.returncode == 0 and "Error" not in fixed.stderr, fixed.stderr[-1500:]
    assert len(entry_keys(root)) > len(keys)
    assert_usable(root)
    assert prune(root, repair=True)[0].actions == ()


def test_our_lock_and_jaxs_filelock_exclude_each_other(tmp_path: Path) -> None:
    filelock = pytest.importorskip("filelock", reason="JAX's LRU cache uses filelock")
    (tmp_path / ".lockfile").touch()
    jax_lock = filelock.FileLock(str(tmp_path / ".lockfile"))
    with fsops.CacheDir.open(tmp_path) as cd:
        with cd.lock(timeout=1) as locked:
            assert locked
            with pytest.raises(filelock.Timeout):
                jax_lock.acquire(timeout=0.2)
        with jax_lock.acquire(timeout=1), pytest.raises(fsops.LockTimeout), cd.lock(timeout=0.2):
            pass
        with cd.lock(timeout=1) as locked:
            assert locked


def test_no_jax_lockfile_is_created_and_our_runs_still_exclude_each_other(tmp_path: Path) -> None:
    with fsops.CacheDir.open(tmp_path) as cd, cd.lock(timeout=1) as locked:
        assert not locked
        other = fsops.CacheDir.open(tmp_path)
        with other, pytest.raises(fsops.LockTimeout), other.lock(timeout=0.2):
            pass
    assert not (tmp_path / ".lockfile").exists()
    assert listdir.classify(layout.OWN_LOCKFILE, False)[0] is listdir.FileKind.CACHEDOCTOR


@pytest.mark.slow
def test_cli_json_apply_and_second_run(copy_of: Callable[[Path], Path], seed_cache: Path) -> None:
    root = copy_of(seed_cache)
    runner = CliRunner()
    first = runner.invoke(cli, ["prune", str(root), "--module", "jit_f", "--apply", "--json"])
    assert first.exit_code == 0, first.output
    doc = json.loads(first.output)
    assert doc["schema_version"] == 1 and doc["applied"] is True
    assert doc["summary"]["entries"] == 3 and doc["result"]["done"] == 3
    assert {a["rule"] for a in doc["actions"]} == {"module"}
    assert doc["summary"]["bytes_to_reclaim"] == doc["result"]["bytes_reclaimed"] > 0
    assert "understood: only modules matching jit_f" in doc["notes"]
    second = runner.invoke(cli, ["prune", str(root), "--module", "jit_f", "--apply"])
    assert second.exit_code == 0 and "nothing to do" in second.output


@pytest.mark.slow
def test_cli_usage_errors_are_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    for args, needle in (
        ([str(tmp_path)], "nothing selected"),
        ([str(tmp_path), "--max-size", "lots"], "not a size"),
        ([str(tmp_path / "missing"), "--orphans"], "no such directory"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "cachedoctor", "prune", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_renderers_show_rules_outcomes_skips_and_conflicts() -> None:
    from rich.console import Console

    from cachedoctor.core.prune.actions import Action, ApplyReport, Outcome, Plan, Skip
    from cachedoctor.render.plan import plan_document, render_plan
    from cachedoctor.storage.fileid import FileId

    key = "jit_f-" + "ab" * 32
    remove = Action(
        Op.REMOVE_ENTRY,
        key,
        (Selector.OLDER_THAN, Selector.DUPLICATES),
        "last used 40 days ago",
        2048,
        "jit_f",
        10**18,
        (FileId(f"{key}-cache", 1, 2000, 5),),
    )
    move = Action(
        Op.MOVE_ENTRY,
        "jit_g-" + "cd" * 32,
        (Selector.REKEY,),
        "hasher v1 → v2",
        new_key="jit_g-" + "ef" * 32,
    )
    plan = Plan(
        "prune",
        Location.parse("/c"),
        0.0,
        ("older-than 30d",),
        (remove, move),
        (Skip("link-cache", "symbolic link: never followed or removed"),),
        conflicts=(Skip("jit_h-x", "new key holds a different executable"),),
    )
    result = ApplyReport(
        plan,
        (
            Outcome(remove, Status.DONE, "", 2048),
            Outcome(move, Status.SKIPPED, "changed since the plan"),
        ),
        True,
    )
    console = Console(record=True, width=160, no_color=True)
    render_plan(plan, console, result=result)
    text = console.export_text()
    for needle in (
        "older-than,duplicates",
        "jit_f-abababababab…",
        "→ jit_g-efefefefefef…",
        "skipped (changed since the plan)",
        "link-cache: symbolic link",
        "conflict  jit_h-x",
        "applied: 1 done, 1 skipped, 0 failed; reclaimed 2.0 KiB",
    ):
        assert needle in text, (needle, text)
    doc = plan_document(plan, result)
    assert doc["actions"][0]["rule"] == "older-than" and doc["actions"][0]["status"] == "done"
    assert doc["actions"][1]["new_key"] == "jit_g-" + "ef" * 32
    assert doc["actions"][0]["name"] == key  # JSON keeps keys whole
    assert doc["result"] == {
        "done": 1,
        "skipped": 1,
        "failed": 0,
        "bytes_reclaimed": 2048,
        "locked": True,
    }
    assert doc["summary"]["conflicts"] == 1 and doc["schema_version"] == 1


@pytest.mark.parametrize("hard_links", [True, False], ids=["links", "no-links"])
def test_atomic_writes_never_replace_and_never_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hard_links: bool
) -> None:
    import errno

    if not hard_links:  # a filesystem without hard links: copy + rename after a check

        def no_link(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EPERM, "no hard links here")

        monkeypatch.setattr(os, "link", no_link)
    (tmp_path / "victim").write_bytes(b"outside")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "src").write_bytes(b"entry bytes")
    (cache / "taken").write_bytes(b"theirs")
    (cache / "link").symlink_to(tmp_path / "victim")
    with fsops.CacheDir.open(cache) as cd:
        assert cd.write_new("new-atime", b"12345678")
        assert not cd.write_new("taken", b"ours")
        assert not cd.write_new("link", b"ours")
        assert cd.link_noreplace("src", "moved")
        assert not cd.link_noreplace("src", "taken")
        with contextlib.suppress(OSError):  # a link is never copied through
            cd.link_noreplace("link", "through-link")
    through = cache / "through-link"
    assert not through.exists() or through.is_symlink()  # at most another name for the link
    assert (cache / "new-atime").read_bytes() == b"12345678"
    assert (cache / "moved").read_bytes() == b"entry bytes"
    assert (cache / "taken").read_bytes() == b"theirs"
    assert (tmp_path / "victim").read_bytes() == b"outside"
    assert not [p for p in cache.iterdir() if fsops.is_own_temp(p.name)]


def test_stats_records_are_read_only_for_selectors_that_weigh_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a bucket each record is a GET: --corrupt or --orphans must not pay for them."""
    from cachedoctor.core.usage import records

    reads: list[object] = []

    def read_records(store: object) -> tuple[list[object], list[object]]:
        reads.append(store)
        return [], []

    monkeypatch.setattr(records, "read_records", read_records)
    plan_prune(Location.parse(tmp_path), PruneOptions(corrupt=True, orphans=True))
    assert reads == []
    plan_prune(Location.parse(tmp_path), PruneOptions(duplicates=True))
    plan_prune(Location.parse(tmp_path), PruneOptions(older_than_s=60))
    assert len(reads) == 2
