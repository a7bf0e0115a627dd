"""Cost of stats recording on a warm start: many modules, every one a persistent-cache hit.

A program jits ``--modules`` distinct small functions. One run warms the cache; then fresh
interpreters alternate between no activation (the baseline) and ``CACHEDOCTOR_HOOK=stats``,
``--reps`` times each, against the same warm cache. Two times per run: the program's own loop
(all compiles, i.e. cache hits) and the whole process (which includes writing the record at
exit). The result is the ratio of medians, beside the baseline's own spread (max/min): the
recording is within noise when its ratio is inside that spread.

``--cold``: every run starts from an empty cache instead, so that every lookup misses, compiles
and writes: the recorder then also keeps each missed key's components (``misskeys.py``: JAX's
key code run once more per miss, and JAX's lowering settings read).

    python benchmarks/bench_stats.py [--modules 200] [--reps 7] [--cold]
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = r"""
import os, sys, time
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax, jax.numpy as jnp
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
n = int(sys.argv[1])
x = jnp.arange(8, dtype=jnp.float32)
start = time.perf_counter()
for i in range(n):
    def f(v, i=i):
        return jnp.sin(v) * i + jnp.cos(v * (i + 1))
    f.__name__ = f.__qualname__ = f"f{i}"
    jax.jit(f)(x).block_until_ready()
print("LOOP", time.perf_counter() - start)
"""


def one_run(
    cache: str, modules: int, mode: str | None, src: Path = ROOT / "src"
) -> tuple[float, float, float]:
    """(the loop's wall time, the process's wall time, the process's CPU time: user + system,
    which another process on the machine disturbs less than the wall clock)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDOCTOR_", "JAX_"))}
    env |= {"JAX_COMPILATION_CACHE_DIR": cache, "PYTHONPATH": str(src)}
    env["CACHEDOCTOR_CONFIG"] = os.path.join(cache, "no-config.toml")
    if mode is not None:
        env["CACHEDOCTOR_HOOK"] = mode
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(modules)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    whole = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    loop = float(next(x for x in out.stdout.splitlines() if x.startswith("LOOP")).split()[1])
    return loop, whole, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=200)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--cold", action="store_true", help="every run misses (an empty cache)")
    parser.add_argument(
        "--other-src",
        type=Path,
        help="a third variant, interleaved: stats recording by another checkout's src/ (the"
        " recorder of an earlier commit, say)",
    )
    args = parser.parse_args()
    variants: list[tuple[str | None, str, Path]] = [
        (None, "baseline", ROOT / "src"),
        ("stats", "stats", ROOT / "src"),
    ]
    if args.other_src:
        variants.append(("stats", "stats_other", args.other_src.resolve()))
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for _, name, _ in variants}
    records = 0
    with tempfile.TemporaryDirectory() as root:
        cache = os.path.join(root, "warm")
        one_run(cache, args.modules, None)  # warm the cache: every later compile is a hit
        for rep in range(args.reps):  # interleaved, so that load on the machine hits both
            for mode, name, src in variants:
                where = os.path.join(root, f"cold-{rep}-{name}") if args.cold else cache
                runs[name].append(one_run(where, args.modules, mode, src))
                if args.cold:
                    records += len(list(Path(where, "cachedoctor-stats").glob("*.json")))
        if not args.cold:
            records = len(list(Path(cache, "cachedoctor-stats").glob("*.json")))
    result: dict[str, object] = {
        "modules": args.modules,
        "reps": args.reps,
        "start": "cold" if args.cold else "warm",
        "records": records,
    }
    if args.other_src:
        result["other_src"] = str(args.other_src)
    for i, what in enumerate(("loop", "process", "process_cpu")):
        base = [r[i] for r in runs["baseline"]]
        doc: dict[str, float] = {
            "baseline_median_s": statistics.median(base),
            "baseline_spread": max(base) / min(base),
        }
        for _, name, _ in variants[1:]:
            mine = [r[i] for r in runs[name]]
            doc[f"{name}_median_s"] = statistics.median(mine)
            doc["ratio" if name == "stats" else f"{name}_ratio"] = statistics.median(
                mine
            ) / statistics.median(base)
        result[what] = doc
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
