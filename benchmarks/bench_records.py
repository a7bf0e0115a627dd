"""`stats` and `lint` over many stats records, first (no index) and repeated (issue 26).

    python benchmarks/bench_records.py [--records 5000] [--modules 24] [--reps 5]
        [--baseline-src DIR] [--workdir DIR] [--out benchmarks/results/NAME.json]

The cache: a program that jits ``--modules`` distinct functions runs three times with
``CACHEDOCTOR_HOOK=stats`` (one cold process that misses and writes every module, two warm ones
that hit), so the cache holds real entries and three genuine records, each written by the
recorder from JAX's own monitoring events. Only the multiplication is synthetic: the three
records are copied to ``--records`` files as the processes of a multi-host job would leave
them, each copy with its own host (16 hosts), pid and start/end times (spread over 30 days,
each keeping its process's duration), named as the recorder names a record
(``stablekeys.stats.record_name``) and written as it writes one (sorted keys); the counters are
the real ones.

Measured, each in a fresh interpreter as a user runs it (the whole process: start-up and
imports count), with stdout to /dev/null: ``stats``, ``stats --json`` and ``lint``, each
*first* (no index for the cache: the user cache dir emptied before) and *repeated* (the same
command just run). Beside them, in this process: the floor **F**, listing
``cachedoctor-stats/``, stat-ing and reading every byte of every record (page cache warm), and
**P**, the start-up of a bare interpreter (``python -c pass``).

Each variant's ``src`` is byte-compiled first (``compileall``, as ``pip install`` does), so no
run pays for compiling the package: with ``PYTHONDONTWRITEBYTECODE`` set (as on the machine
these ran on) every run otherwise compiles every module it imports, 0.1-0.3 s of each.

With ``--baseline-src`` (a ``src`` folder of another checkout, e.g. ``git archive main src``)
the same commands run with that code first on ``PYTHONPATH``, alternating with this checkout's
in every repetition, each with its own user cache dir. Medians over ``--reps``, with min and
max; ratios are against F measured in the same run. The machine may be shared: compare the
ratios, and the spread.
"""

from __future__ import annotations

import argparse
import compileall
import copy
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src"))
from bench_stats import PROGRAM  # noqa: E402

from cachedoctor.layout import STATS_DIRNAME  # noqa: E402
from cachedoctor.stablekeys.stats import record_name  # noqa: E402

HOSTS = 16
SPAN_S = 30 * 86400.0

COMMANDS: dict[str, list[str]] = {
    "stats": ["stats"],
    "stats --json": ["stats", "--json"],
    "lint": ["lint"],
}


def _env(cache: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDOCTOR_", "JAX_"))}
    env["JAX_PLATFORMS"] = "cpu"
    env["CACHEDOCTOR_CONFIG"] = os.path.join(tempfile.gettempdir(), "no-cachedoctor.toml")
    if cache is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    return env | extra


def build(cache: Path, records: int, modules: int) -> dict[str, Any]:
    """The cache with its three real records, then the copies; what was built."""
    cache.mkdir(parents=True)
    env = _env(cache, CACHEDOCTOR_HOOK="stats", PYTHONPATH=str(REPO / "src"))
    for _ in range(3):
        subprocess.run(
            [sys.executable, "-c", PROGRAM, str(modules)], env=env, check=True, capture_output=True
        )
    folder = cache / STATS_DIRNAME
    real = [json.loads(p.read_bytes()) for p in sorted(folder.glob("*.json"))]
    assert len(real) == 3, f"expected 3 real records, found {len(real)}"
    rng = random.Random(26)
    newest = max(float(r["end"]) for r in real)
    for n in range(records - len(real)):
        doc = copy.deepcopy(real[n % len(real)])
        took = float(doc["end"]) - float(doc["start"])
        doc["host"] = f"node-{n % HOSTS:02d}"
        doc["pid"] = 1000 + n // HOSTS
        doc["start"] = newest - SPAN_S + rng.random() * (SPAN_S - took - 60)
        doc["end"] = doc["start"] + took
        path = folder / record_name(doc)
        path.write_bytes(json.dumps(doc, sort_keys=True).encode())
        os.utime(path, (doc["end"], doc["end"]))
    sizes = [p.stat().st_size for p in folder.iterdir()]
    return {
        "records": len(sizes),
        "bytes": sum(sizes),
        "real_record_bytes": [len(json.dumps(r, sort_keys=True)) for r in real],
        "modules_per_record": modules,
        "entries": len(list(cache.glob("*-cache"))),
    }


def floor_read(folder: Path) -> int:
    """F: list the folder, stat and read every byte of every record."""
    total = 0
    with os.scandir(folder) as it:
        for de in it:
            de.stat(follow_symlinks=False)
            with open(de.path, "rb", buffering=0) as fh:
                total += len(fh.read())
    return total


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """The command's wall time and CPU time (user + system, from ``wait4``: on a shared
    machine the CPU time is the steadier of the two)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, rusage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # lint exits 1 on a failing finding
        raise RuntimeError(f"{argv} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return took, rusage.ru_utime + rusage.ru_stime


def _summary(times: list[float]) -> dict[str, Any]:
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "reps": len(times),
    }


def measure(cache: Path, variants: dict[str, str], reps: int, work: Path) -> dict[str, Any]:
    """Every command first and repeated, for each variant (name -> src folder), alternating."""
    for src in variants.values():
        compileall.compile_dir(src, quiet=1)  # as installed: no run compiles the package
    times: dict[str, dict[str, list[tuple[float, float]]]] = {v: {} for v in variants}
    floor: list[float] = []
    startup: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        floor_read(cache / STATS_DIRNAME)
        floor.append(time.perf_counter() - t0)
        startup.append(_timed([sys.executable, "-c", "pass"], _env())[0])
        for variant, src in variants.items():
            xdg = work / f"xdg-{variant.replace(' ', '_')}"
            env = _env(XDG_CACHE_HOME=str(xdg), PYTHONPATH=src)
            for label, args in COMMANDS.items():
                shutil.rmtree(xdg, ignore_errors=True)  # first: no index for the cache
                argv = [sys.executable, "-m", "cachedoctor", *args, str(cache)]
                times[variant].setdefault(f"{label} first", []).append(_timed(argv, env))
                times[variant].setdefault(f"{label} repeated", []).append(_timed(argv, env))
    f = statistics.median(floor)
    out: dict[str, Any] = {
        "floor_F": _summary(floor),
        "python_startup_P": _summary(startup),
    }
    for variant, rows in times.items():
        out[variant] = {}
        for label, runs in rows.items():
            wall = [w for w, _ in runs]
            out[variant][label] = {
                **_summary(wall),
                "ratio_F": statistics.median(wall) / f,
                "cpu": _summary([c for _, c in runs]),
            }
    return out


def table(result: dict[str, Any], variants: list[str]) -> str:
    f = result["floor_F"]["median_s"]
    lines = [
        f"F (list + read every record) {f * 1000:.1f} ms; "
        f"P (python -c pass) {result['python_startup_P']['median_s']:.3f} s",
        "",
        "| command | "
        + " | ".join(f"{v} wall s, median (min-max) | {v} CPU s" for v in variants)
        + " |",
        "|---|" + "---|---|" * len(variants),
    ]
    for label in result[variants[0]]:
        cells = []
        for v in variants:
            r = result[v][label]
            cells.append(f"{r['median_s']:.2f} ({r['min_s']:.2f}-{r['max_s']:.2f})")
            cells.append(f"{r['cpu']['median_s']:.2f}")
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--modules", type=int, default=18)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--baseline-src", help="another checkout's src folder, alternated")
    parser.add_argument("--workdir", help="where the cache goes (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the built cache")
    parser.add_argument("--cache", help="measure this records cache (one --keep left) instead")
    parser.add_argument("--out", help="write the JSON result here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-records-", dir=args.workdir))
    try:
        if args.cache:
            cache = Path(args.cache)
            folder = cache / STATS_DIRNAME
            sizes = [p.stat().st_size for p in folder.iterdir()]
            built = {"records": len(sizes), "bytes": sum(sizes), "reused": str(cache)}
        else:
            cache = work / "cache"
            built = build(cache, args.records, args.modules)
        variants = {"candidate": str(REPO / "src")}
        if args.baseline_src:
            variants = {"baseline": os.path.abspath(args.baseline_src), **variants}
        result = {
            "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "cpus": os.cpu_count(),
            "built": built,
            "reps": args.reps,
            **measure(cache, variants, args.reps, work),
        }
        print(json.dumps(result, indent=2))
        print(table(result, list(variants)))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
