"""The test loop's cost against a reference measured in the same run (issue 40, item 6).

    python benchmarks/loop.py [--reps 5] [--out FILE.json] [--by-module] [-- COMMAND ...]

The command defaults to the README's ``pytest -n auto`` with this interpreter. This machine's
speed moves by half within hours (docs/development.md), so two wall times taken an hour apart
compare the machine, not the suite. What holds still is the work: this measures the reference
(``import jax`` in a fresh interpreter of this venv, user + system CPU, the start-up that is
70 % of a JAX process and so most of the suite) ``--reps`` times before the command and after
it, and reports the command's wall time, its CPU (its own and that of every process it waited
for), the cores it kept busy and its CPU in reference units: CPU / the median reference. Two
runs compare by that last figure, whatever the hour.

``--by-module`` (issue 55) runs the command with the pytest plugin
``benchmarks/testcost/testcost.py`` (through ``PYTEST_PLUGINS``, so pytest under nox or
``.ci/run`` is measured too) and prints where the CPU went: per test module its tests, wall time,
the test processes' own CPU, the CPU of the processes the tests waited for, the processes they
started, and the total in seconds and in reference units, costliest first; what no test accounts
for (start-up, collection, xdist, venv builds) is the command's CPU less the modules' sum. A
module that several pytest runs collect (nox's compat sessions) is one row, their sum;
``--costs-dir`` keeps each test's record (one JSON file per worker).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = Path(__file__).resolve().parent / "testcost"  # testcost.py, alone on PYTHONPATH
COST_DIR_ENV = "CACHEDOCTOR_TESTCOST_DIR"  # testcost.DIR_ENV


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


def plugin_env(folder: Path, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``base`` with the testcost plugin loaded by every pytest it starts, recording into
    ``folder``."""
    env = dict(base)
    env["PYTEST_PLUGINS"] = ",".join(p for p in (env.get("PYTEST_PLUGINS"), "testcost") if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGIN_DIR), env.get("PYTHONPATH")) if p)
    env[COST_DIR_ENV] = str(folder)
    return env


def read_costs(folder: Path) -> list[dict[str, Any]]:
    """The plugin's documents, one per process that ran tests."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def module_costs(documents: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per test module (the node id before ``::``), costliest in CPU first."""
    rows: dict[str, dict[str, Any]] = {}
    for document in documents:
        for test in document["tests"]:
            module = test["nodeid"].split("::")[0]
            row = rows.setdefault(
                module,
                {"module": module, "tests": 0, "wall_s": 0.0, "own_cpu_s": 0.0,
                 "children_cpu_s": 0.0, "processes": 0},
            )  # fmt: skip
            row["tests"] += 1
            for field in ("wall_s", "own_cpu_s", "children_cpu_s", "processes"):
                row[field] += test[field]
    for row in rows.values():
        row["cpu_s"] = row["own_cpu_s"] + row["children_cpu_s"]
        for field in ("wall_s", "own_cpu_s", "children_cpu_s", "cpu_s"):
            row[field] = round(row[field], 2)
    return sorted(rows.values(), key=lambda r: (-r["cpu_s"], r["module"]))


def module_table(rows: list[dict[str, Any]], unit: float, command_cpu: float) -> str:
    """The rows as a text table in seconds and reference units, with the total and the rest."""
    head = f"{'module':<56} {'tests':>5} {'wall':>8} {'own':>7} {'children':>8} {'procs':>5} "
    lines = [head + f"{'cpu':>8} {'units':>6}"]

    def line(name: str, tests: Any, wall: Any, own: Any, kids: Any, procs: Any, cpu: float) -> str:
        return (
            f"{name:<56} {tests:>5} {wall:>8} {own:>7} {kids:>8} {procs:>5} "
            f"{cpu:>8.1f} {cpu / unit:>6.0f}"
        )

    for r in rows:
        lines.append(
            line(r["module"], r["tests"], f"{r['wall_s']:.1f}", f"{r['own_cpu_s']:.1f}",
                 f"{r['children_cpu_s']:.1f}", r["processes"], r["cpu_s"])
        )  # fmt: skip
    tests_cpu = sum(r["cpu_s"] for r in rows)
    total = {k: sum(r[k] for r in rows) for k in ("tests", "wall_s", "own_cpu_s", "children_cpu_s")}
    lines.append(
        line("all tests", total["tests"], f"{total['wall_s']:.1f}", f"{total['own_cpu_s']:.1f}",
             f"{total['children_cpu_s']:.1f}", sum(r["processes"] for r in rows), tests_cpu)
    )  # fmt: skip
    lines.append(line("outside the tests", "", "", "", "", "", command_cpu - tests_cpu))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="reference runs before and after")
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    parser.add_argument(
        "--by-module", action="store_true", help="and the cost of each test module (a table)"
    )
    parser.add_argument(
        "--costs-dir", type=Path, help="with --by-module: keep each test's record here"
    )
    parser.add_argument("command", nargs="*", help="default: pytest -n auto (the README's)")
    args = parser.parse_args()
    command = args.command or [sys.executable, "-m", "pytest", "-n", "auto"]
    costs = None
    if args.by_module:
        costs = (args.costs_dir or Path(tempfile.mkdtemp(prefix="testcost-"))).resolve()
        costs.mkdir(parents=True, exist_ok=True)
    env = plugin_env(costs) if costs else None

    before = reference(args.reps)
    cpu0, wall0 = children_cpu(), time.monotonic()
    status = subprocess.run(command, cwd=REPO, env=env, check=False).returncode
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
    table = ""
    if costs:
        rows = module_costs(read_costs(costs))
        for row in rows:
            row["reference_units"] = round(row["cpu_s"] / unit, 1)
        result["by_module"] = rows
        result["outside_tests_cpu_s"] = round(cpu - sum(r["cpu_s"] for r in rows), 1)
        table = module_table(rows, unit, cpu)
        if not args.costs_dir:
            shutil.rmtree(costs)
    print(json.dumps({k: v for k, v in result.items() if k != "by_module"}, indent=2))
    if table:
        print(table)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if max(before + after) > 1.5 * min(before + after):
        print("the reference moved by more than half during the run: compare with care")
    return status


if __name__ == "__main__":
    sys.exit(main())
