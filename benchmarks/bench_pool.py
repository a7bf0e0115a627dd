"""Where a pool pays for a first scan of a few large programs (issue 26): pool against one process.

    python benchmarks/bench_pool.py [--corpus dist-lrg] [--counts 10,15,20] [--reps 11]
                                    [--out benchmarks/results/NAME.json]

For each count k: a folder holding the corpus's first k entries (by name, with their ``-atime``
files), and, alternating in each repetition, a first ``cachedoctor scan`` (start-up excluded,
``_child.py``; the index dropped before each) three ways: **pool** (always a pool: the
threshold set to 0), **serial** (``CACHEDOCTOR_WORKERS=1``) and **default** (this checkout's
threshold, ``parallel.min_declared``), plus the floor D (read and decompress, one thread, in
this process). Prints medians, each way's ratio to D, and pool/serial and default/serial per
repetition: where pool/serial crosses 1 is what ``min_declared`` should say on this machine's
cores. The corpus comes from ``$CACHEDOCTOR_BENCH_DIR`` (``generate.py``) and is only read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as harness  # noqa: E402

WAYS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "pool": ({"pool_declared": 0}, {}),
    "serial": ({}, {"CACHEDOCTOR_WORKERS": "1"}),
    "default": ({}, {}),
}


def subset(src: Path, k: int, dst: Path) -> int:
    """The first ``k`` entries of ``src`` (and their ``-atime`` files) copied into ``dst``;
    their declared decompressed bytes."""
    from cachedoctor.cache import decompress

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    names = sorted(p.name for p in src.iterdir() if p.name.endswith("-cache"))[:k]
    for name in names:
        shutil.copy2(src / name, dst / name)
        atime = src / (name[: -len("-cache")] + "-atime")
        if atime.exists():
            shutil.copy2(atime, dst / atime.name)
    return decompress.declared_total(str(dst / n) for n in names)


def scan(d: Path, way: str) -> tuple[float, float]:
    extra, env = WAYS[way]
    harness.drop_index(str(d))
    env = {**env, "BENCH_WARM_PROTOBUF": "1"}
    result = harness.child("cli", {"argv": ["scan", str(d)], **extra}, env)
    return float(result["seconds"]), float(result["cpu_s"])


def bench(src: Path, k: int, reps: int, work: Path) -> dict[str, Any]:
    d = work / f"{src.name}-{k}"
    declared = subset(src, k, d)
    harness.floor_read(str(d))
    times: dict[str, list[float]] = {"D": []}
    for way in WAYS:
        times[way], times[way + " CPU"] = [], []
    for rep in range(reps):
        t0 = time.perf_counter()
        harness.floor_decompress(str(d))
        times["D"].append(time.perf_counter() - t0)
        ways = list(WAYS) if rep % 2 == 0 else list(reversed(WAYS))
        for way in ways:
            seconds, cpu = scan(d, way)
            times[way].append(seconds)
            times[way + " CPU"].append(cpu)
    shutil.rmtree(d, ignore_errors=True)
    floor = statistics.median(times["D"])
    out: dict[str, Any] = {"entries": k, "declared_mb": declared / 1e6, "reps": reps}
    for name, values in times.items():
        out[name] = {
            "median_ms": statistics.median(values) * 1e3,
            "x_D": statistics.median(values) / floor,
            "runs_ms": [v * 1e3 for v in values],
        }
    for way in ("pool", "default"):
        pairs = [a / b for a, b in zip(times[way], times["serial"], strict=True)]
        out[f"{way}/serial"] = {
            "median": statistics.median(pairs),
            "min": min(pairs),
            "max": max(pairs),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="dist-lrg")
    ap.add_argument("--counts", default="10,15,20")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    bench_dir = Path(os.environ.get("CACHEDOCTOR_BENCH_DIR", "~/.cache/cachedoctor-bench"))
    src = bench_dir.expanduser() / args.corpus
    from cachedoctor.cache import parallel

    results: dict[str, Any] = {
        "machine": harness.machine(),
        "workers": parallel.default_workers(),
        "min_declared_mb": parallel.min_declared(parallel.default_workers()) / 1e6,
        "counts": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as work:
        for k in (int(c) for c in args.counts.split(",")):
            row = bench(src, k, args.reps, Path(work))
            results["counts"].append(row)
            head = f"{k:3d} entries, {row['declared_mb']:.1f} MB declared"
            print(
                f"{head}: D {row['D']['median_ms']:.1f} ms; "
                + ", ".join(
                    f"{w} {row[w]['median_ms']:.1f} ms ({row[w]['x_D']:.2f} x D, CPU "
                    f"{row[w + ' CPU']['median_ms']:.1f})"
                    for w in WAYS
                )
                + f"; pool/serial {row['pool/serial']['median']:.2f}"
                + f", default/serial {row['default/serial']['median']:.2f}",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
