"""`rekey` on real caches: moves, duplicates, conflicts, skipped manifests, the real hasher."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cachedoctor import layout
from cachedoctor.core.prune.actions import Op, Status
from cachedoctor.core.prune.apply import apply
from cachedoctor.core.prune.rekey import plan_rekey
from cachedoctor.layout import MANIFEST_DIRNAME
from cachedoctor.storage.location import Location
from tests.support.caches import (
    assert_usable,
    entry_keys,
    snapshot,
    write_manifest,
)


class MapHasher:
    """A stand-in for the stable hasher: a fixed old-key -> new-key table."""

    version = 2

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table

    def recompute(self, manifest: dict[str, Any]) -> str:
        key = str(manifest["key"])
        if key == "broken":
            raise ValueError("recorded bytes do not match")
        return self.table.get(key, key)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_move_takes_entry_atime_and_manifest_together(
    copy_of: Callable[[Path], Path], request: pytest.FixtureRequest
) -> None:
    root = copy_of(request.getfixturevalue("evict_cache"))
    old = sorted(k for k in entry_keys(root) if k.startswith("jit_g-"))[0]
    new = "jit_g-" + "aa" * 32
    write_manifest(root, old)
    ir = root / MANIFEST_DIRNAME / f"{old}.mlir.gz"
    ir.write_bytes(gzip.compress(b"module @jit_g {}"))
    content, atime = sha(root / f"{old}-cache"), (root / f"{old}-atime").read_bytes()
    hasher = MapHasher({old: new})
    before = snapshot(root)
    plan = plan_rekey(Location.parse(root), hasher=hasher)
    assert snapshot(root) == before  # planning changes nothing
    assert [(a.op, a.name, a.new_key) for a in plan.actions] == [(Op.MOVE_ENTRY, old, new)]
    result = apply(plan)
    assert result.count(Status.DONE) == 1
    assert old not in entry_keys(root) and new in entry_keys(root)
    assert sha(root / f"{new}-cache") == content
    assert (root / f"{new}-atime").read_bytes() == atime
    assert not (root / f"{old}-atime").exists()
    moved = json.loads((root / MANIFEST_DIRNAME / f"{new}.json").read_text())
    assert (moved["key"], moved["stable_key"], moved["migrated_from"]) == (new, new, old)
    assert not (root / MANIFEST_DIRNAME / f"{old}.json").exists()
    assert (root / MANIFEST_DIRNAME / f"{new}.mlir.gz").exists() and not ir.exists()
    assert_usable(root)
    assert plan_rekey(Location.parse(root), hasher=hasher).actions == ()


@pytest.mark.slow
def test_next_run_finishes_a_move_killed_before_the_old_manifest_went(
    copy_of: Callable[[Path], Path], request: pytest.FixtureRequest
) -> None:
    """A kill after the entry moved but before the old manifest was removed leaves only that
    manifest behind; the next rekey removes it instead of calling it an orphan."""
    root = copy_of(request.getfixturevalue("evict_cache"))
    old = sorted(k for k in entry_keys(root) if k.startswith("jit_g-"))[0]
    new = "jit_g-" + "bb" * 32
    write_manifest(root, old)
    hasher = MapHasher({old: new})
    apply(plan_rekey(Location.parse(root), hasher=hasher))
    # put back the state of a kill between "entry renamed" and "old manifest removed"
    moved = root / MANIFEST_DIRNAME / f"{new}.json"
    (root / MANIFEST_DIRNAME / f"{old}.json").write_bytes(moved.read_bytes())
    data = json.loads(moved.read_text())
    data["key"] = data["stable_key"] = old
    (root / MANIFEST_DIRNAME / f"{old}.json").write_text(json.dumps(data))
    plan = plan_rekey(Location.parse(root), hasher=hasher)
    assert [(a.op, a.name) for a in plan.actions] == [
        (Op.REMOVE_FILE, f"{MANIFEST_DIRNAME}/{old}.json")
    ]
    assert "interrupted move" in plan.actions[0].reason
    apply(plan)
    assert {p.stem for p in (root / MANIFEST_DIRNAME).glob("*.json")} == {new}
    assert plan_rekey(Location.parse(root), hasher=hasher).actions == ()


@pytest.mark.slow
def test_same_executable_at_the_new_key_drops_the_source(
    copy_of: Callable[[Path], Path], seed_cache: Path
) -> None:
    root = copy_of(seed_cache)
    f0, f1, f2 = sorted(k for k in entry_keys(root) if k.startswith("jit_f-"))
    write_manifest(root, f0)
    plan = plan_rekey(Location.parse(root), hasher=MapHasher({f0: f1}))
    assert [(a.op, a.name) for a in plan.actions] == [(Op.DROP_DUPLICATE, f0)]
    result = apply(plan)
    assert result.count(Status.DONE) == 1 and result.bytes_reclaimed > 0
    assert entry_keys(root) >= {f1, f2} and f0 not in entry_keys(root)
    assert not (root / MANIFEST_DIRNAME / f"{f0}.json").exists()


@pytest.mark.slow
def test_a_target_replaced_after_the_plan_is_compared_again(
    copy_of: Callable[[Path], Path], seed_cache: Path
) -> None:
    root = copy_of(seed_cache)
    f0, f1, _ = sorted(k for k in entry_keys(root) if k.startswith("jit_f-"))
    other = sorted(k for k in entry_keys(root) if not k.startswith("jit_f-"))[0]
    write_manifest(root, f0)
    plan = plan_rekey(Location.parse(root), hasher=MapHasher({f0: f1}))
    assert [a.op for a in plan.actions] == [Op.DROP_DUPLICATE]
    replacement = root / "replacement"
    shutil.copyfile(root / f"{other}-cache", replacement)
    os.replace(replacement, root / f"{f1}-cache")  # a different executable now holds f1
    result = apply(plan)
    assert result.count(Status.FAILED) == 1
    assert "different executable" in result.outcomes[0].detail
    assert f0 in entry_keys(root)


@pytest.mark.slow
def test_two_sources_for_one_new_key(copy_of: Callable[[Path], Path], seed_cache: Path) -> None:
    root = copy_of(seed_cache)
    f0, f1, _ = sorted(k for k in entry_keys(root) if k.startswith("jit_f-"))
    target = "jit_f-" + "bb" * 32
    write_manifest(root, f0)
    write_manifest(root, f1)
    plan = plan_rekey(Location.parse(root), hasher=MapHasher({f0: target, f1: target}))
    assert sorted(a.op for a in plan.actions) == sorted([Op.MOVE_ENTRY, Op.DROP_DUPLICATE])
    assert apply(plan).count(Status.DONE) == 2
    keys = entry_keys(root)
    assert target in keys and f0 not in keys and f1 not in keys


@pytest.mark.slow
def test_a_different_executable_at_the_new_key_is_a_conflict(
    copy_of: Callable[[Path], Path], seed_cache: Path
) -> None:
    root = copy_of(seed_cache)
    f0 = sorted(k for k in entry_keys(root) if k.startswith("jit_f-"))[0]
    other = sorted(k for k in entry_keys(root) if not k.startswith("jit_f-"))[0]
    write_manifest(root, f0)
    before = snapshot(root)
    plan = plan_rekey(Location.parse(root), hasher=MapHasher({f0: other}))
    assert plan.actions == ()
    assert [c.name for c in plan.conflicts] == [f0]
    assert "different executable" in plan.conflicts[0].reason
    apply(plan)
    assert snapshot(root) == before


@pytest.mark.slow
def test_manifests_that_cannot_move_are_skipped_with_reasons(
    copy_of: Callable[[Path], Path], seed_cache: Path
) -> None:
    root = copy_of(seed_cache)
    keys = sorted(entry_keys(root))
    write_manifest(root, keys[0], mode="observe")
    write_manifest(root, "jit_gone-" + "cc" * 32)
    (root / MANIFEST_DIRNAME / f"{keys[1]}.json").write_text("{not json")
    write_manifest(root, keys[2])
    (root / MANIFEST_DIRNAME / f"{keys[2]}.json").rename(root / MANIFEST_DIRNAME / "broken.json")
    plan = plan_rekey(
        Location.parse(root), hasher=MapHasher({k: "jit_x-" + "dd" * 32 for k in keys})
    )
    reasons = {s.name.split("/")[-1]: s.reason for s in plan.skipped}
    assert "observe-mode" in reasons[keys[0]]
    assert "without entry" in reasons["jit_gone-" + "cc" * 32]
    assert "not a readable manifest" in reasons[f"{keys[1]}.json"]
    assert "not its file name" in reasons["broken.json"]
    assert plan.actions == ()


@pytest.mark.slow
def test_real_hasher_moves_an_entry_recorded_under_an_outdated_key(tmp_path: Path) -> None:
    """The expected key is the name the stable hook gave the entry when JAX wrote it; after
    rekey, JAX under the hook hits the moved entry."""
    from tests.support.hookrun import base_env
    from tests.support.hookrun import run_program as run_hooked

    root = tmp_path / "cache"
    env = base_env(root, JAX_COMPILATION_CACHE_MAX_SIZE=str(10**9))  # -atime files too
    first = run_hooked("plain", root, env=env)
    expected = sorted(k for k in entry_keys(root) if k.startswith("jit_g-"))[0]
    outdated = f"jit_g-{'0' * len(expected.rsplit('-', 1)[1])}"
    for suffix in (layout.CACHE_SUFFIX, layout.ATIME_SUFFIX):
        (root / f"{expected}{suffix}").rename(root / f"{outdated}{suffix}")
    manifest = root / MANIFEST_DIRNAME / f"{expected}.json"
    data = json.loads(manifest.read_text())
    manifest.unlink()
    (root / MANIFEST_DIRNAME / f"{outdated}.json").write_text(json.dumps({**data, "key": outdated}))
    plan = plan_rekey(Location.parse(root))
    assert [(a.op, a.name, a.new_key) for a in plan.actions] == [
        (Op.MOVE_ENTRY, outdated, expected)
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "rekey", str(root), "--apply", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"]["done"] == 1
    assert expected in entry_keys(root) and outdated not in entry_keys(root)
    assert (root / f"{expected}{layout.ATIME_SUFFIX}").exists()
    again = run_hooked("plain", root, env=env)
    assert again.misses == [] and again.result == first.result


V2_RUNNER = """
import runpy, sys
import cachedoctor.stablekeys.splithash as splithash
splithash.HASHER_VERSION += 1  # what a hasher upgrade does: a new combination step
splithash.combine.__defaults__ = (splithash.HASHER_VERSION,)
from cachedoctor.stablekeys import hook
assert hook.install("stable")
prog = sys.argv[1]
sys.argv = [prog]
runpy.run_path(prog, run_name="__main__")
"""


@pytest.mark.slow
def test_after_a_hasher_upgrade_rekey_makes_the_hook_hit_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real manifests from the real hook; after rekey, a hook with the new hasher hits them."""
    from cachedoctor.programs import program_path
    from cachedoctor.stablekeys import splithash as stable
    from tests.support.hookrun import Run, base_env
    from tests.support.hookrun import run_program as run_hooked

    filelock_needed = importlib.util.find_spec("filelock") is None
    if filelock_needed:
        pytest.skip("JAX's LRU eviction needs the filelock package")
    root = tmp_path / "cache"
    env = base_env(root, JAX_COMPILATION_CACHE_MAX_SIZE=str(10**9))
    first = run_hooked("plain", root, env=env)
    written = entry_keys(root)
    assert first.misses and written
    current = plan_rekey(Location.parse(root))
    assert current.actions == () and f"; {len(written)} manifest-bearing" in current.notes[0]

    monkeypatch.setattr(stable, "HASHER_VERSION", stable.HASHER_VERSION + 1)
    plan = plan_rekey(Location.parse(root))
    assert {a.name for a in plan.actions} == written
    assert all(a.op is Op.MOVE_ENTRY for a in plan.actions)
    assert apply(plan).count(Status.DONE) == len(written)
    assert_usable(root)
    assert entry_keys(root) == {a.new_key for a in plan.actions}

    script = tmp_path / "v2.py"
    script.write_text(V2_RUNNER)
    proc = subprocess.run(
        [sys.executable, str(script), str(program_path("plain"))],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    second = Run(proc.returncode, proc.stdout, proc.stderr)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.misses == [], second.misses
    assert second.result == first.result
    assert entry_keys(root) == {a.new_key for a in plan.actions}  # nothing recompiled
