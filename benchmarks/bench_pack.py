"""Peak memory and time of ``pack`` as the cache grows, optionally against another checkout.

    python benchmarks/bench_pack.py [--copies 10,400] [--reps 2] [--baseline OTHER/src]

One JAX process compiles a program whose entry is about 1.1 MB (a 1.2 MB constant and a long
elementwise chain) into a cache of its own under ``$CACHEDOCTOR_BENCH_DIR`` (default
``~/.cache/cachedoctor-bench/pack``); each size is that entry copied under new random keys (what
unstable keys produce). ``pack`` runs as a user runs it, ``python -m cachedoctor pack``, its
wall time and peak RSS from ``wait4``. What grows with the cache is the slope: MB of peak RSS
per MB of bundle, between the smallest and the largest size. With ``--baseline``, the other
checkout's ``src`` runs the same packs, the two alternating run by run.

Each variant packs caches of its own, twice before it is measured: a pack with no scan memo of
its code reads the installed jaxlib's option schema (``xla/optionschema``), which maps the
300 MB library, and the file pages it touches count in peak RSS though the process allocates
none of them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402

PROGRAM = """
import os, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
TABLE = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)
@jax.jit
def large(x):
    for i in range(300):
        x = jnp.sin(x) * (1.0 + i / 300) + jnp.cos(x * i)
    return x + jnp.asarray(TABLE)
print(float(large(np.ones(300_000, np.float32))[0]))
"""


def _root() -> Path:
    base = os.environ.get("CACHEDOCTOR_BENCH_DIR") or Path.home() / ".cache" / "cachedoctor-bench"
    return Path(base) / "pack"


def source_entry(root: Path) -> Path:
    """The one real entry every size copies (compiled once, kept)."""
    src = root / "src"
    found = sorted(src.glob("jit_large-*-cache")) if src.is_dir() else []
    if not found:
        shutil.rmtree(src, ignore_errors=True)
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(src)}
        subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True)
        found = sorted(src.glob("jit_large-*-cache"))
    return found[0]


def lay_out(root: Path, entry: Path, copies: int, variant: str) -> Path:
    """A cache of ``copies`` copies of ``entry``, each under a new random key."""
    cache = root / variant / f"copies-{copies}"
    if len(list(cache.glob("*-cache"))) != copies:
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        data = entry.read_bytes()
        for _ in range(copies):
            (cache / f"jit_large-{secrets.token_hex(32)}-cache").write_bytes(data)
    return cache


def pack(cache: Path, out: Path, env: dict[str, str]) -> dict[str, float]:
    """``python -m cachedoctor pack CACHE -o OUT``: its wall time and peak RSS."""
    argv = [sys.executable, "-m", "cachedoctor", "pack", str(cache), "-o", str(out), "--force"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL)
    _, status, rusage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, argv
    return {"seconds": time.perf_counter() - t0, "maxrss_mb": rusage.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", default="10,400", help="cache sizes, in copies of the entry")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--baseline", help="the src folder of another checkout, run alternately")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    root = _root()
    entry = source_entry(root)
    sizes = [int(c) for c in args.copies.split(",")]
    variants: dict[str, dict[str, str]] = {"this": {}}
    if args.baseline:
        variants["baseline"] = {"PYTHONPATH": os.path.abspath(args.baseline)}
    caches = {v: {n: lay_out(root, entry, n, v) for n in sizes} for v in variants}
    got: dict[str, dict[int, list[dict[str, Any]]]] = {v: {n: [] for n in sizes} for v in variants}
    bundle_mb: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
        for name, env in variants.items():  # each variant's scan memo, written and read
            for cache in caches[name].values():
                for _ in range(2):
                    pack(cache, Path(tmp) / "warm.tar", env)
        for rep in range(args.reps):
            order = list(variants) if rep % 2 == 0 else list(reversed(variants))
            for name in order:
                for n, cache in caches[name].items():
                    run.floor_read(str(cache))  # the page cache warm for both alike
                    out = Path(tmp) / f"{name}-{n}.tar"
                    result = pack(cache, out, variants[name])
                    bundle_mb[n] = out.stat().st_size / 2**20
                    got[name][n].append(result)
                    print(f"rep {rep} {name} {n}: {json.dumps(result)}", file=sys.stderr)
    lo, hi = min(sizes), max(sizes)
    print(
        f"entry {entry.stat().st_size / 2**20:.2f} MB; bundles {bundle_mb[lo]:.0f} and "
        f"{bundle_mb[hi]:.0f} MB"
    )
    print("| variant | copies | bundle | median time | peak RSS (max) |")
    print("|---|---:|---:|---:|---:|")
    summary: dict[str, Any] = {"bundle_mb": bundle_mb, "variants": got}
    for name in variants:
        rss = {n: max(r["maxrss_mb"] for r in got[name][n]) for n in sizes}
        for n in sizes:
            seconds = statistics.median(r["seconds"] for r in got[name][n])
            print(f"| {name} | {n} | {bundle_mb[n]:.0f} MB | {seconds:.2f} s | {rss[n]:.0f} MB |")
        slope = (rss[hi] - rss[lo]) / (bundle_mb[hi] - bundle_mb[lo])
        print(f"{name}: {slope:.2f} MB of peak RSS per MB of bundle")
        summary.setdefault("slope", {})[name] = slope
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
