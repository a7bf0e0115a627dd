"""No file outside the cache is read into, written, changed or removed through a link in it.

A cache the hook wrote (stable mode with module texts, stats records, JAX's LRU -atime files,
the scan index in the cache) gets a symbolic or hard link at each of the names cachedoctor
reads or writes (``layout.py``): its folders, the files in them, its lock and temp files, the
archive ``stats --zero`` writes, JAX's -atime files and sub-caches. The links lead to copies
of real files outside the cache, so a command that followed one would find something to act
on. Every command runs, then the hook in a JAX process (stable and stats mode); the outside
folder must be as it was: each file's bytes, mode and mtime, and no name added or removed.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor.layout import (
    ATIME_SUFFIX,
    AUTOTUNE_DIR,
    CACHE_SUFFIX,
    INDEX_DIRNAME,
    INDEX_FILENAME,
    KERNEL_CACHE_FILE,
    LOCKFILE,
    MANIFEST_DIRNAME,
    MANIFEST_IR_SUFFIX,
    MANIFEST_SUFFIX,
    OWN_LOCKFILE,
    STATS_DIRNAME,
    TEMP_PREFIX,
)
from cachedoctor.programs import program_path
from tests.support.caches import EVICT, needs_filelock, snapshot
from tests.support.cli import invoke
from tests.support.hookrun import run_recorded
from tests.support.sessioncache import SharedBuilds

Plant = Callable[[Path, Path], None]
OLD = time.time() - 30 * 86400  # old enough for every age rule (temp files, manifests)


@pytest.fixture(scope="module")
def written(shared_builds: SharedBuilds) -> Path:
    """Two seed runs in stable mode (manifests with module text, records, -atime files) and
    one plain run in stats mode; then a scan, which leaves the index in the cache. Built once
    per session: each test plants its links in a copy."""
    needs_filelock()

    def make(root: Path) -> None:
        cache = root / "cache"
        cache.mkdir()
        for _ in range(2):
            run_recorded(cache, "stable", "seed", CACHEDOCTOR_RECORD_IR="1", **EVICT)
        run_recorded(cache, "stats", "plain", **EVICT)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CACHEDOCTOR_INDEX_IN_CACHE", "1")
            code, _, err = invoke("scan", str(cache))
        assert code in (0, 1), err

    root, _ = shared_builds("links-written", make)
    cache = root / "cache"
    own = {MANIFEST_DIRNAME, STATS_DIRNAME, INDEX_DIRNAME, LOCKFILE}
    assert own <= {p.name for p in cache.iterdir()}, sorted(os.listdir(cache))
    assert (cache / INDEX_DIRNAME / INDEX_FILENAME).is_file()
    return cache


def _names(folder: Path, suffix: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(suffix))


def _symlink(cache_path: Path, outside: Path, *, move: bool = True) -> None:
    """Put what ``cache_path`` holds outside (or a file of bytes) and a link in its place."""
    if cache_path.exists() and move:
        shutil.move(cache_path, outside)
    elif not outside.exists():
        outside.write_bytes(b"outside the cache\n")
    cache_path.symlink_to(outside)
    os.utime(cache_path, (OLD, OLD), follow_symlinks=False)


def _hardlink(cache_path: Path, outside: Path) -> None:
    """The file at ``cache_path`` also named ``outside``: one inode, two names."""
    os.link(cache_path, outside)


def plant_folders(cache: Path, outside: Path) -> None:
    """Each of cachedoctor's folders (and XLA's) a link to a folder outside, with the files."""
    (cache / AUTOTUNE_DIR).mkdir()
    (cache / AUTOTUNE_DIR / ("A" * 43 + ".textproto")).write_text("not parsed here\n")
    (cache / KERNEL_CACHE_FILE).write_bytes(b"\x0a\x00")
    for name in (STATS_DIRNAME, MANIFEST_DIRNAME, INDEX_DIRNAME, AUTOTUNE_DIR, KERNEL_CACHE_FILE):
        _symlink(cache / name, outside / name)


def plant_locks(cache: Path, outside: Path) -> None:
    """cachedoctor's lock file and JAX's a link each: prune and rekey must not take them."""
    _symlink(cache / LOCKFILE, outside / LOCKFILE)
    _symlink(cache / OWN_LOCKFILE, outside / OWN_LOCKFILE)


def plant_files(cache: Path, outside: Path) -> None:
    """Links at the files inside the folders, at -atime and temp files, and at every name
    ``stats --zero`` may give its archive in the next 15 minutes."""
    stats, manifests = cache / STATS_DIRNAME, cache / MANIFEST_DIRNAME
    records = _names(stats, ".json")
    _symlink(stats / records[0], outside / records[0])
    _hardlink(stats / records[1], outside / f"hard-{records[1]}")
    json_files = _names(manifests, MANIFEST_SUFFIX)
    _symlink(manifests / json_files[0], outside / json_files[0])
    _hardlink(manifests / json_files[1], outside / f"hard-{json_files[1]}")
    _symlink(manifests / _names(manifests, MANIFEST_IR_SUFFIX)[0], outside / "module.mlir.gz")
    _symlink(cache / INDEX_DIRNAME / INDEX_FILENAME, outside / INDEX_FILENAME)
    atimes = _names(cache, ATIME_SUFFIX)
    _symlink(cache / atimes[0], outside / atimes[0])
    _hardlink(cache / atimes[1], outside / f"hard-{atimes[1]}")
    entries = _names(cache, CACHE_SUFFIX)
    (cache / entries[-1]).chmod(0o666)  # prune --repair clears go-w: never through a link
    _hardlink(cache / entries[-1], outside / f"hard-{entries[-1]}")
    fake = "jit_outside-" + "0" * 64 + CACHE_SUFFIX
    _symlink(cache / fake, outside / fake, move=False)
    (outside / fake).write_bytes((cache / entries[0]).read_bytes())  # decodes: worth following
    for folder in (cache, stats, manifests):
        _symlink(folder / f"{TEMP_PREFIX}1-abcdef", outside / f"tmp-{folder.name}", move=False)
    for offset in range(15 * 60):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + offset))
        (stats / f"archive-{stamp}.jsonl").symlink_to(outside / "archive.jsonl")
    (outside / "archive.jsonl").write_bytes(b"an archive of somebody else's\n")


PRUNES = [
    ["--repair"],
    ["--orphans", "--stale-after", "1s"],
    ["--corrupt"],
    ["--duplicates"],
    ["--relocated"],
    ["--stale-jax"],
    ["--module", "jit_*", "--xla-subcaches"],
    ["--max-size", "1B"],
    ["--older-than", "0s"],
]


def _commands(cache: Path, keys: list[str]) -> list[list[str]]:
    c = str(cache)
    return [
        ["scan", c],
        ["scan", "--json", c],
        ["show", keys[0], "--dir", c],
        ["show", keys[0], "--dir", c, "--json"],
        ["diff", keys[0], keys[1], "--dir", c],
        ["lint", c],
        ["stats", c],
        ["stats", "--json", c],
        ["stats", "--zero", "--apply", c],
        ["rekey", "--apply", c],
    ]


def _planted(written: Path, root: Path, plant: Plant) -> tuple[Path, Path]:
    """A copy of the cache in ``root`` with the links planted, and the folder outside."""
    cache, outside = root / "cache", root / "outside"
    shutil.copytree(written, cache, symlinks=True)
    outside.mkdir()
    plant(cache, outside)
    assert os.listdir(outside), "nothing planted"
    return cache, outside


def _run(args: list[str]) -> str:
    code, out, err = invoke(*args)
    assert "internal-error" not in err and "Traceback" not in err, (args, err)
    assert code in (0, 1, 2), (args, code, err)
    return out + err


@pytest.mark.slow
@pytest.mark.parametrize(
    "plant", [plant_folders, plant_files, plant_locks], ids=["folders", "files", "locks"]
)
def test_nothing_outside_the_cache_changes_through_a_link(
    written: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plant: Plant
) -> None:
    """The hook, then every command on one copy; each prune selector on a copy of its own (one
    that removes every entry would leave the next nothing to act on)."""
    monkeypatch.setenv("CACHEDOCTOR_INDEX_IN_CACHE", "1")
    cache, outside = _planted(written, tmp_path / "all", plant)
    keys = [n.removesuffix(CACHE_SUFFIX) for n in _names(cache, CACHE_SUFFIX)]
    before = snapshot(outside)
    # the hook first, JAX's own LRU off: JAX itself writes -atime files by path
    for mode in ("stable", "stats"):
        run_recorded(cache, mode, "seed")
        run_recorded(cache, mode, "plain")
        assert snapshot(outside) == before, f"changed by the hook in {mode} mode"
    for args in _commands(cache, keys):
        said = _run(args)
        assert snapshot(outside) == before, f"changed after {args}:\n{said}"
    check = ["check", "--dir", str(cache), "--runs", "1", "--quiet", "--"]
    _run([*check, sys.executable, str(program_path("plain"))])
    assert snapshot(outside) == before, "changed by check"
    for n, selectors in enumerate(PRUNES):
        cache, outside = _planted(written, tmp_path / f"prune-{n}", plant)
        before = snapshot(outside)
        said = _run(["prune", str(cache), *selectors, "--apply"])
        assert snapshot(outside) == before, f"changed after prune {selectors}:\n{said}"
