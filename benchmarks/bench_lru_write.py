"""What one JAX cache write (and one hit) costs with JAX's LRU eviction on, against off.

With ``jax_compilation_cache_max_size`` set (anything but -1), JAX's ``LRUCache.put`` takes its
``.lockfile`` and runs ``_evict_if_needed`` before every write: it globs ``*-cache``, stats every
entry and reads every entry's ``-atime`` file, so each write costs time in proportion to the
entries already there (``jax/_src/lru_cache.py``, the same pass in 0.4.38, 0.10.2 and 0.12.0.1).
A hit (``get``) takes the lock and rewrites the entry's ``-atime`` file.

For each N of ``--sizes`` a temporary folder is filled with N entries ``jit_fN-<64 hex>-cache``
of 10-100 KiB (log-uniform sizes, random bytes), each with its ``-atime`` file (last uses spread
over 30 days), as JAX leaves a cache written with eviction on. Then JAX's own ``LRUCache`` (this
interpreter's jax, in this process: JAX's put path, minus the compile) puts one new entry of
``--value-kib`` KiB, the variants interleaved rep by rep so that load on the machine falls on all
of them alike:

- ``off``: ``max_size=-1``, the baseline (no lock, no eviction pass);
- ``on``: a ``max_size`` far above the folder's size (the pass runs and evicts nothing);
- ``on_evict1``: ``max_size`` = the folder's size, so the pass evicts the least recently used
  entry (made the largest, so one is enough; checked).

The new entry is removed, and the evicted one put back, outside the timing. Then ``get`` of an
entry held (a hit), off against on. The page cache is warm (the folder was just written), as for
a cache a machine uses all day; a cold one pays more.

Reported, per N: ms per write (median, min, max over ``--reps``), the ratio of medians to ``off``
at the same N, and the pass's cost per entry, ``(on - off) / N``; over all N, the least-squares
slope of ``on - off`` against N: the per-entry cost ``scan``'s ``lru-write-cost`` finding quotes
(``core/scan/rules/lrucost.py``).

JAX 0.10 goes through ``etils.epath`` when it is installed (its ``stat`` also looks up the
entry's owner and group); ``--pathlib`` makes it use the standard library's pathlib, as it does
without etils (JAX 0.12 uses ``os.stat`` for a local folder either way). The benchmark needs only
jax, filelock and the standard library, so any JAX's interpreter runs it.

    python benchmarks/bench_lru_write.py [--sizes 1000,10000,50000] [--reps 7]
                                         [--get-reps 200] [--pathlib] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KIB = 1024
DAY_NS = 86_400 * 10**9


def _filesystem(path: str) -> str:
    """The type of the filesystem holding ``path`` (the longest mount point above it)."""
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def fill(folder: Path, n: int, rng: random.Random) -> tuple[str, str, int]:
    """N entries with their -atime files; returns (the oldest key, the next oldest, total bytes
    of the -cache files). The oldest is 100 KiB, the largest size drawn."""
    blob = os.urandom(100 * KIB)
    now = time.time_ns()
    total = 0
    stamps = []
    for i in range(n):
        key = f"jit_f{i}-{rng.getrandbits(256):064x}"
        size = 100 * KIB if i == 0 else int(10 * KIB * 10 ** rng.random())
        (folder / f"{key}-cache").write_bytes(blob[:size])
        stamp = now - DAY_NS * 30 - 1 if i == 0 else now - rng.randrange(DAY_NS * 30)
        (folder / f"{key}-atime").write_bytes(stamp.to_bytes(8, "little"))
        stamps.append((stamp, key))
        total += size
    stamps.sort()
    return stamps[0][1], stamps[1][1], total


def _use_stdlib_pathlib() -> None:
    """Make JAX's path module the standard library's, as without etils installed."""
    import pathlib

    from jax._src import path as jax_path

    jax_path.Path = pathlib.Path
    jax_path.epath_installed = False


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), "")
    except OSError:
        return ""


def _clock(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _spread(seconds: list[float], unit: str = "ms") -> dict[str, float]:
    scaled = [s * (1000 if unit == "ms" else 1_000_000) for s in seconds]
    return {
        f"median_{unit}": statistics.median(scaled),
        f"min_{unit}": min(scaled),
        f"max_{unit}": max(scaled),
    }


def measure_writes(
    folder: Path, total: int, oldest: str, second: str, reps: int, value_kib: int
) -> dict[str, dict[str, float]]:
    """Interleaved puts of one new entry: off, on (nothing evicted), on with one eviction."""
    from jax._src.lru_cache import LRUCache

    caches = {
        "off": LRUCache(str(folder), max_size=-1),
        "on": LRUCache(str(folder), max_size=1 << 62),
        "on_evict1": LRUCache(str(folder), max_size=total),
    }
    value = os.urandom(value_kib * KIB)
    oldest_bytes = (folder / f"{oldest}-cache").read_bytes()
    oldest_atime = (folder / f"{oldest}-atime").read_bytes()
    times: dict[str, list[float]] = {name: [] for name in caches}
    for rep in range(reps):
        for name, cache in caches.items():
            key = f"jit_new{rep}-{random.getrandbits(256):064x}"
            times[name].append(_clock(functools.partial(cache.put, key, value)))
            for suffix in ("-cache", "-atime"):
                (folder / f"{key}{suffix}").unlink(missing_ok=True)
            if name == "on_evict1":
                gone = not (folder / f"{oldest}-cache").exists()
                kept = (folder / f"{second}-cache").exists()
                if not (gone and kept):
                    raise RuntimeError(f"expected exactly one eviction: {gone=} {kept=}")
                (folder / f"{oldest}-cache").write_bytes(oldest_bytes)
                (folder / f"{oldest}-atime").write_bytes(oldest_atime)
    return {name: _spread(t) for name, t in times.items()}


def measure_gets(folder: Path, reps: int) -> dict[str, dict[str, float]]:
    """A hit, off against on (the lock, and the -atime file rewritten)."""
    from jax._src.lru_cache import LRUCache

    keys = sorted(p.name.removesuffix("-cache") for p in folder.glob("*-cache"))[:reps]
    caches = {"off": LRUCache(str(folder), max_size=-1)}
    caches["on"] = LRUCache(str(folder), max_size=1 << 62)
    times: dict[str, list[float]] = {name: [] for name in caches}
    for key in keys:
        for name, cache in caches.items():
            times[name].append(_clock(functools.partial(cache.get, key)))
    return {name: _spread(t, "us") for name, t in times.items()}


def one_size(n: int, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp) / "cache"
        folder.mkdir()
        t0 = time.perf_counter()
        oldest, second, total = fill(folder, n, rng)
        filled = time.perf_counter() - t0
        writes = measure_writes(folder, total, oldest, second, args.reps, args.value_kib)
        gets = measure_gets(folder, args.get_reps)
    base = writes["off"]["median_ms"]
    result: dict[str, Any] = {"entries": n, "entry_bytes": total, "fill_s": round(filled, 1)}
    result["put"] = writes
    result["ratio_to_off"] = {k: v["median_ms"] / base for k, v in writes.items() if k != "off"}
    result["pass_us_per_entry"] = (writes["on"]["median_ms"] - base) * 1000 / n
    result["get_us"] = gets
    result["get_ratio_on_to_off"] = gets["on"]["median_us"] / gets["off"]["median_us"]
    print(
        f"N={n:>6}: put off {base:8.2f} ms, on {writes['on']['median_ms']:8.2f} ms "
        f"(x{result['ratio_to_off']['on']:.0f}), on+evict {writes['on_evict1']['median_ms']:8.2f}"
        f" ms; {result['pass_us_per_entry']:.1f} us/entry; get off "
        f"{gets['off']['median_us']:.0f} us, on {gets['on']['median_us']:.0f} us",
        file=sys.stderr,
    )
    return result


def slope(rows: list[dict[str, Any]]) -> float | None:
    """Least-squares slope of (on - off) in µs against N, through the sizes measured."""
    if len(rows) < 2:
        return None
    xs: list[float] = [r["entries"] for r in rows]
    ys: list[float] = [
        (r["put"]["on"]["median_ms"] - r["put"]["off"]["median_ms"]) * 1000 for r in rows
    ]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    covariance = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return covariance / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--reps", type=int, default=7, help="puts per variant and size")
    parser.add_argument("--get-reps", type=int, default=200, help="gets per variant and size")
    parser.add_argument("--value-kib", type=int, default=50, help="the new entry's size")
    parser.add_argument("--pathlib", action="store_true", help="JAX without etils.epath")
    parser.add_argument("--dir", help="where the temporary caches go (default: $TMPDIR)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.pathlib:
        _use_stdlib_pathlib()
    import jax
    from jax._src import path as jax_path

    rng = random.Random(args.seed)
    started = time.time()
    rows = [one_size(int(n), args, rng) for n in args.sizes.split(",")]
    fit = slope(rows)
    where = os.path.realpath(args.dir or tempfile.gettempdir())
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": _cpu_model(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "filesystem": _filesystem(where),
            "load_average_at_start": os.getloadavg()[0],
        },
        "jax": jax.__version__,
        "epath": bool(jax_path.epath_installed),
        "reps": args.reps,
        "get_reps": args.get_reps,
        "value_kib": args.value_kib,
        "sizes": rows,
        "pass_us_per_entry_fit": fit,
        "seconds": round(time.time() - started, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
