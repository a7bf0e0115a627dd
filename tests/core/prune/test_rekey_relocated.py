"""`rekey --relocated` on real JAX: entries copied from another cache path, adopted offline.

JAX's own key hashes the cache's absolute path (the autotune sub-cache option), so a copied plain
entry is never hit at its new path. An observe-mode manifest records the stable key's components,
which hash paths relative to the cache: moving the entry to that key makes the hook hit it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.storage.location import Location
from tests.support.hookrun import base_env, entries, run_program

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess


def _relocated(cache: Path) -> list[str]:
    report = scan_directory(Location.parse(cache), use_index=False, workers=1)
    return [k for f in report.findings if f.kind is FindingKind.RELOCATED for k in f.entries]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cachedoctor", *args],
        capture_output=True,
        text=True,
        env=base_env(None),
        timeout=300,
    )


def test_rekey_relocated_makes_jax_hit_the_copied_cache(tmp_path: Path) -> None:
    first, moved = tmp_path / "first", tmp_path / "moved"
    observed = run_program("plain", first, mode="observe")
    assert observed.misses  # compiled and stored under JAX's own keys
    shutil.copytree(first, moved)
    plain_keys = entries(moved)
    assert sorted(_relocated(moved)) == plain_keys

    dry = _cli("rekey", str(moved), "--relocated")
    assert dry.returncode == 0, dry.stderr
    assert entries(moved) == plain_keys  # a dry run changes nothing
    assert _cli("rekey", str(moved)).returncode == 0 and entries(moved) == plain_keys

    done = _cli("rekey", str(moved), "--relocated", "--apply")
    assert done.returncode == 0, done.stdout + done.stderr
    adopted = entries(moved)
    assert len(adopted) == len(plain_keys) and not set(adopted) & set(plain_keys)
    assert _relocated(moved) == []  # now under the stable hasher: not evidence of a move

    run = run_program("plain", moved, mode="stable")
    assert run.misses == []  # JAX loaded every adopted entry: nothing recompiled
    assert run.result == observed.result
    assert entries(moved) == adopted


def test_rekey_relocated_through_another_spelling_moves_nothing_the_jobs_hit(
    tmp_path: Path,
) -> None:
    """Issue 39, case 3: the observe jobs spell the cache absolutely and hit it; `rekey r
    --relocated` typed from the parent judged every entry relocated for *its* spelling and moved
    them to stable keys, so the observe jobs missed. Another spelling of this folder, and an
    entry read since its write, stay; the jobs hit as before."""
    cache = tmp_path / "r"
    assert run_program("plain", cache, mode="observe").misses
    assert run_program("plain", cache, mode="observe").misses == []  # the jobs hit
    keys = entries(cache)
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "rekey", "r", "--relocated", "--apply", "--json"],
        capture_output=True,
        text=True,
        env=base_env(None),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert entries(cache) == keys
    skipped = json.loads(proc.stdout)["skipped"]
    kept = {s["name"]: s["reason"] for s in skipped if s["rule"] == "relocated"}
    assert set(kept) == set(keys)
    assert all("a run that spells the cache so looks it up" in why for why in kept.values())
    assert run_program("plain", cache, mode="observe").misses == []
