"""The populations, history and oracle of the prune matrix (``tests/e2e/test_prune_matrix.py``).

One cache is written the way teams share one: every population's processes run real JAX on it,
one after another, with the cache dir spelled the same way every time (JAX hashes that string
into keys: the autotune sub-cache option). The populations:

- ``lru``: the bundled ``plain`` program with JAX's LRU on (``jax_compilation_cache_max_size``:
  ``-atime`` files, ``.lockfile``); it writes first, as JAX's eviction reads the ``-atime`` of
  every entry before a write and fails on an entry without one;
- ``plain``: the seed program (a ``custom_partitioning`` op: a pointer in ``jit_f``'s key), no
  hook; while the cache is written, plain processes also write last (``LAST_WRITERS``, on 8
  and on 4 devices), so a plain process is the latest writer of each ``jit_f`` program;
- ``stable``, ``observe``, ``stats``: the seed program under ``CACHEDOCTOR_HOOK`` in that mode
  (``stable`` adopts the plain run's entries by hard link);
- ``flag``, ``flag-observe``: the seed program with JAX's
  ``jax_remove_custom_partitioning_ptr_from_cache_key``, plain and in observe mode (the latter on
  4 CPU devices, the others on 8, so that each writes its own keys and neither reads the other's);
- ``jax083``: the seed program under a second JAX (``CACHEDOCTOR_OTHER_JAX_PYTHON``, which
  the test setup installs: otherjax.py; absent, the population is left out and its tests skip).

The history has three states, each kept for the cells (``TIMINGS``):

- ``written``: each population ran once (nothing read yet);
- ``read``: then each ran again, reading what it wrote (the first read: on a relatime mount the
  access time moves);
- ``reread``: then each ran a third time, 70 s after that first read. The 70 s are not waited:
  before the third round every file's access and modification times go back 70 s (what the
  kernel would have recorded had the first two rounds happened 70 s earlier; JAX's lookups read
  no file time), and after it the relatime rule is applied (an access time already after the
  write and under a day old does not move), which on a relatime mount is what the kernel did.

The oracle is JAX's own log (``JAX_LOG_COMPILES=1``: ``Persistent compilation cache hit for 'm'
with key 'k'``, in jax 0.8.3 and 0.10.2 alike). A *rerun* runs every population once more,
in the same order, on a copy of a state at the same path; the unpruned copy's rerun is the
baseline. A cell prunes another copy through its spelling and reruns it: each population must
hit exactly the keys it hit in the baseline, and no entry the plan removed may be one a baseline
rerun hit. A rerun's result depends only on the files' bytes at that path (JAX looks keys up by
name and reads the bytes; LRU eviction reads the ``-atime`` files' bytes), so reruns are kept by
a digest of the cache's bytes and a cell whose prune left the same bytes as another (or as the
unpruned state) reuses that rerun; ``CACHEDOCTOR_PRUNE_MATRIX_MEMO=0`` reruns every cell.

A rerun is one cache, as teams share it: when a population misses an entry the prune removed,
it writes it again, and a population later in the order may hit that copy. So a population's
test can pass while the entry it hits was removed; the cell's ``removed`` test catches that (no
entry the command removed is one an unpruned rerun hit).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock
import pytest

from cachedoctor.programs import program_path
from tests.support import otherjax, sessioncache
from tests.support.caches import OTHER_JAX_ENV, read_noatime
from tests.support.hookrun import base_env

HIT_PREFIX = "Persistent compilation cache hit for '"
MISS_PREFIX = "PERSISTENT COMPILATION CACHE MISS for '"
FLAG = {"JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY": "1"}
LRU = {"JAX_COMPILATION_CACHE_MAX_SIZE": str(10**9)}
# Under the flag, two seed programs that differ only in what the partitioner computes have one
# key (JAX's known stale-hit hazard); the flag-observe population runs on 4 devices instead of 8
# so that it writes keys of its own, which no other population reads before a plain run writes.
FOUR_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
TIMINGS = ("written", "read", "reread")
REREAD_AFTER_S = 70  # the gap between the first read and the next
OLDER_MARGIN_S = 30  # --older-than: the last round's age plus this (under the 70 s gap)
MEMO_ENV = "CACHEDOCTOR_PRUNE_MATRIX_MEMO"
DAY_NS = 24 * 3600 * 10**9


@dataclass(frozen=True)
class Population:
    name: str
    program: str  # a bundled program
    hook: str | None  # CACHEDOCTOR_HOOK, or None: no hook
    env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable


def other_jax() -> str | None:
    """The second JAX's interpreter (``tests/support/otherjax.py``), or None: turned off, or it
    could not be installed (that population's tests then skip, saying why)."""
    python = os.environ.get(OTHER_JAX_ENV)
    if python and otherjax.wait(python) is not None:
        return None
    if python and not os.path.exists(python):
        raise AssertionError(f"{OTHER_JAX_ENV}={python} does not exist")
    return python or None


def populations(other: str | None) -> list[Population]:
    """Every population, in the order a rerun runs them."""
    pops = [
        Population("lru", "plain", None, LRU),
        Population("plain", "seed", None),
        Population("stable", "seed", "stable"),
        Population("observe", "seed", "observe"),
        Population("stats", "seed", "stats"),
        Population("flag", "seed", None, FLAG),
        Population("flag-observe", "seed", "observe", {**FLAG, **FOUR_DEVICES}),
    ]
    if other:
        pops.append(Population("jax083", "seed", None, python=other))
    return pops


# The history's last writes: plain processes on each host size, after the flag populations wrote
# and before they run again (the case for --duplicates); not populations that rerun.
LAST_WRITERS = [
    Population("plain", "seed", None),
    Population("plain-4", "seed", None, FOUR_DEVICES),
]

POPULATION_NAMES = ("lru", "plain", "stable", "observe", "stats", "flag", "flag-observe", "jax083")


# --- one process, and what JAX's log says ------------------------------------------------------


def _keys_after(log: str, prefix: str) -> list[list[str]]:
    """``[module, key]`` of each line of JAX's log that starts (after the logger's own prefix)
    with ``prefix``: ``... for 'MODULE' with key 'KEY'``."""
    out = []
    for line in log.splitlines():
        at = line.find(prefix)
        if at < 0:
            continue
        module, _, rest = line[at + len(prefix) :].partition("' with key '")
        out.append([module, rest.split("'", 1)[0]])
    return out


def run_population(cache: Path, pop: Population) -> dict[str, Any]:
    """One process of ``pop`` on ``cache``: ``hits`` and ``misses`` (``[module, key]`` in
    JAX's log), ``rc``, and the log's ``tail`` when it failed."""
    extra = {**pop.env, "JAX_LOG_COMPILES": "1"}
    if pop.hook:
        extra["CACHEDOCTOR_HOOK"] = pop.hook
    env = base_env(cache, **extra)
    argv = [pop.python, str(program_path(pop.program))]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    log = proc.stderr + proc.stdout
    return {
        "hits": _keys_after(log, HIT_PREFIX),
        "misses": _keys_after(log, MISS_PREFIX),
        "rc": proc.returncode,
        "tail": "" if proc.returncode == 0 else log[-2000:],
    }


def rerun(cache: Path, pops: list[Population]) -> dict[str, dict[str, Any]]:
    """Every population once, in order, on ``cache``: what each one's JAX logged."""
    return {p.name: run_population(cache, p) for p in pops}


# --- a cache's files: copies with hard links and times, digests, times moved -----------------


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every path under ``root`` (not ``root``), parents before children, with its lstat."""
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            path = Path(dirpath, name)
            yield path, path.lstat()


def copy_tree(src: Path, dst: Path) -> None:
    """``cp -a``: files (hard links kept as links), symbolic links, modes and access and
    modification times to the nanosecond; the source's access times do not move."""
    dst.mkdir(parents=True)
    linked: dict[tuple[int, int], Path] = {}
    dirs: list[tuple[Path, os.stat_result]] = [(dst, src.lstat())]
    for path, st in _walk(src):
        target = dst / path.relative_to(src)
        if stat.S_ISDIR(st.st_mode):
            target.mkdir()
            dirs.append((target, st))
        elif stat.S_ISLNK(st.st_mode):
            target.symlink_to(os.readlink(path))
        elif (st.st_dev, st.st_ino) in linked:
            os.link(linked[st.st_dev, st.st_ino], target)
        else:
            target.write_bytes(read_noatime(path))
            os.chmod(target, stat.S_IMODE(st.st_mode))
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
            if st.st_nlink > 1:
                linked[st.st_dev, st.st_ino] = target
    for folder, st in reversed(dirs):  # children first: making one moves its parent's mtime
        os.chmod(folder, stat.S_IMODE(st.st_mode))
        os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns))


def digest(root: Path) -> str:
    """The bytes at each path under ``root`` (what a rerun's JAX can tell apart)."""
    h = hashlib.sha256()
    for path, st in _walk(root):
        rel = str(path.relative_to(root)).encode()
        if stat.S_ISLNK(st.st_mode):
            h.update(b"L" + rel + b"\0" + os.readlink(path).encode() + b"\0")
        elif stat.S_ISREG(st.st_mode):
            h.update(b"F" + rel + b"\0" + hashlib.sha256(read_noatime(path)).digest())
        else:
            h.update(b"D" + rel + b"\0")
    return h.hexdigest()[:24]


def contents(root: Path) -> dict[str, str]:
    """Each path under ``root``: a file's SHA-256, a link's target, or "folder"."""
    out = {}
    for path, st in _walk(root):
        rel = str(path.relative_to(root))
        if stat.S_ISREG(st.st_mode):
            out[rel] = hashlib.sha256(read_noatime(path)).hexdigest()
        else:
            out[rel] = os.readlink(path) if stat.S_ISLNK(st.st_mode) else "folder"
    return out


def times(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (st.st_atime_ns, st.st_mtime_ns)
        for p, st in _walk(root)
        if stat.S_ISREG(st.st_mode)
    }


def shift_times(root: Path, seconds: float) -> None:
    """Every file's and folder's access and modification times moved by ``seconds``."""
    delta = int(seconds * 1e9)
    for path, st in [*_walk(root), (root, root.lstat())]:
        if not stat.S_ISLNK(st.st_mode):
            os.utime(path, ns=(st.st_atime_ns + delta, st.st_mtime_ns + delta))


def relatime(root: Path, before: dict[str, tuple[int, int]], since_ns: int) -> int:
    """Access times as a relatime mount keeps them across a round that started at
    ``since_ns``: a file not rewritten whose access time was already after its write and less
    than a day old keeps that access time (a no-op where the kernel did so). The files set."""
    kept = 0
    for rel, (atime, mtime) in before.items():
        path = root / rel
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        unmoved = st.st_mtime_ns == mtime and atime > mtime and since_ns - atime < DAY_NS
        if unmoved and st.st_atime_ns != atime:
            os.utime(path, ns=(atime, mtime))
            kept += 1
    return kept


def entry_keys(root: Path) -> set[str]:
    return {p.name[: -len("-cache")] for p in root.glob("*-cache")}


def entry_bytes(root: Path, keys: set[str] | None = None) -> int:
    """The entries' bytes, each file counted once however many names it has (hard links)."""
    seen: dict[tuple[int, int], int] = {}
    for key in sorted(entry_keys(root) if keys is None else keys):
        try:
            st = (root / f"{key}-cache").stat()
        except FileNotFoundError:
            continue
        seen[st.st_dev, st.st_ino] = st.st_size
    return sum(seen.values())


# --- the history, built once per session --------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """What the build left beside the kept states (``<folder>/<timing>``)."""

    populations: tuple[str, ...]
    round_start: dict[str, float]  # timing -> when its last round started (time.time())
    baseline: dict[str, dict[str, dict[str, Any]]]  # timing -> population -> rerun outcome
    fit: dict[str, int]  # timing -> the entries' bytes, each file once
    recent: dict[str, int]  # timing -> bytes of the entries its last round hit or wrote
    digests: dict[str, str]  # timing -> digest of the state as kept


def _round(live: Path, pops: list[Population]) -> tuple[float, dict[str, dict[str, Any]]]:
    start = time.time()
    outcomes = rerun(live, pops)
    failed = {n: o["tail"] for n, o in outcomes.items() if o["rc"]}
    assert not failed, f"a population failed while the matrix cache was built: {failed}"
    return start, outcomes


def _recent_bytes(live: Path, outcomes: dict[str, dict[str, Any]]) -> int:
    keys = {k for o in outcomes.values() for _m, k in o["hits"] + o["misses"]}
    return entry_bytes(live, keys & entry_keys(live))


def build(folder: Path, live: Path, pops: list[Population]) -> Built:
    """Write the history at ``live`` (the one spelling every run uses) and keep each state in
    ``folder``; the caller holds the lock of ``live``."""
    shutil.rmtree(live, ignore_errors=True)
    live.mkdir(parents=True)
    start = time.time()
    writes = [*pops, *LAST_WRITERS]
    failed = [(p.name, o["tail"]) for p in writes if (o := run_population(live, p))["rc"]]
    assert not failed, f"a population failed while the matrix cache was written: {failed}"
    round_start, baseline, fit, recent, digests = {"written": start}, {}, {}, {}, {}
    recent["written"] = entry_bytes(live)
    for timing, after in (("written", "read"), ("read", "reread")):
        copy_tree(live, folder / timing)
        digests[timing] = digest(live)
        fit[timing] = entry_bytes(live)
        if after == "reread":
            shift_times(live, -REREAD_AFTER_S)
        before = times(live)
        round_start[after], baseline[timing] = _round(live, pops)
        relatime(live, before, int(round_start[after] * 1e9))
        recent[after] = _recent_bytes(live, baseline[timing])
    copy_tree(live, folder / "reread")
    digests["reread"], fit["reread"] = digest(live), entry_bytes(live)
    shutil.rmtree(live)
    copy_tree(folder / "reread", live)
    _, baseline["reread"] = _round(live, pops)
    shutil.rmtree(live)
    return Built(tuple(p.name for p in pops), round_start, baseline, fit, recent, digests)


# --- one cell ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spelling:
    """How the user names the cache: ``arg`` typed in ``cwd`` (None: wherever)."""

    arg: str
    cwd: Path | None


def spellings(live: Path) -> dict[str, Spelling]:
    """The live cache's spellings; the link (beside its parent) is made here."""
    link = live.parent.parent / "link-to-cache"
    if not link.is_symlink():
        link.symlink_to(live)
    return {
        "abs": Spelling(str(live), None),
        "rel": Spelling(live.name, live.parent),
        "link": Spelling(str(link), None),
        "slash": Spelling(str(live) + "/", None),
    }


def older_than(built: Built, timing: str) -> str:
    """A duration that keeps what the state's last round used and not the round before."""
    age = time.time() - built.round_start[timing]
    return f"{math.ceil(age) + OLDER_MARGIN_S}s"


def values(built: Built, timing: str) -> dict[str, str]:
    """The values of the valued selectors, for a prune run now on the state ``timing``."""
    return {
        "AGE": older_than(built, timing),
        "FIT": str(built.fit[timing]),
        "RECENT": str(built.recent[timing]),
    }


def memo_enabled() -> bool:
    return os.environ.get(MEMO_ENV, "1") != "0"


class Memo:
    """Reruns by the digest of the cache they ran on, for the whole session (every worker)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> dict[str, dict[str, Any]] | None:
        path = self.root / f"{key}.json"
        if not memo_enabled() or not path.exists():
            return None
        value: dict[str, dict[str, Any]] = json.loads(path.read_text())
        return value

    def put(self, key: str, value: dict[str, dict[str, Any]]) -> None:
        tmp = self.root / f".{key}.{os.getpid()}"
        tmp.write_text(json.dumps(value))
        os.replace(tmp, self.root / f"{key}.json")


def lock(path: Path) -> filelock.FileLock:
    return filelock.FileLock(str(path) + ".lock")


Matrix = tuple[Path, Path, Path, Built]  # session folder, kept states, live path, the build


def open_matrix(
    factory: pytest.TempPathFactory, shared_builds: sessioncache.SharedBuilds
) -> Matrix:
    """The session's history, built once for every test module and worker that asks
    (``shared_builds``), with each unpruned state's rerun in the memo as its baseline."""
    root = sessioncache.session_root(factory) / "prune-matrix"
    live = root / "live" / "cache"
    live.parent.mkdir(parents=True, exist_ok=True)
    other = other_jax()

    def make(folder: Path) -> Built:
        with lock(live):
            return build(folder, live, populations(other))

    kept, built = shared_builds("prune-matrix", make, other)
    memo = Memo(root / "memo")
    for timing, key in built.digests.items():  # an unpruned state reruns as its baseline did
        if memo.get(key) is None:
            memo.put(key, built.baseline[timing])
    return root, kept, live, built


@contextmanager
def state_at_live(kept: Path, live: Path, timing: str) -> Iterator[Path]:
    """A copy of the state ``timing`` at the path every run uses, under its lock; gone after."""
    with lock(live):
        shutil.rmtree(live, ignore_errors=True)
        copy_tree(kept / timing, live)
        try:
            yield live
        finally:
            shutil.rmtree(live, ignore_errors=True)


def once(root: Path, name: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()`` run once per session (every worker) for ``name``, kept as JSON: the tests
    that read one command's outcome share it."""
    path = root / "cells" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with lock(path):
        if path.exists():
            done: dict[str, Any] = json.loads(path.read_text())
            return done
        result = compute()
        path.write_text(json.dumps(result))
        return result


# --- the cells ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One command (``AGE``, ``FIT``, ``RECENT`` stand for :func:`values`) on one spelling of
    one state."""

    selector: str  # its id: "duplicates", "older-than+duplicates", "duplicates+module"
    command: tuple[str, ...]  # ("prune", "--duplicates") or ("rekey", "--relocated")
    spelling: str
    timing: str

    @property
    def id(self) -> str:
        return f"{self.selector}-{self.spelling}-{self.timing}"


def apply_cell(cell: Cell, kept: Path, live: Path, built: Built) -> dict[str, Any]:
    """Copy the state to ``live``, run the cell's command with ``--apply --json`` through its
    spelling (in this process, as the console script runs it); what it removed and did. The
    caller holds the lock of ``live`` and leaves the pruned cache there."""
    from tests.support.cli import invoke

    shutil.rmtree(live, ignore_errors=True)
    copy_tree(kept / cell.timing, live)
    before = entry_keys(live)
    spelled = spellings(live)[cell.spelling]
    given = values(built, cell.timing)
    args = [cell.command[0], spelled.arg, *(given.get(a, a) for a in cell.command[1:])]
    args += ["--apply", "--json"]
    here = os.getcwd()
    try:
        if spelled.cwd is not None:
            os.chdir(spelled.cwd)
        code, out, err = invoke(*args)
    finally:
        os.chdir(here)
    try:
        actions = json.loads(out).get("actions", [])
    except json.JSONDecodeError:
        actions = []
    return {
        "argv": ["cachedoctor", *args],
        "cwd": str(spelled.cwd) if spelled.cwd else None,
        "code": code,
        "err": err[-2000:],
        "removed": sorted(before - entry_keys(live)),
        "actions": [
            {k: a.get(k) for k in ("op", "name", "rule", "status", "reason")} for a in actions
        ],
    }


def run_cell(cell: Cell, kept: Path, live: Path, built: Built, memo: Memo) -> dict[str, Any]:
    """The cell applied, and every population's rerun on what it left (from the memo when
    the same bytes were rerun before)."""
    with lock(live):
        try:
            result = apply_cell(cell, kept, live, built)
            result["digest"] = key = digest(live)
            reruns = memo.get(key)
            result["memo"] = reruns is not None
            if reruns is None:
                pops = [p for p in populations(other_jax()) if p.name in built.populations]
                reruns = rerun(live, pops)
                memo.put(key, reruns)
            result["reruns"] = reruns
        finally:
            shutil.rmtree(live, ignore_errors=True)
    return result


def cell_result(cell: Cell, root: Path, kept: Path, live: Path, built: Built) -> dict[str, Any]:
    """The cell's result, computed once per session (every population's test reads it)."""
    return once(root, cell.id, lambda: run_cell(cell, kept, live, built, Memo(root / "memo")))


def hit_keys(outcome: dict[str, Any]) -> list[str]:
    return sorted(k for _m, k in outcome["hits"])
