"""First scans of a cache, this checkout against another, alternating (issue 26, evidence in tiers).

    python benchmarks/bench_tiers.py --baseline OTHER/src DIR [DIR ...] [--reps 7]

For each DIR: the floor D (read and decompress every entry, one thread, ``run.floor_decompress``)
and a first ``cachedoctor scan DIR`` (text; the index dropped before each run, start-up
excluded: ``_child.py``) by the baseline's code and by this checkout's, alternating, D measured
again between rounds; also the CPU seconds of each command and its pool workers (start-up
excluded), which a machine shared with other jobs disturbs less than wall time, against D's
CPU time. Prints and writes (``--out``) medians, min-max and ratios to D's median.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402


def child_cpu(argv: list[str], src: str) -> tuple[float, float]:
    """The command's own seconds and CPU seconds, its pool workers' included (``_child.py``:
    start-up excluded)."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_child.py"), "cli", json.dumps({"argv": argv})],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, _usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{argv} failed")
    result = json.loads(out.decode().strip().splitlines()[-1])
    return float(result["seconds"]), float(result["cpu_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--baseline", required=True, help="the other checkout's src/")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--argv", default="scan", help="the command, DIR appended (default: scan)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    codes = {"baseline": str(Path(args.baseline).resolve()), "this": str(HERE.parent / "src")}
    results: dict[str, object] = {"baseline": codes["baseline"], "load": os.getloadavg()}
    for d in args.dirs:
        run.floor_read(d)
        times: dict[str, list[float]] = {"D": [], "D CPU": []}
        for name in codes:
            times[name] = []
            times[name + " CPU"] = []
        for _ in range(args.reps):
            t0, cpu0 = time.perf_counter(), time.process_time()
            run.floor_decompress(d)
            times["D"].append(time.perf_counter() - t0)
            times["D CPU"].append(time.process_time() - cpu0)
            for name, src in codes.items():
                run.drop_index(d)
                seconds, cpu = child_cpu([*args.argv.split(), d], src)
                times[name].append(seconds)
                times[name + " CPU"].append(cpu)
        floors = {k: statistics.median(times["D" + k]) for k in ("", " CPU")}
        row = {
            k: {
                "median_s": statistics.median(v),
                "min_s": min(v),
                "max_s": max(v),
                "x_D": statistics.median(v) / floors[" CPU" if k.endswith("CPU") else ""],
                "runs": v,
            }
            for k, v in times.items()
        }
        results[d] = row
        print(f"{d}  (load {os.getloadavg()[0]:.1f})")
        for k, v in row.items():
            print(
                f"  {k:13s} {v['median_s'] * 1e3:8.1f} ms  ({v['min_s'] * 1e3:.1f}-"
                f"{v['max_s'] * 1e3:.1f})  {v['x_D']:5.2f} x D"
            )
        for what in ("", " CPU"):
            pairs = zip(times["this" + what], times["baseline" + what], strict=True)
            ratios = [t / b for t, b in pairs]
            print(
                f"  this/baseline{what or ' wall'} per pair: median "
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
