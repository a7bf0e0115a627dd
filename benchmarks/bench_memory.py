"""Peak memory of ``scan``, ``scan --json`` and ``lint`` (first and repeated) and the time of a
repeated ``scan`` against L, on one generated cache, optionally against another checkout.

    python benchmarks/bench_memory.py --size 50000 [--reps 2] [--baseline OTHER/src]
    python benchmarks/bench_memory.py --size 10000 --repeated-only --reps 7 --baseline OTHER/src

Each command runs in a fresh interpreter (``_child.py``); peak RSS is the process's
``ru_maxrss`` from ``wait4``, the time that of the command after its imports. With
``--baseline``, the other checkout's ``src`` runs the same commands, the two alternating run by
run, each with a scan index of its own (``XDG_CACHE_HOME``), so that load on a shared machine
falls on both alike. L (list and lstat every file) is measured in this process before each pair.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402
import run  # noqa: E402

COMMANDS = {"scan": ["scan"], "scan --json": ["scan", "--json"], "lint": ["lint"]}


def _variant_env(src: str | None, xdg: str) -> dict[str, str]:
    env = {"XDG_CACHE_HOME": xdg}
    if src is not None:
        env["PYTHONPATH"] = src
    return env


def _run(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    got = run.child("cli", {"argv": argv}, env)
    return {"seconds": got["seconds"], "maxrss_mb": got["maxrss_mb"]}


def measure(d: str, env: dict[str, str], xdg: str, repeated_only: bool) -> dict[str, Any]:
    """One round: each command first (no index), then repeated (the index warm)."""
    out: dict[str, Any] = {}
    for name, argv in COMMANDS.items():
        if not repeated_only:
            shutil.rmtree(xdg, ignore_errors=True)
            out[f"{name} (first)"] = _run([argv[0], d, *argv[1:]], env)
        elif not os.path.isdir(xdg):
            _run(["scan", d], env)  # leaves the index behind
        out[f"{name} (repeated)"] = _run([argv[0], d, *argv[1:]], env)
        if repeated_only:
            break  # the repeated scan's time is what is compared
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=50000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--baseline", help="the src folder of another checkout, run alternately")
    ap.add_argument("--repeated-only", action="store_true", help="only the repeated scan")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    d = generate.ensure_corpus((args.size,), distinct_sizes=None)["caches"][str(args.size)]["path"]  # type: ignore[index]
    run.floor_read(d)  # warm the page cache
    variants: dict[str, str | None] = {"this": None}
    if args.baseline:
        variants["baseline"] = os.path.abspath(args.baseline)
    rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    floors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        for rep in range(args.reps):
            floors.append(run.timed(lambda: run.floor_list(d), 3)["median_s"])
            order = list(variants) if rep % 2 == 0 else list(reversed(variants))
            for name in order:
                xdg = os.path.join(tmp, name)
                got = measure(d, _variant_env(variants[name], xdg), xdg, args.repeated_only)
                rounds[name].append(got)
                print(f"rep {rep} {name}: {json.dumps(got)}", file=sys.stderr)
    floor = statistics.median(floors)
    print(f"{args.size:,} entries, L = {floor * 1000:.0f} ms (median of {len(floors)})")
    print("| command | variant | median time | × L | peak RSS (max) |")
    print("|---|---|---:|---:|---:|")
    summary: dict[str, Any] = {"size": args.size, "L_s": floor, "variants": {}}
    for cmd in rounds["this"][0]:
        for name in variants:
            runs = [r[cmd] for r in rounds[name]]
            seconds = statistics.median(r["seconds"] for r in runs)
            rss = max(r["maxrss_mb"] for r in runs)
            ratio = f"{seconds / floor:.1f}" if "repeated" in cmd else ""
            print(f"| {cmd} | {name} | {seconds * 1000:,.0f} ms | {ratio} | {rss:.0f} MB |")
            summary["variants"].setdefault(name, {})[cmd] = {"runs": runs}
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
