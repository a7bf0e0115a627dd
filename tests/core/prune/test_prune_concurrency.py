"""`prune --apply` and `rekey --apply` beside running JAX processes, and killed at random points."""

from __future__ import annotations

import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.cache import listdir, reader
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.check.runner import Run, run_program
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.prune.apply import apply
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.planner import plan_prune
from cachedoctor.core.prune.rekey import plan_rekey
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.layout import MANIFEST_DIRNAME
from cachedoctor.storage.location import Location
from tests.support.caches import (
    EVICT,
    assert_usable,
    cli_env,
    entry_keys,
    needs_filelock,
    write_manifest,
)

pytestmark = pytest.mark.slow

SIZES = ("16", "24", "32")
RUNS_PER_WORKER = 3


def expected_result(size: int) -> float:
    """What programs/plain.py prints: sum(sin(x) * 2 + cos(x)) over arange(size)."""
    return sum(math.sin(x) * 2.0 + math.cos(x) for x in range(size))


class RandomHasher:
    """Rekeys whatever it is asked about to a fresh key: every rekey pass moves entries."""

    version = 99

    def recompute(self, manifest: dict[str, Any]) -> str:
        module = str(manifest["key"]).rsplit("-", 1)[0]
        return f"{module}-{secrets.token_hex(32)}"


def _maintain(root: Path, stop: threading.Event, errors: list[str], counts: dict[str, int]) -> None:
    """Loop prune and rekey passes over ``root`` until told to stop."""
    rng = random.Random(root.name)
    choices = [
        PruneOptions(older_than_s=0),  # everything: the most hostile pass
        PruneOptions(max_size=6000),
        PruneOptions(corrupt=True, duplicates=True, orphans=True, stale_after_s=0),
        PruneOptions(repair=True),
    ]
    while not stop.is_set():
        try:
            result = apply(plan_prune(Location.parse(root), rng.choice(choices)), lock_timeout=20)
            counts["prune"] += len(result.outcomes)
            for key in list(entry_keys(root))[:2]:  # give entries manifests, then move them
                info = reader.decode_entry(root / f"{key}-cache", key=key)
                if isinstance(info, EntryInfo) and info.ok and (root / f"{key}-cache").exists():
                    write_manifest(root, key)
            moved = apply(plan_rekey(Location.parse(root), hasher=RandomHasher()), lock_timeout=20)
            counts["rekey"] += len(moved.outcomes)
            failed = [o for o in (*result.outcomes, *moved.outcomes) if o.status == "failed"]
            errors += [f"{o.action.name}: {o.detail}" for o in failed]
        except Exception as exc:  # a crash in the loop fails the test
            errors.append(f"{type(exc).__name__}: {exc}")
            return
        time.sleep(0.05)


def _work(
    root: Path,
    env: dict[str, str],
    runs: list[tuple[str, Run]],
    seed: int,
    n: int = RUNS_PER_WORKER,
) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        size = rng.choice(SIZES)
        runs.append(
            (size, run_program("plain", str(root), {**env, "CACHEDOCTOR_PLAIN_SIZE": size}))
        )


def test_jax_runs_stay_correct_while_prune_and_rekey_loop(tmp_path: Path) -> None:
    needs_filelock()
    evicting, plain = tmp_path / "evicting", tmp_path / "plain"
    runs: dict[Path, list[tuple[str, Run]]] = {evicting: [], plain: []}
    errors: list[str] = []
    counts = {"prune": 0, "rekey": 0}
    stop = threading.Event()
    for root in runs:
        root.mkdir()
    # one JAX run first in each, so the loops have entries from the start
    _work(evicting, EVICT, runs[evicting], 0, n=1)
    _work(plain, {}, runs[plain], 1, n=1)
    maintainers = [
        threading.Thread(target=_maintain, args=(root, stop, errors, counts)) for root in runs
    ]
    workers = [
        threading.Thread(target=_work, args=(root, env, runs[root], seed))
        for seed, (root, env) in enumerate([(evicting, EVICT), (evicting, EVICT), (plain, {})])
    ]
    for t in maintainers + workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    for t in maintainers:
        t.join()
    assert not errors, errors
    print("maintenance outcomes:", counts)
    assert counts["rekey"] > 0
    for root, done in runs.items():
        for size, run in done:
            assert run.returncode == 0, run.stderr[-2000:]
            value = float(re.search(r"result: (\S+)", run.stdout).group(1))  # type: ignore[union-attr]
            assert math.isclose(value, expected_result(int(size)), rel_tol=1e-4, abs_tol=1e-3)
            if root == evicting:  # JAX and cachedoctor share the lock: never a cache error
                assert "persistent compilation cache" not in run.stderr, run.stderr[-2000:]
        assert_usable(root)


def _make_big_cache(src: Path, dst: Path, count: int) -> None:
    """``count`` real entries (copies of ``src``'s under fresh keys) with -atime and manifests."""
    dst.mkdir()
    originals = sorted(src.glob("*-cache"))
    for i in range(count):
        module = originals[i % len(originals)].name.rsplit("-", 2)[0]
        key = f"{module}-{secrets.token_hex(32)}"
        shutil.copyfile(originals[i % len(originals)], dst / f"{key}-cache")
        atime = dst / f"{key}-atime"
        atime.write_bytes((1_700_000_000 * 10**9 + i).to_bytes(8, "little"))
        # written long ago: an -atime orphaned by a kill is then past the one-minute grace
        os.utime(atime, (1_700_000_000, 1_700_000_000))
        if i % 3 == 0:
            write_manifest(dst, key)
    (dst / ".lockfile").touch()


def test_prune_killed_at_random_points_leaves_a_usable_cache(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    total = 400
    rng = random.Random(7)
    killed_mid_apply = 0
    # a kill that lands after prune removed the last entry proves nothing: on a machine where
    # it removes 400 entries within the pause, try again on a fresh cache (CI saw it once)
    for attempt in range(3):
        root = tmp_path / f"big-{attempt}"
        _make_big_cache(request.getfixturevalue("evict_cache"), root, total)
        argv = [sys.executable, "-m", "cachedoctor", "prune", str(root), "--older-than", "0s"]
        for _ in range(4):
            remaining = len(entry_keys(root))
            if remaining == 0:
                break
            proc = subprocess.Popen([*argv, "--apply"], env=cli_env(), stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while len(entry_keys(root)) == remaining and proc.poll() is None:
                assert time.monotonic() < deadline, "prune never started removing"
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.15))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            left = len(entry_keys(root))
            killed_mid_apply += 0 < left < remaining
            report = scan_directory(Location.parse(root))
            assert not [f for f in report.findings if f.kind is FindingKind.CORRUPT]
            assert_usable(root)  # in particular: no -cache without its -atime
            names = set(os.listdir(root))
            unknown = [i.name for i in listdir.list_cache(root).of_kind(listdir.FileKind.UNKNOWN)]
            assert not unknown, unknown  # nothing half-written under a name JAX could pick up
            assert all(f"{k}-atime" in names for k in entry_keys(root))
        if killed_mid_apply:
            break
    print("kills that landed while entries were being removed:", killed_mid_apply)
    assert killed_mid_apply >= 1
    # the next run with the same arguments finishes what the kills left (orphaned -atime files)
    done = subprocess.run([*argv, "--apply"], env=cli_env(), capture_output=True)
    assert done.returncode == 0, (sorted(os.listdir(root)), done.stderr)
    assert entry_keys(root) == set()
    assert not list(root.glob("*-atime"))
    # manifests without entry wait for --orphans past --stale-after (the hook writes them early)
    subprocess.run(
        [*argv, "--orphans", "--stale-after", "0s", "--apply"], env=cli_env(), capture_output=True
    )
    assert not list((root / MANIFEST_DIRNAME).glob("*.json"))
    again = plan_prune(
        Location.parse(root), PruneOptions(older_than_s=0, orphans=True, stale_after_s=0)
    )
    assert again.actions == ()


REKEY_SCRIPT = """
import hashlib, sys
from cachedoctor.core.prune.apply import apply
from cachedoctor.core.prune.rekey import plan_rekey
from cachedoctor.storage.location import Location

class Hasher:
    version = 2
    def recompute(self, manifest):
        return moved_key(manifest["key"])

def moved_key(key):
    module, digest = key.rsplit("-", 1)
    if digest.startswith("0000"):
        return key
    return module + "-0000" + hashlib.sha256(digest.encode()).hexdigest()[4:]

apply(plan_rekey(Location.parse(sys.argv[1]), hasher=Hasher()))
"""


def _moved_key(key: str) -> str:
    import hashlib

    module, digest = key.rsplit("-", 1)
    return module + "-0000" + hashlib.sha256(digest.encode()).hexdigest()[4:]


def test_rekey_killed_at_random_points_never_loses_an_entry(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    root = tmp_path / "rekey"
    _make_big_cache(request.getfixturevalue("evict_cache"), root, 150)
    for key in entry_keys(root):
        write_manifest(root, key)
    before = {k: (root / f"{k}-cache").read_bytes() for k in entry_keys(root)}
    rng = random.Random(11)
    argv = [sys.executable, "-c", REKEY_SCRIPT, str(root)]
    mid_run = 0
    for _ in range(3):
        moved = {k for k in before if (root / f"{_moved_key(k)}-cache").exists()}
        proc = subprocess.Popen(argv, env=cli_env())
        deadline = time.monotonic() + 60
        while proc.poll() is None and all(
            (k in moved) == (root / f"{_moved_key(k)}-cache").exists() for k in before
        ):
            assert time.monotonic() < deadline, "rekey never started moving"
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.1))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        now_moved = sum((root / f"{_moved_key(k)}-cache").exists() for k in before)
        mid_run += len(moved) < now_moved < len(before)
        assert_usable(root)
        for key, data in before.items():  # under its old key, its new key, or both
            held = [root / f"{k}-cache" for k in (key, _moved_key(key))]
            assert any(p.exists() for p in held), key
            assert all(p.read_bytes() == data for p in held if p.exists()), key
    print("rekey kills that landed mid-run:", mid_run)
    assert mid_run >= 1
    assert subprocess.run(argv, env=cli_env()).returncode == 0
    assert entry_keys(root) == {_moved_key(k) for k in before}
    assert_usable(root)
    manifests = {p.stem for p in (root / MANIFEST_DIRNAME).glob("*.json")}
    assert manifests == {_moved_key(k) for k in before}
