"""Advice works when followed (issue 54, "Predictions/advice"): each command a finding or a
forecast tells the user to run is run here, as written, on a cache real JAX wrote, and JAX's own
log says whether it did what the advice says.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

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


def plain(cache: Path, size: str, mode: str) -> Run:
    """One run of the plain program at ``size`` with the hook in ``mode`` (none: no hook)."""
    return run_program("plain", cache, mode=mode, env=base_env(cache, CACHEDOCTOR_PLAIN_SIZE=size))


def test_no_rekey_advice_for_entries_it_cannot_rekey(tmp_path: Path) -> None:
    """Entries of a plain JAX run, copied: no manifest records their key's components, so
    `rekey --relocated` moves none of them; the advice does not offer it (it did)."""
    first, moved = tmp_path / "first", tmp_path / "moved"
    plain(first, "16", "none")
    shutil.copytree(first, moved)
    keys = entries(moved)
    found = relocated(moved)
    assert sorted(found.entries) == keys
    assert [c for c in COMMAND.findall(found.advice) if c.split()[1] == "rekey"] == []
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
    assert plain(first, "16", "observe").misses  # compiled, stored, a manifest each
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
    done = follow(found.advice, "rekey", moved)
    assert done.returncode == 0, done.stdout + done.stderr
    after = set(entries(moved))
    assert after & keys == unrecorded  # what it moved: exactly the observe-mode entries
    assert len(after - keys) == len(observed)
    assert plain(moved, "16", "stable").misses == []  # JAX hits every moved entry
