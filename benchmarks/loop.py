"""The test loop's cost against a reference measured in the same run (issue 40, item 6).

    python benchmarks/loop.py [--reps 5] [--out FILE.json] [-- COMMAND ...]

The command defaults to the README's ``pytest -n auto`` with this interpreter. This machine's
speed moves by half within hours (docs/development.md), so two wall times taken an hour apart
compare the machine, not the suite. What holds still is the work: this measures the reference
(``import jax`` in a fresh interpreter of this venv, user + system CPU, the start-up that is
70 % of a JAX process and so most of the suite) ``--reps`` times before the command and after
it, and reports the command's wall time, its CPU (its own and that of every process it waited
for), the cores it kept busy and its CPU in reference units: CPU / the median reference. Two
runs compare by that last figure, whatever the hour.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def children_cpu() -> float:
    """User + system CPU of every child waited for so far (and of what they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def reference(reps: int) -> list[float]:
    """CPU seconds of ``import jax`` in a fresh interpreter, ``reps`` times."""
    found = []
    for _ in range(reps):
        before = children_cpu()
        subprocess.run([sys.executable, "-c", "import jax"], check=True, cwd=REPO)
        found.append(round(children_cpu() - before, 3))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="reference runs before and after")
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    parser.add_argument("command", nargs="*", help="default: pytest -n auto (the README's)")
    args = parser.parse_args()
    command = args.command or [sys.executable, "-m", "pytest", "-n", "auto"]

    before = reference(args.reps)
    cpu0, wall0 = children_cpu(), time.monotonic()
    status = subprocess.run(command, cwd=REPO, check=False).returncode
    cpu, wall = children_cpu() - cpu0, time.monotonic() - wall0
    after = reference(args.reps)

    unit = statistics.median(before + after)
    result = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "status": status,
        "cores": os.cpu_count(),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cores_busy": round(cpu / wall, 2),
        "reference_s": {"before": before, "after": after, "median": unit},
        "cpu_in_reference_units": round(cpu / unit),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if max(before + after) > 1.5 * min(before + after):
        print("the reference moved by more than half during the run: compare with care")
    return status


if __name__ == "__main__":
    sys.exit(main())
