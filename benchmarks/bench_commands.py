"""Whole-process wall time and CPU of short commands, as a user runs them, against another
checkout.

    python benchmarks/bench_commands.py DIR --baseline OTHER/src [--reps 9]

``python -m cachedoctor ARGS`` in a fresh interpreter, start-up and exit included (the other
benchmarks time the command after its imports), for ``--help`` and for ``scan``, ``scan --json``
and ``lint`` of DIR (any cache; a repeated scan once the first has written its index and memo).
This checkout and the other one's ``src`` (``PYTHONPATH``) alternate run by run, so that load on a
shared machine falls on both alike; each ratio is this checkout's median over the other's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``python -m cachedoctor ARGV``, from ``wait4``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cachedoctor", *argv],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, rusage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise RuntimeError(f"{argv} failed ({os.waitstatus_to_exitcode(status)})")
    return time.perf_counter() - t0, rusage.ru_utime + rusage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a cache directory")
    ap.add_argument("--baseline", required=True, help="the src folder of another checkout")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    variants = {"this": {}, "baseline": {"PYTHONPATH": os.path.abspath(args.baseline)}}
    commands = [["--help"], ["scan", args.dir], ["scan", args.dir, "--json"], ["lint", args.dir]]
    for env in variants.values():  # each variant's index and memo written before it is timed
        once(["scan", args.dir], env)
    got: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for argv in commands:
        label = " ".join(argv[:1] + argv[2:])
        got[label] = {name: [] for name in variants}
        for rep in range(args.reps):
            order = list(variants) if rep % 2 == 0 else list(reversed(variants))
            for name in order:
                got[label][name].append(once(argv, variants[name]))
    print("| command | this: wall, CPU | baseline: wall, CPU | wall ratio |")
    print("|---|---:|---:|---:|")
    summary: dict[str, Any] = {}
    for label, runs in got.items():
        med = {
            name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
            for name, r in runs.items()
        }
        ratio = med["this"][0] / med["baseline"][0]
        print(
            f"| `{label}` | {med['this'][0] * 1000:.0f} ms, {med['this'][1] * 1000:.0f} ms "
            f"| {med['baseline'][0] * 1000:.0f} ms, {med['baseline'][1] * 1000:.0f} ms "
            f"| {ratio:.2f} |"
        )
        summary[label] = {"runs": runs, "wall_ratio": ratio}
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
