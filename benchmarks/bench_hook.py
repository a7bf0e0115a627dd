"""Cost of the stable key per compile, against JAX's own key computation.

For each bundled program (plain, seed) this runs the program once in a fresh interpreter,
captures the arguments of every ``get_cache_key`` call, then times, per module, JAX's own
``get_cache_key`` and cachedoctor's ``keys.stable_key`` (``--repeat`` times each, median), plus
the hook's whole per-compile path on a warm cache (key, existence checks, manifest present).

    python benchmarks/bench_hook.py [--repeat 50] [--python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, os, runpy, statistics, sys, time
repeat, prog = int(sys.argv[1]), sys.argv[2]
from jax._src import compilation_cache as cc
from cachedoctor.stablekeys import hook, keys
captured = []
original = cc.get_cache_key
def capture(*args, **kwargs):
    captured.append((args, kwargs))
    return original(*args, **kwargs)
cc.get_cache_key = capture
sys.argv = [prog]
runpy.run_path(prog, run_name="__main__")
cc.get_cache_key = original

def median_ms(fn):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3

hook.install("stable")
wrapped = cc.get_cache_key
rows = []
cache_dir = os.environ["JAX_COMPILATION_CACHE_DIR"]
for args, kwargs in captured:
    # make the stable entry exist, so the hook takes its warm-cache path (a hit)
    open(os.path.join(cache_dir, wrapped(*args, **kwargs) + "-cache"), "ab").close()
    jax_ms = median_ms(lambda: original(*args, **kwargs))
    stable_ms = median_ms(lambda: keys.stable_key(*args[:4]))
    hook_ms = median_ms(lambda: wrapped(*args, **kwargs))
    name = keys.stable_key(*args[:4]).module_name
    rows.append({"module": name, "jax_ms": jax_ms, "stable_ms": stable_ms, "hook_ms": hook_ms})
print("BENCH " + json.dumps(rows))
"""


def run(program: str, repeat: int, python: str) -> list[dict[str, float]]:
    prog = ROOT / "src" / "cachedoctor" / "programs" / f"{program}.py"
    with tempfile.TemporaryDirectory() as cache:
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "JAX_COMPILATION_CACHE_DIR": cache,
            "PYTHONPATH": str(ROOT / "src"),
            "CACHEDOCTOR_DISABLE": "1",
        }
        out = subprocess.run(
            [python, "-c", _CHILD, str(repeat), str(prog)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    line = next(x for x in out.stdout.splitlines() if x.startswith("BENCH "))
    rows: list[dict[str, float]] = json.loads(line[6:])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    print(
        f"{'program':<8} {'module':<18} {'jax ms':>8} {'stable ms':>10} {'hook ms':>8} "
        f"{'stable/jax':>10} {'hook/jax':>9}"
    )
    for program in ("plain", "seed"):
        for row in run(program, args.repeat, args.python):
            print(
                f"{program:<8} {row['module']:<18} {row['jax_ms']:8.3f} "
                f"{row['stable_ms']:10.3f} {row['hook_ms']:8.3f} "
                f"{row['stable_ms'] / row['jax_ms']:10.2f} {row['hook_ms'] / row['jax_ms']:9.2f}"
            )


if __name__ == "__main__":
    main()
