"""The loss matrix beyond ``prune`` (issue 54): ``unpack``, ``stats --zero`` and the read-only
inspectors, on the prune matrix's history (``tests/support/prunematrix.py``: every population
teams mix wrote one cache with real JAX; its states ``written``, ``read``, ``reread``, and each
population's baseline rerun). JAX is the oracle, as in ``test_prune_matrix.py``:

- ``unpack --apply`` of the ``read`` state's bundle into a target where JAX's LRU runs
  (``jax_compilation_cache_max_size``: ``-atime`` files and a ``.lockfile``) and into a plain
  one (which already holds one bundled entry, cut short): the target's own population then
  compiles something new and JAX must store it (JAX's eviction read an ``-atime`` file for
  every entry, and an unpacked entry without one failed every later put), and the population
  the unpack was judged for must hit every entry the report said will hit;
- ``stats --zero --apply``: ``why`` and ``preflight`` say what they said before it (the zero
  archived the records they read), and nothing JAX reads changed;
- each inspector under ``CACHEDOCTOR_READ_ONLY`` leaves the cache's bytes, names and times as
  they were, and writes no ``cachedoctor-index/`` into it (so every population's rerun is the
  baseline's: a rerun depends only on the bytes at the path).

The CLI under test is the one this process imports, in subprocesses too (``cli_env``): pointing
``PYTHONPATH`` at an older tree runs these cells against it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

import cachedoctor
from tests.support import prunematrix as pm
from tests.support import sessioncache
from tests.support.caches import read_noatime
from tests.support.cli import invoke, run_cli
from tests.support.hookrun import base_env

pytestmark = pytest.mark.slow

Matrix = pm.Matrix
EIGHT = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}  # as the programs set it


@pytest.fixture(scope="session")
def matrix(
    tmp_path_factory: pytest.TempPathFactory, shared_builds: sessioncache.SharedBuilds
) -> Matrix:
    return pm.open_matrix(tmp_path_factory, shared_builds)


def cli_env(cache: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: the programs' own (``base_env``), with the
    cachedoctor this process imported first on the path."""
    env = base_env(cache, **extra)
    env["PYTHONPATH"] = str(Path(cachedoctor.__file__).parents[1]) + os.pathsep + env["PYTHONPATH"]
    return env


def by_name(built: pm.Built) -> dict[str, pm.Population]:
    return {p.name: p for p in pm.populations(pm.other_jax()) if p.name in built.populations}


# --- unpack ------------------------------------------------------------------------------------

BUNDLED = "read"  # the state packed
JUDGED = "stable"  # unpack judges the entries for this population's processes (the stable hook)
# target -> (the population that wrote it first, what its next run adds: a program not bundled)
TARGETS = {
    "lru": ("lru", {"CACHEDOCTOR_PLAIN_SIZE": "16,48"}),
    "plain": ("plain", {}),  # the seed program writes a new jit_f every run (a pointer key)
}


@pytest.fixture(scope="module")
def bundle(matrix: Matrix, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pack`` of the ``read`` state, at the path every run uses."""
    _root, kept, live, _built = matrix
    out = tmp_path_factory.mktemp("bundle") / f"{BUNDLED}.tar"
    with pm.state_at_live(kept, live, BUNDLED):
        code, _out, err = invoke("pack", str(live), "-o", str(out))
    assert code == 0, err
    return out


def bundled_keys(bundle: Path) -> set[str]:
    with tarfile.open(bundle) as tar:
        return {Path(n).name[: -len("-cache")] for n in tar.getnames() if n.endswith("-cache")}


def cut_short(kept: Path, live: Path, key: str) -> None:
    """The first half of the state's entry ``key``, at ``live``: a copy that stopped part-way
    (hand-made damage: JAX fails to load it and never writes over it)."""
    data = read_noatime(kept / BUNDLED / f"{key}-cache")
    (live / f"{key}-cache").write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_unpack_says_will_hit_only_what_jax_hits_and_jax_still_stores(
    matrix: Matrix, bundle: Path, target: str
) -> None:
    """Before the fixes, unpack into a cache with JAX's LRU wrote no ``-atime`` files, and
    every later put failed there (JAX's eviction reads one per entry): nothing new was stored;
    and over a damaged entry the target held at a bundled key it said "will hit" (JAX loads
    the target's file, fails, and never replaces it)."""
    _root, kept, live, built = matrix
    pops = by_name(built)
    writer, adds = TARGETS[target]
    damaged = None
    if target == "plain":  # a bundled entry the judged population hits, held cut short
        hit = pm.hit_keys(built.baseline[BUNDLED][JUDGED])
        damaged = sorted(set(hit) & bundled_keys(bundle))[0]
    with pm.lock(live):
        shutil.rmtree(live, ignore_errors=True)
        try:
            first = pm.run_population(live, pops[writer])
            assert first["rc"] == 0, first["tail"]
            assert (live / ".lockfile").exists() == (target == "lru")  # JAX's LRU: its lock
            if damaged:
                cut_short(kept, live, damaged)
            env = cli_env(live, CACHEDOCTOR_HOOK=JUDGED, **EIGHT)
            proc = run_cli("unpack", str(bundle), str(live), "--apply", "--json", env=env)
            assert proc.returncode in (0, 1), proc.stderr[-2000:]
            report = json.loads(proc.stdout)
            following = dataclasses.replace(pops[writer], env={**pops[writer].env, **adds})
            stored = pm.run_population(live, following)
            held = pm.entry_keys(live)
            judged = pm.run_population(live, pops[JUDGED])
        finally:
            shutil.rmtree(live, ignore_errors=True)
    failed = [e for e in report["entries"] if e["action"].startswith("failed")]
    assert not failed, failed
    will = {e["key"]: e["words"] for e in report["entries"] if e["verdict"] == "hit"}
    assert will, f"the premise: some bundled entry will hit for the {JUDGED} population"
    if damaged:
        assert damaged in {e["key"] for e in report["entries"]}, "the premise: it is bundled"
    assert stored["rc"] == 0, stored["tail"]
    new = sorted({k for _m, k in stored["misses"]})
    assert new, f"the premise: the {writer} population's next run compiles something new"
    unstored = [k for k in new if k not in held]
    assert not unstored, (
        f"after unpack into the {target} target, JAX could not store {len(unstored)} of the "
        f"{len(new)} programs it compiled: {unstored}"
    )
    assert judged["rc"] == 0, judged["tail"]
    missed = {k: w for k, w in will.items() if k not in pm.hit_keys(judged)}
    assert not missed, f"unpack said will hit; the {JUDGED} population then missed: {missed}"


# --- stats --zero, then why and preflight ------------------------------------------------------

ZEROED = "read"
PREFLIGHT_FIELDS = ("module", "verdict", "words")


def _inspect(live: Path) -> dict[str, Any]:
    """What preflight (in the populations' environment: 8 devices, no hook) and why say."""
    preflight = run_cli("preflight", str(live), "--json", env=cli_env(live, **EIGHT))
    assert preflight.returncode in (0, 1), preflight.stderr[-2000:]
    code, out, err = invoke("why", str(live), "--json")
    assert code in (0, 1), err
    return {
        "preflight": {
            "code": preflight.returncode,
            "entries": {
                e["key"]: [e[f] for f in PREFLIGHT_FIELDS]
                for e in json.loads(preflight.stdout)["entries"]
            },
        },
        "why": {  # a miss's record is the archive's after the zero
            "code": code,
            "misses": [
                {k: v for k, v in m.items() if k != "record"} for m in json.loads(out)["misses"]
            ],
        },
    }


def _read_by_jax(live: Path) -> dict[str, str]:
    """Every path outside the stats records' folder, which JAX never reads."""
    return {p: h for p, h in pm.contents(live).items() if not p.startswith("cachedoctor-stats")}


def zeroed(matrix: Matrix) -> dict[str, Any]:
    """``stats --zero --apply`` on the ``read`` state, with what why and preflight said before
    and after it (once per session)."""
    root, kept, live, _built = matrix

    def compute() -> dict[str, Any]:
        with pm.state_at_live(kept, live, ZEROED):
            before, jax_reads = _inspect(live), _read_by_jax(live)
            code, _out, err = invoke("stats", str(live), "--zero", "--apply")
            return {
                "code": code,
                "err": err,
                "before": before,
                "after": _inspect(live),
                "jax_reads_the_same": _read_by_jax(live) == jax_reads,
            }

    return pm.once(root, f"stats-zero-{ZEROED}", compute)


def test_stats_zero_leaves_why_and_preflight_as_they_were(matrix: Matrix) -> None:
    """Before the fix, the zero removed the records why and preflight read: preflight's "will
    hit" (from a stats record) became "cannot tell", and why's explained misses unknown (its
    exit status 1 became 0). Now both say what they said before, with the same exit status (a CI
    gate)."""
    done = zeroed(matrix)
    assert done["code"] == 0, done["err"]
    assert done["jax_reads_the_same"], "the zero changed a file outside cachedoctor-stats/"
    before, after = done["before"], done["after"]
    verdicts = {v for _m, v, _w in before["preflight"]["entries"].values()}
    assert {"hit", "miss"} <= verdicts, before["preflight"]  # the premise: both verdicts
    assert before["why"]["misses"], "the premise: why explains recorded misses"
    for command in ("preflight", "why"):
        assert after[command]["code"] == before[command]["code"], command
    changed = {
        key: (said, after["preflight"]["entries"].get(key))
        for key, said in before["preflight"]["entries"].items()
        if after["preflight"]["entries"].get(key) != said
    }
    assert not changed, f"preflight changed its verdict after stats --zero: {changed}"
    assert after["why"]["misses"] == before["why"]["misses"]


def test_what_preflight_says_will_miss_jax_misses(matrix: Matrix) -> None:
    """The matrix's oracle for preflight: the ``plain`` population runs in the environment
    preflight judged (the seed program, no hook, 8 devices, this spelling), and its baseline
    rerun of the same state hits no entry preflight said will miss."""
    _root, _kept, _live, built = matrix
    entries = zeroed(matrix)["before"]["preflight"]["entries"]
    hit = set(pm.hit_keys(built.baseline[ZEROED]["plain"]))
    wrong = {
        k: words for k, (_m, verdict, words) in entries.items() if verdict == "miss" and k in hit
    }
    assert not wrong, f"preflight said will miss; plain JAX hit them: {wrong}"


# --- read-only runs of every inspector ---------------------------------------------------------

INSPECTORS: dict[str, tuple[str, ...]] = {
    "scan": ("scan", "DIR"),
    "lint": ("lint", "DIR"),
    "stats": ("stats", "DIR"),
    "why": ("why", "DIR"),
    "preflight": ("preflight", "DIR"),
    "pack": ("pack", "DIR", "-o", "OUT"),
    "show": ("show", "KEY", "--dir", "DIR"),
    "diff": ("diff", "KEY", "OTHER", "--dir", "DIR"),
    "status": ("status",),  # the cache of JAX_COMPILATION_CACHE_DIR
}


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Each path's bytes (``contents``), modification time, and a file's access time (usage
    evidence ``prune`` reads; a read without ``O_NOATIME`` moves it on a relatime mount)."""
    out: dict[str, tuple[object, ...]] = {}
    held = pm.contents(root)
    for rel, what in held.items():
        st = (root / rel).lstat()
        atime = st.st_atime_ns if stat.S_ISREG(st.st_mode) else None
        out[rel] = (what, st.st_mtime_ns, atime)
    out["."] = ("folder", root.lstat().st_mtime_ns, None)
    return out


@pytest.mark.parametrize("inspector", sorted(INSPECTORS))
def test_read_only_inspectors_leave_the_cache_as_it_was(
    matrix: Matrix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inspector: str
) -> None:
    """``CACHEDOCTOR_READ_ONLY`` (the Action's ``read-only: true``): the ``written`` state (no
    entry read yet: a read would move an access time) is as it was after the inspector, byte,
    name and time, and holds no ``cachedoctor-index/``. Before the fix, scan, lint, stats,
    preflight and pack wrote their index into the cache."""
    _root, kept, _live, _built = matrix
    cache = tmp_path / "cache"
    pm.copy_tree(kept / "written", cache)
    key, other = sorted(k for k in pm.entry_keys(cache) if k.startswith("jit_f-"))[:2]
    given = {"DIR": str(cache), "OUT": str(tmp_path / "b.tar"), "KEY": key, "OTHER": other}
    args = [given.get(a, a) for a in INSPECTORS[inspector]]
    monkeypatch.setenv("CACHEDOCTOR_INDEX_IN_CACHE", "1")  # as outside the tests (conftest)
    monkeypatch.setenv("CACHEDOCTOR_READ_ONLY", "1")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(cache))
    before = snapshot(cache)
    code, _out, err = invoke(*args)
    assert code in (0, 1), err
    after = snapshot(cache)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, f"`cachedoctor {' '.join(args)}` read-only changed {changed[:6]}"
    assert not (cache / "cachedoctor-index").exists()
