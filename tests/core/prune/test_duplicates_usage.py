"""`prune --duplicates` acts on usage evidence: nothing a population of runs hits is removed.

Each cache is written by real JAX runs of the seed program (a custom_partitioning op, whose
pointer JAX hashes into the key), by populations teams mix on one cache: hooked (stable keys),
plain, JAX's pointer flag, observe mode, LRU on. The oracle is JAX's own log of each rerun
(``JAX_EXPLAIN_CACHE_MISSES``): after ``--apply``, every population that hit before still hits.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachedoctor.core.prune.actions import Plan, Selector, Status
from cachedoctor.core.prune.apply import apply
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.planner import plan_prune
from cachedoctor.layout import MANIFEST_DIRNAME
from cachedoctor.storage.location import Location
from tests.support import hookrun
from tests.support.buckets import running_servers

pytestmark = pytest.mark.slow

FLAG = {"JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY": "1"}
LRU = {"JAX_COMPILATION_CACHE_MAX_SIZE": str(1 << 30)}
RECORDED = {"CACHEDOCTOR_HOOK": "stats"}  # the start-up hook writes a stats record at exit


def run_seed(cache: Path | str, mode: str = "none", **extra: str) -> tuple[str | None, bool]:
    """One run of the seed program: (the jit_f key it wrote, or None), and whether jit_f hit."""
    before = set(hookrun.entries(cache, "jit_f"))
    env = hookrun.base_env(
        cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        **extra,
    )
    run = hookrun.run_program("seed", cache, mode=mode, env=env)
    written = set(hookrun.entries(cache, "jit_f")) - before
    assert len(written) <= 1
    return (written.pop() if written else None), "jit_f" not in run.misses


def duplicates_plan(cache: Path | str) -> Plan:
    return plan_prune(Location.parse(cache), PruneOptions(duplicates=True))


def removed(plan: Plan) -> set[str]:
    return {a.name for a in plan.actions if Selector.DUPLICATES in a.rules}


@pytest.fixture
def noatime_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder on a tmpfs mounted ``noatime``: its access times tell nothing."""
    where = tmp_path / "noatime"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "noatime,size=64m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a noatime tmpfs needs CAP_SYS_ADMIN: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_mixed_cache_keeps_every_key_that_runs_hit(tmp_path: Path) -> None:
    """Hooked, recorded plain and pointer-flag runs on one cache (issue 29's case): the old
    rule removed the stable-keyed entry ("kept: used last" by mtime) and kept a plain one. The
    plain runs' stats records name their writer's key policy: the pointer was in JAX's key."""
    cache = tmp_path / "mixed"
    stable, hit = run_seed(cache, "stable")
    assert stable is not None and not hit
    assert run_seed(cache, "stable") == (None, True)  # JAX hits the stable key
    plain_1, hit = run_seed(cache, **RECORDED)
    assert plain_1 is not None and not hit
    flagged, _ = run_seed(cache, **FLAG)
    assert run_seed(cache, **FLAG) == (None, True)  # JAX's flag: the same key, a hit
    plain_2, _ = run_seed(cache, **RECORDED)
    assert flagged is not None and plain_2 is not None

    plan = duplicates_plan(cache)
    assert removed(plan) == {plain_1, plain_2}
    for a in plan.actions:
        assert "stats records: written by a process whose JAX key held" in a.reason
    assert all(a.last_used_ns is None for a in plan.actions)  # no record of a use: no date

    result = apply(plan)
    assert result.count(Status.DONE) == 2
    assert set(hookrun.entries(cache, "jit_f")) == {stable, flagged}
    assert run_seed(cache, "stable") == (None, True)
    assert run_seed(cache, **FLAG) == (None, True)


def test_a_recorded_plain_pile_is_cleared(tmp_path: Path) -> None:
    """The seed's plain user, recorded: every run writes a pointer key that nothing reads
    again, and each writer's record says JAX hashed the pointer, the newest's too."""
    cache = tmp_path / "pile"
    keys = [run_seed(cache, **RECORDED)[0] for _ in range(3)]
    plan = duplicates_plan(cache)
    assert removed(plan) == set(keys)
    for a in plan.actions:
        assert "jax_remove_custom_partitioning_ptr_from_cache_key off" in a.reason
    assert apply(plan).count(Status.DONE) == 3
    assert hookrun.entries(cache, "jit_f") == []


def test_an_unrecorded_pile_is_kept_for_the_pointer_flag_may_have_written_it(
    tmp_path: Path,
) -> None:
    """Issue 39, case 2: JAX's pointer flag population writes its (stable) key, then a plain
    run writes another. Nothing tells which wrote which: the group is kept, and the flag
    population's second run hits."""
    cache = tmp_path / "flag-then-plain"
    flagged, _ = run_seed(cache, **FLAG)
    plain, _ = run_seed(cache)
    plan = duplicates_plan(cache)
    assert removed(plan) == set()
    skipped = [s for s in plan.skipped if s.rule is Selector.DUPLICATES]
    assert len(skipped) == 1 and "cannot tell which key runs use" in skipped[0].reason
    assert "CACHEDOCTOR_HOOK=stats" in skipped[0].reason  # what would tell it
    apply(plan)
    assert run_seed(cache, **FLAG) == (None, True)
    assert set(hookrun.entries(cache, "jit_f")) == {flagged, plain}


def test_the_flag_population_in_observe_mode_is_kept(tmp_path: Path) -> None:
    """Its manifest says ``jax_key_pointer: false``: proof that its key is stable."""
    cache = tmp_path / "observe-flag"
    flagged, _ = run_seed(cache, "observe", **FLAG)
    plain, _ = run_seed(cache, **RECORDED)
    plan = duplicates_plan(cache)
    assert flagged not in removed(plan) and plain in removed(plan)
    apply(plan)
    assert run_seed(cache, "observe", **FLAG) == (None, True)


def test_a_read_since_the_plan_cancels_the_removal(tmp_path: Path) -> None:
    cache = tmp_path / "pile"
    older, _ = run_seed(cache, **RECORDED)
    run_seed(cache, **FLAG)
    plan = duplicates_plan(cache)
    assert removed(plan) == {older}
    (cache / f"{older}-cache").read_bytes()  # a process reads it, as JAX's get does
    result = apply(plan)
    assert result.count(Status.DONE) == 0
    assert older in hookrun.entries(cache, "jit_f")
    assert removed(duplicates_plan(cache)) == set()  # read now: a record of use


def test_a_scan_leaves_the_evidence_as_it_was(tmp_path: Path) -> None:
    """cachedoctor's own reads (O_NOATIME) never make an entry look used."""
    cache = tmp_path / "pile"
    older, _ = run_seed(cache, **RECORDED)
    run_seed(cache, **FLAG)
    before = (cache / f"{older}-cache").stat()
    assert before.st_atime_ns <= before.st_mtime_ns
    from cachedoctor.core.scan.run import scan_directory

    scan_directory(Location.parse(cache))
    duplicates_plan(cache)
    after = (cache / f"{older}-cache").stat()
    assert after.st_atime_ns == before.st_atime_ns
    assert removed(duplicates_plan(cache)) == {older}


def test_without_a_record_of_use_nothing_is_removed(noatime_dir: Path) -> None:
    """On a noatime mount with no -atime and no manifest, no record tells which key runs use."""
    cache = noatime_dir / "cache"
    keys = {run_seed(cache)[0] for _ in range(2)}
    plan = duplicates_plan(cache)
    assert removed(plan) == set()
    skipped = [s for s in plan.skipped if s.rule is Selector.DUPLICATES]
    assert len(skipped) == 1 and skipped[0].name == "jit_f"
    assert "cannot tell which key runs use" in skipped[0].reason
    assert "noatime" in skipped[0].reason
    assert set(hookrun.entries(cache, "jit_f")) == keys


def test_with_lru_on_the_atime_files_are_the_record(noatime_dir: Path) -> None:
    """With JAX's size limit on, its -atime files tell hits from writes, even on noatime."""
    cache = noatime_dir / "cache"
    plain, _ = run_seed(cache, **LRU, **RECORDED)
    flagged, _ = run_seed(cache, **FLAG, **LRU)
    assert run_seed(cache, **FLAG, **LRU) == (None, True)
    assert (cache / ".lockfile").exists()
    plan = duplicates_plan(cache)
    assert removed(plan) == {plain} and flagged not in removed(plan)
    reason = next(a.reason for a in plan.actions if a.name == plain)
    assert "stats records: written by a process whose JAX key held" in reason
    apply(plan)
    assert run_seed(cache, **FLAG, **LRU) == (None, True)


def test_observe_manifests_show_whether_jax_hashed_the_pointer(tmp_path: Path) -> None:
    """Observe mode records whether JAX's key held the pointer, and the partitioner calls: a
    stable-hooked run replays those calls and hits the pointer key (JAX's log), so the plan
    keeps each such key and says why; nothing the flag's run reads is removed either."""
    cache = tmp_path / "observe"
    pointer_keys = {run_seed(cache, "observe")[0] for _ in range(2)}
    flagged, _ = run_seed(cache, "observe", **FLAG)
    manifests = cache / MANIFEST_DIRNAME
    recorded = {
        k: json.loads((manifests / f"{k}.json").read_text())["jax_key_pointer"]
        for k in [*pointer_keys, flagged]
        if k is not None
    }
    assert recorded == {**dict.fromkeys(pointer_keys, True), flagged: False}
    plan = duplicates_plan(cache)
    assert removed(plan) == set()
    kept = {s.name: s.reason for s in plan.skipped if s.rule is Selector.DUPLICATES}
    assert set(kept) == pointer_keys, kept
    assert all("a run with the stable hook" in why for why in kept.values()), kept
    apply(plan)
    assert run_seed(cache, "observe", **FLAG) == (None, True)
    assert run_seed(cache, "stable") == (None, True)  # it replays a recorded variant: a hit


@pytest.mark.remote
def test_on_a_bucket_a_recorded_hit_keeps_the_flag_copy(tmp_path: Path) -> None:
    """Issue 29: a bucket keeps no access time, so without -atime the copy flag runs hit and
    the copy of a plain run, read by no one, looked alike (no manifest, beside the stable key)
    and both went. The flag runs' stats records count a hit of their key: that copy is kept.

    Every run goes through cachedoctor's start-up (``CACHEDOCTOR_HOOK``: stable, stats, off),
    which keeps XLA's subcaches local for a bucket cache: a run without it names the bucket's
    autotune folder in its compile options, a different program (the ``relocated`` rule's)."""
    with running_servers() as servers:
        url = servers.url("s3", f"perkey/{tmp_path.name}/cache")
        stable, hit = run_seed(url, CACHEDOCTOR_HOOK="stable", **servers.env)
        assert stable is not None and not hit
        assert run_seed(url, CACHEDOCTOR_HOOK="stable", **servers.env) == (None, True)
        recorded = {"CACHEDOCTOR_HOOK": "stats", **FLAG, **servers.env}
        flagged, hit = run_seed(url, **recorded)
        assert flagged is not None and not hit
        assert run_seed(url, **recorded) == (None, True)  # JAX's log: the flag key hits
        plain, hit = run_seed(url, CACHEDOCTOR_HOOK="stats", **servers.env)  # recorded too
        assert plain is not None and not hit
        unrecorded, _ = run_seed(url, CACHEDOCTOR_HOOK="off", **servers.env)

        plan = duplicates_plan(url)
        assert removed(plan) == {plain}, [(a.name, a.reason) for a in plan.actions]
        reason = {a.name: a.reason for a in plan.actions}[plain]
        assert "stats records: written by a process whose JAX key held" in reason
        assert unrecorded not in removed(plan)  # a plain run or the flag's? nothing tells
        assert apply(plan).count(Status.DONE) == 1
        assert set(hookrun.entries(url, "jit_f")) == {stable, flagged, unrecorded}
        assert run_seed(url, CACHEDOCTOR_HOOK="off", **FLAG, **servers.env) == (None, True)
