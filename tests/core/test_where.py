"""A command that removes or moves files works only on a folder shown to be a JAX cache by what
it holds, never by a name one stray file can carry (``core/where.proof_of_cache``)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from cachedoctor.cache.listdir import list_cache
from cachedoctor.core.where import proof_of_cache
from cachedoctor.layout import ATIME_SUFFIX, CACHE_SUFFIX, MANIFEST_DIRNAME, STATS_DIRNAME
from cachedoctor.stablekeys.stats import RECORD_FORMAT
from tests.support.cli import invoke

KEY = "jit_f-" + "a" * 64


def _home(tmp_path: Path) -> Path:
    """A home folder with one file named like an entry (a download, a backup...)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export PATH=$HOME/bin:$PATH\n")
    (home / f"{KEY}{CACHE_SUFFIX}").write_bytes(b"my notes, named oddly\n" * 50)
    return home


@pytest.mark.parametrize(
    "args",
    [
        ["prune", "--older-than", "0s", "--apply"],
        ["prune", "--corrupt", "--apply"],
        ["prune", "--max-size", "1B", "--apply"],
        ["rekey", "--apply"],
        ["stats", "--zero", "--apply"],
    ],
)
def test_a_command_that_removes_refuses_a_folder_with_one_file_named_like_an_entry(
    tmp_path: Path, args: list[str]
) -> None:
    home = _home(tmp_path)
    before = sorted(p.name for p in home.iterdir())
    code, out, err = invoke(*args[:1], str(home), *args[1:])
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("cachedoctor: not-a-cache: ") and err.count("\n") == 1, err
    assert f"{' '.join(args[:1])}" in err and "changes only a JAX cache" in err, err
    assert sorted(p.name for p in home.iterdir()) == before
    assert (home / f"{KEY}{CACHE_SUFFIX}").read_bytes().startswith(b"my notes")


def test_a_dry_run_still_shows_what_it_would_do(tmp_path: Path) -> None:
    code, out, _ = invoke("prune", str(_home(tmp_path)), "--corrupt")
    assert code == 0 and "dry run" in out, out


def test_what_counts_as_proof(tmp_path: Path) -> None:
    home = _home(tmp_path)
    assert proof_of_cache(list_cache(home)) is None
    (home / f"{KEY}{ATIME_SUFFIX}").write_bytes(b"\x00" * 7)  # not what JAX's LRU writes
    assert proof_of_cache(list_cache(home)) is None
    (home / f"{KEY}{ATIME_SUFFIX}").write_bytes(b"\x00" * 8)
    assert proof_of_cache(list_cache(home)) == f"{KEY}{CACHE_SUFFIX} and its -atime file"
    (home / f"{KEY}{CACHE_SUFFIX}").unlink()  # the -atime an interrupted removal left
    assert proof_of_cache(list_cache(home)) is None  # zero is no time JAX writes
    (home / f"{KEY}{ATIME_SUFFIX}").write_bytes((time.time_ns() + 10**9).to_bytes(8, "little"))
    assert proof_of_cache(list_cache(home)) == f"{KEY}{ATIME_SUFFIX}, a time JAX's LRU wrote"
    (home / f"{KEY}{ATIME_SUFFIX}").write_bytes((time.time_ns() * 2).to_bytes(8, "little"))
    assert proof_of_cache(list_cache(home)) is None
    (home / f"{KEY}{ATIME_SUFFIX}").unlink()
    (home / STATS_DIRNAME).mkdir()
    (home / STATS_DIRNAME / "note.json").write_text(json.dumps({"format": "other"}))
    assert proof_of_cache(list_cache(home)) is None
    (home / STATS_DIRNAME / "r.json").write_text(json.dumps({"format": RECORD_FORMAT}))
    assert proof_of_cache(list_cache(home)) == f"{STATS_DIRNAME}/r.json"


@pytest.mark.slow
def test_a_cache_jax_wrote_is_proven_by_its_entries(seed_cache: Path, tmp_path: Path) -> None:
    """JAX's own entries, without their -atime files or any record: they decode."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in seed_cache.glob(f"*{CACHE_SUFFIX}"):
        shutil.copy2(entry, cache / entry.name)
    proof = proof_of_cache(list_cache(cache))
    assert proof is not None and proof.endswith("decodes as a JAX cache entry"), proof
    (cache / ".bashrc").write_text("a stray file beside them changes nothing\n")
    assert proof_of_cache(list_cache(cache)) == proof


def test_what_a_finished_prune_leaves_has_nothing_to_prove(tmp_path: Path) -> None:
    """JAX's and cachedoctor's lock files and an emptied folder of its own: nothing to change."""
    cache = tmp_path / "cache"
    (cache / MANIFEST_DIRNAME).mkdir(parents=True)
    (cache / ".lockfile").touch()
    (cache / ".cachedoctor-lock").touch()
    code, out, err = invoke("prune", str(cache), "--older-than", "0s", "--apply")
    assert code == 0 and "nothing to do" in out, (code, out, err)
    (cache / MANIFEST_DIRNAME / "notes.txt").write_text("not a manifest\n")
    code, out, err = invoke("prune", str(cache), "--older-than", "0s", "--apply")
    assert code == 2 and err.startswith("cachedoctor: not-a-cache: "), (code, out, err)
