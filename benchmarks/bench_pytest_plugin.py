"""Cost of the pytest plugin on a warm suite: the same suite with ``--cachedoctor`` and without.

A generated suite of ``--tests`` tests, each jitting ``--programs`` distinct small functions,
runs once to fill a persistent cache; then ``--pairs`` alternating pairs of runs on that warm
cache (every compile a hit), one with the plugin on and one without (the plugin installed,
off: what every pytest run of the environment pays). Each run is a fresh ``python -m pytest``
(one process, no xdist). Measured per run: wall time and the child's CPU time (user + system);
reported: the median of the per-pair ratios on/off, their quartiles and extremes, and the
machine's load (``os.getloadavg``) before and after. Goal: the median ratio at most 1.02.

    python benchmarks/bench_pytest_plugin.py [--tests 60] [--programs 3] [--pairs 10]
        [--hook]   # both sides with the stats recorder on (CACHEDOCTOR_HOOK=stats): the causes
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

GOAL = 1.02

TEST = """
import jax, jax.numpy as jnp

def test_{i}():
    x = jnp.arange(8.0)
{body}
"""


def write_suite(folder: Path, tests: int, programs: int) -> None:
    for i in range(tests):
        body = "\n".join(
            f"    assert float(jax.jit(lambda v: (v * {i + 1}.0 + {j}.0).sum())(x)) > -1"
            for j in range(programs)
        )
        (folder / f"test_gen_{i:03d}.py").write_text(textwrap.dedent(TEST).format(i=i, body=body))


def run(folder: Path, env: dict[str, str], plugin: bool) -> tuple[float, float]:
    """One pytest process: (wall s, CPU s of the child)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    argv += ["-c", os.devnull, "--rootdir", str(folder), str(folder)]
    if plugin:
        argv.append("--cachedoctor")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def spread(ratios: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {
        "median": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "min": min(ratios),
        "max": max(ratios),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", type=int, default=60)
    ap.add_argument("--programs", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--hook", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, cache = Path(tmp) / "suite", Path(tmp) / "cache"
        folder.mkdir()
        write_suite(folder, args.tests, args.programs)
        env = {
            **os.environ,
            "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
            "JAX_PLATFORMS": "cpu",
            "CACHEDOCTOR_CONFIG": str(Path(tmp) / "none.toml"),
        }
        env.pop("CACHEDOCTOR_HOOK", None)
        if args.hook:
            env["CACHEDOCTOR_HOOK"] = "stats"
        run(folder, env, plugin=False)  # fills the cache
        load_before = os.getloadavg()
        walls: list[float] = []
        cpus: list[float] = []
        sides: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            got = {plugin: run(folder, env, plugin) for plugin in order}
            sides["on"].append(got[True])
            sides["off"].append(got[False])
            walls.append(got[True][0] / got[False][0])
            cpus.append(got[True][1] / got[False][1])
        result: dict[str, Any] = {
            "tests": args.tests,
            "programs_per_test": args.programs,
            "pairs": args.pairs,
            "hook": "stats" if args.hook else "off",
            "wall_ratio": spread(walls),
            "cpu_ratio": spread(cpus),
            "wall_off_median_s": statistics.median(w for w, _ in sides["off"]),
            "cpu_off_median_s": statistics.median(c for _, c in sides["off"]),
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "cores": os.cpu_count(),
            "goal": GOAL,
        }
        result["met"] = result["cpu_ratio"]["median"] <= GOAL
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
