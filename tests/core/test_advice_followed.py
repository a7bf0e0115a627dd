"""Advice works when followed (issue 54, "Predictions/advice"): each command a finding or a
forecast tells the user to run is run here, as written, on a cache real JAX wrote, and JAX's own
log says whether it did what the advice says.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.core.findings import Finding, FindingKind
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_SUFFIX
from cachedoctor.storage.location import Location
from tests.support.hookrun import Run, base_env, entries, run_program

pytestmark = pytest.mark.slow  # JAX and the CLI in subprocesses

COMMAND = re.compile(r"`(cachedoctor [^`]+)`")


def relocated(cache: Path) -> Finding:
    report = scan_directory(Location.parse(cache), use_index=False, workers=1)
    (found,) = [f for f in report.findings if f.kind is FindingKind.RELOCATED]
    return found


def follow(advice: str, verb: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """The advice's one command that starts ``cachedoctor VERB``, run as written (no DIR: the
    cache is ``$JAX_COMPILATION_CACHE_DIR``, as in the shell the user runs JAX from)."""
    (command,) = [c for c in COMMAND.findall(advice) if c.split()[1] == verb]
    argv = shlex.split(command)
    return subprocess.run(
        [sys.executable, "-m", "cachedoctor", *argv[1:]],
        capture_output=True,
        text=True,
        env=base_env(cache),
        timeout=300,
        check=False,
    )


def plain(cache: Path, size: str, mode: str, **env: str) -> Run:
    """One run of the plain program at ``size`` with the hook in ``mode`` (none: no hook)."""
    env = base_env(cache, CACHEDOCTOR_PLAIN_SIZE=size, **env)
    return run_program("plain", cache, mode=mode, env=env)


def forecasts(cache: Path) -> dict[str, dict[str, Any]]:
    """`cachedoctor preflight CACHE --json`, run where the jobs spell the cache so: by key."""
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", "preflight", str(cache), "--json"],
        capture_output=True,
        text=True,
        env=base_env(cache),
        timeout=300,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return {e["key"]: e for e in json.loads(proc.stdout)["entries"]}


def rekey_commands(words: str) -> list[str]:
    return [c for c in COMMAND.findall(words) if c.split()[1] == "rekey"]


def test_no_rekey_advice_for_entries_it_cannot_rekey(tmp_path: Path) -> None:
    """Entries of a JAX run that recorded stats but wrote no key manifest, copied: nothing
    records what `rekey --relocated` needs, so it moves none of them; neither scan's advice nor
    preflight's forecast offers it (both did)."""
    first, moved = tmp_path / "first", tmp_path / "moved"
    plain(first, "16", "none", CACHEDOCTOR_HOOK="stats")
    shutil.copytree(first, moved)
    keys = entries(moved)
    found = relocated(moved)
    assert sorted(found.entries) == keys
    assert rekey_commands(found.advice) == []
    said = forecasts(moved)
    assert {said[k]["verdict"] for k in keys} == {"miss"}  # the spelling: a recorded key
    assert all("spelled" in said[k]["words"] for k in keys)
    assert [k for k in keys if rekey_commands(said[k]["words"])] == []
    # the command the old advice gave, run anyway: it re-keys nothing
    done = follow("`cachedoctor rekey --relocated --apply`", "rekey", moved)
    assert done.returncode == 0, done.stderr
    assert entries(moved) == keys


def test_rekey_advice_names_the_entries_it_moves_and_jax_hits_them(tmp_path: Path) -> None:
    """One program recorded in observe mode (a manifest per key), another plain; copied. The
    advice offers `rekey --relocated` for the observe-mode entries and says how many; followed,
    it moves exactly those, and the stable hook's run of that program hits every one of them
    (JAX's log: no miss)."""
    first, moved = tmp_path / "first", tmp_path / "moved"
    # compiled and stored, a manifest each, and the processes' stats records (observe mode
    # records them when the hook starts with the process)
    assert plain(first, "16", "none", CACHEDOCTOR_HOOK="observe").misses
    observed = {p.name[: -len(MANIFEST_SUFFIX)] for p in (first / MANIFEST_DIRNAME).iterdir()}
    observed &= set(entries(first))
    assert observed
    plain(first, "24", "none")  # no manifests: their key needs the module
    shutil.copytree(first, moved)
    keys = set(entries(moved))
    unrecorded = keys - observed
    assert unrecorded

    found = relocated(moved)
    assert set(found.entries) == keys
    assert f"the {len(observed)} with an observe-mode manifest" in found.advice, found.advice
    said = forecasts(moved)
    offered = {k for k in keys if rekey_commands(said[k]["words"])}
    assert offered == observed, said  # preflight offers it for exactly those
    done = follow(found.advice, "rekey", moved)
    assert done.returncode == 0, done.stdout + done.stderr
    after = set(entries(moved))
    assert after & keys == unrecorded  # what it moved: exactly the observe-mode entries
    assert len(after - keys) == len(observed)
    assert plain(moved, "16", "stable").misses == []  # JAX hits every moved entry
