"""Issue 29's capstone: one cache that every kind of process teams mix has written, pruned.

Five populations write one local cache, each with real JAX in its own processes:

- ``lru``: the bundled ``plain`` program with JAX's LRU on, its size limit low enough that
  JAX evicts the entries of an earlier run of other shapes (``-atime`` files, ``.lockfile``);
- ``hooked``: the seed program (a ``custom_partitioning`` op) with cachedoctor's hook in
  stable mode (key manifests);
- ``plain``: the seed program, plain JAX (its ``jit_f`` key holds a pointer: a miss each run);
- ``flag``: the seed program with ``JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY=1``;
- ``callbacks``: a program whose host-callback modules JAX never writes, beside two it does,
  with the hook (its manifests of the keys JAX refused are what ``--orphans`` finds).

The LRU population writes first: with eviction on, JAX reads the ``-atime`` of every entry
before a write and fails on an entry without one, which every other population leaves.

JAX's own log is the oracle (``JAX_EXPLAIN_CACHE_MISSES``: ``PERSISTENT COMPILATION CACHE MISS
for 'm'``; ``JAX_LOG_COMPILES``: ``Persistent compilation cache hit for 'm'``). A rerun of each
population before any prune says which modules it hits; after each ``prune`` selector with
``--apply``, on a copy of the cache with the times JAX left (usage evidence), each population
runs again and must hit every one of them (a prune that changed nothing, byte for byte and
time for time, leaves the cache the baseline reran: no rerun). Every process records stats (the
hook records; the others run ``CACHEDOCTOR_HOOK=stats``, which changes no key), and ``stats
--json`` must count, module by module, what JAX's log lines of those processes say.

JAX hashes the cache dir's spelling into keys (the autotune sub-cache option), so every run
uses one spelling, ``<session>/mixed-live/cache``, under a lock: the cache is built there, kept
elsewhere, and copied back there for each check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import filelock
import pytest

from cachedoctor.layout import MANIFEST_DIRNAME
from cachedoctor.programs import program_path
from tests.support import sessioncache
from tests.support.caches import needs_filelock, snapshot
from tests.support.cli import invoke
from tests.support.hookrun import MISS_RE, base_env

pytestmark = pytest.mark.slow

HIT_RE = re.compile(r"Persistent compilation cache hit for '([^']+)'")
CALLBACKS = Path(__file__).resolve().parents[1] / "support" / "callbacks_program.py"
FLAG = {"JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY": "1"}


@dataclass(frozen=True)
class Population:
    name: str
    program: Path
    hook: str  # CACHEDOCTOR_HOOK: stable (the hook), stats (plain JAX, recording)
    env: dict[str, str] = field(default_factory=dict)


def populations(max_size: int) -> list[Population]:
    """In the order they run, each twice while the cache is built (the second run hits)."""
    seed = program_path("seed")
    lru = {"JAX_COMPILATION_CACHE_MAX_SIZE": str(max_size), "CACHEDOCTOR_PLAIN_SIZE": "32"}
    return [
        Population("lru", program_path("plain"), "stats", lru),
        Population("hooked", seed, "stable"),
        Population("plain", seed, "stats"),
        Population("flag", seed, "stats", FLAG),
        Population("callbacks", CALLBACKS, "stable"),
    ]


@dataclass(frozen=True)
class Outcome:
    """What JAX's log of one run says: the modules that hit and those that missed."""

    hits: tuple[str, ...]
    misses: tuple[str, ...]

    @classmethod
    def of(cls, log: str) -> Outcome:
        return cls(tuple(HIT_RE.findall(log)), tuple(MISS_RE.findall(log)))


def run(cache: Path, program: Path, hook: str, **extra: str) -> str:
    """One JAX process on ``cache`` with start-up activation in ``hook`` mode: JAX's log."""
    env = base_env(cache, CACHEDOCTOR_HOOK=hook, JAX_LOG_COMPILES="1", **extra)
    proc = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr + proc.stdout


def rerun_all(cache: Path, pops: list[Population]) -> dict[str, Outcome]:
    return {p.name: Outcome.of(run(cache, p.program, p.hook, **p.env)) for p in pops}


@dataclass(frozen=True)
class Built:
    max_size: int  # the LRU population's JAX_COMPILATION_CACHE_MAX_SIZE
    evicted: tuple[str, ...]  # what JAX's LRU evicted while the cache was built
    logged: dict[str, tuple[int, int, int]]  # module -> requests, hits, misses in JAX's logs
    baseline: dict[str, Outcome]  # each population's rerun before any prune


def cache_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.glob("*-cache"))


def build(live: Path) -> tuple[int, tuple[str, ...], list[str]]:
    """Write the mixed cache at ``live``: the size limit, what JAX evicted, every run's log."""
    logs = [run(live, program_path("plain"), "stats", JAX_COMPILATION_CACHE_MAX_SIZE="1000000000")]
    first = {p.name for p in live.glob("*-cache")}
    max_size = cache_bytes(live) * 3 // 2  # the next shapes' entries do not fit beside these
    evicted: tuple[str, ...] = ()
    for pop in populations(max_size):
        logs += [run(live, pop.program, pop.hook, **pop.env) for _ in range(2)]
        assert Outcome.of(logs[-1]).hits, f"{pop.name}: its second run hit nothing"
        if pop.name == "lru":
            evicted = tuple(sorted(first - {p.name for p in live.glob("*-cache")}))
            assert evicted, "JAX's LRU evicted nothing"
    return max_size, evicted, logs


def logged_counts(logs: list[str]) -> dict[str, tuple[int, int, int]]:
    hits = Counter(m for log in logs for m in HIT_RE.findall(log))
    misses = Counter(m for log in logs for m in MISS_RE.findall(log))
    return {m: (hits[m] + misses[m], hits[m], misses[m]) for m in sorted(hits | misses)}


@pytest.fixture(scope="module")
def mixed(
    tmp_path_factory: pytest.TempPathFactory, shared_builds: sessioncache.SharedBuilds
) -> Iterator[tuple[Path, Path, filelock.FileLock, Built]]:
    """(the cache as built, the spelling every run uses, its lock, what the build saw)."""
    needs_filelock()
    root = sessioncache.session_root(tmp_path_factory)
    live = root / "mixed-live" / "cache"
    live.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(live.parent) + ".lock")

    def make(folder: Path) -> Built:
        kept = folder / "cache"
        with lock:
            shutil.rmtree(live, ignore_errors=True)
            live.mkdir()
            max_size, evicted, logs = build(live)
            os.rename(live, kept)  # a rename moves no file time
            sessioncache.record_times(kept)
            sessioncache.copy_as_written(kept, live)
            baseline = rerun_all(live, populations(max_size))
            shutil.rmtree(live)
        return Built(max_size, evicted, logged_counts(logs), baseline)

    folder, built = shared_builds("mixed-population", make)
    yield folder / "cache", live, lock, built


def test_every_population_hits_before_any_prune(mixed: tuple[Path, Path, object, Built]) -> None:
    """The premise: each population's rerun hits something, in the way that population hits."""
    _kept, _live, _lock, built = mixed
    hits = {name: set(o.hits) for name, o in built.baseline.items()}
    assert {"jit_g", "jit_iota", "jit__reduce_sum"} <= hits["lru"]
    assert "jit_f" in hits["hooked"] and "jit_f" in hits["flag"]  # their keys hold no pointer
    assert "jit_f" in built.baseline["plain"].misses  # a new pointer key each plain run
    assert hits["plain"] >= {"jit_iota", "jit__multi_slice"}
    assert hits["callbacks"] == {"jit_plain", "jit_other"}
    assert set(built.baseline["callbacks"].misses) == {"jit_printing", "jit_pure", "jit_io"}


SELECTORS: list[tuple[str, ...]] = [
    ("--duplicates",),
    ("--corrupt",),
    ("--orphans",),
    ("--orphans", "--stale-after", "0s"),
    ("--relocated",),
    ("--stale-jax",),
    ("--older-than", "1d"),
    ("--max-size", "BUDGET"),
    ("--repair",),
]


@pytest.mark.parametrize("selector", SELECTORS, ids=lambda s: " ".join(s))
def test_after_prune_every_population_hits_again(
    mixed: tuple[Path, Path, filelock.FileLock, Built], selector: tuple[str, ...]
) -> None:
    kept, live, lock, built = mixed
    args = [str(cache_bytes(kept) * 2) if a == "BUDGET" else a for a in selector]
    with lock:
        shutil.rmtree(live, ignore_errors=True)
        sessioncache.copy_as_written(kept, live)
        try:
            before = snapshot(live)
            code, out, err = invoke("prune", str(live), *args, "--apply", "--json")
            assert code == 0, err
            done = [a for a in json.loads(out)["actions"] if a.get("status") == "done"]
            changed = snapshot(live) != before
            assert bool(done) == changed, (done, changed)
            # Nothing changed: the cache is, byte for byte and time for time, the one the
            # baseline reran; else every population runs again on what prune left.
            after = rerun_all(live, populations(built.max_size)) if changed else built.baseline
        finally:
            shutil.rmtree(live, ignore_errors=True)
    print(f"\n{' '.join(selector)}: {len(done)} actions done")
    for name, was in built.baseline.items():
        print(f"  {name:10} hits before {sorted(was.hits)}  after {sorted(after[name].hits)}")
    lost = {
        name: sorted(set(was.hits) - set(after[name].hits))
        for name, was in built.baseline.items()
        if set(was.hits) - set(after[name].hits)
    }
    assert not lost, f"prune {' '.join(selector)} --apply removed what runs hit: {lost}"


def test_stats_count_what_jax_logged(
    mixed: tuple[Path, Path, object, Built], copy_of: Callable[[Path], Path]
) -> None:
    kept, _live, _lock, built = mixed
    code, out, err = invoke("stats", str(copy_of(kept)), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["processes"] == 11  # the LRU warm-up, then each population twice
    counted = {
        m["module"]: (m["requests"], m["hits"], m["misses"])
        for m in report["modules"]
        if m["requests"]
    }
    assert counted == built.logged


def test_scan_names_the_keys_runs_look_up(
    mixed: tuple[Path, Path, object, Built], copy_of: Callable[[Path], Path]
) -> None:
    """scan's unstable-key finding says what the manifests show (issue 29 item 1): not "every
    run recompiles" over a group whose stable key hooked runs hit; and prune --duplicates
    removes none of the keys the finding counts as looked up."""
    kept, _live, _lock, _built = mixed
    cache = copy_of(kept)
    code, out, err = invoke("scan", str(cache), "--json")
    assert code in (0, 1), err
    (finding,) = [f for f in json.loads(out)["findings"] if f["kind"] == "unstable-key"]
    assert finding["module"] == "jit_f"
    assert "every run recompiles" not in finding["advice"]
    assert finding["advice"].startswith("hooked runs hit their stable key")
    assert "1 under a stable-key manifest" in finding["evidence"]
    assert f"{len(finding['entries']) - 1} without a manifest" in finding["evidence"]
    manifests = [json.loads(p.read_text()) for p in (cache / MANIFEST_DIRNAME).glob("*.json")]
    stable = {m["key"] for m in manifests if m.get("mode") == "stable"}
    code, out, err = invoke("prune", str(cache), "--duplicates", "--json")
    assert code == 0, err
    removed = {a["name"] for a in json.loads(out)["actions"]}
    assert removed and removed < set(finding["entries"]) and not removed & stable
