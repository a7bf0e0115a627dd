"""The benchmark harness: floors and commands on the same generated caches, as ratios.

    python benchmarks/run.py [--sizes 1000,10000] [--distinct-sizes 1000,10000,large]
                             [--memory-size 50000] [--reps 5]
                             [--out benchmarks/results/NAME.json] [--profile]

Caches (``generate.py``): the *copies* corpora ``cache-NNk`` (``--sizes``: ~300 programs copied
many times, the trend row) and the *distinct* corpora ``dist-NNk`` / ``dist-lrg``
(``--distinct-sizes``: at least half distinct programs with some large HLO; ``large``: distinct
large programs only). For each, in this process and on the same cache (page cache warmed first):

- floors: **L** list the directory and lstat every file; **R** read every byte of every entry;
  **D** read and decompress every entry, single-threaded;
- commands, each in a fresh interpreter (``_child.py``) so that peak memory (``ru_maxrss``) is
  the command's own: ``scan``, ``scan --json``, a repeated ``scan`` (index warm), the deep
  grouping (decode everything, ``duplicate_groups``), ``prune --max-size`` dry run (and JAX's own
  LRU eviction pass over the same directory), ``diff`` of the two largest entries;
- at ``--memory-size`` entries (``cache-50k`` and ``dist-50k``, for the families run): peak RSS
  of a first ``scan``, ``scan --json`` and ``lint`` (each with no index) and of a repeated
  ``scan``, beside L;
- start-up: ``cachedoctor --help`` and ``scan`` of an empty directory, whole process, and whether
  jax or jaxlib was imported (``python -X importtime``).

The goal table (issue 12) has one row per corpus: the first scan's wall time (the command as a
user runs it, with its pool of worker processes) against D on one thread, the repeated scan
against L, and peak RSS at the memory size.

Times are the medians of ``--reps`` repetitions, with min and max. Command times exclude the
interpreter's start-up and imports (that is the start-up target's job); the whole-process wall
time is recorded beside them. Results go to ``benchmarks/results/`` as JSON, and a Markdown table
is printed for ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zstandard

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402

Result = dict[str, Any]


# --- floors ----------------------------------------------------------------------------------


def floor_list(d: str) -> int:
    n = 0
    with os.scandir(d) as it:
        for de in it:
            de.stat(follow_symlinks=False)
            n += 1
    return n


def _entry_paths(d: str) -> list[str]:
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith("-cache"))


def floor_read(d: str) -> int:
    buf = bytearray(1 << 20)
    total = 0
    for p in _entry_paths(d):
        with open(p, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
    return total


def floor_decompress(d: str) -> int:
    total = 0
    dctx = zstandard.ZstdDecompressor()
    for p in _entry_paths(d):
        with open(p, "rb") as fh:
            data = fh.read()
        try:
            if data[:4] == b"\x28\xb5\x2f\xfd":
                reader = dctx.stream_reader(io.BytesIO(data), read_size=1 << 20)
                while chunk := reader.read(1 << 20):
                    total += len(chunk)
            else:
                total += len(zlib.decompress(data))
        except (zstandard.ZstdError, zlib.error):
            pass  # corrupt entries: decompressing them is still part of the floor's work
    return total


def timed(fn: Callable[[], Any], reps: int) -> Result:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return _stats(times)


def _stats(times: list[float]) -> Result:
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "reps": len(times),
    }


# --- commands in subprocesses ----------------------------------------------------------------


def child(op: str, args: dict[str, Any], env: dict[str, str] | None = None) -> Result:
    """Run one operation in a fresh interpreter; its timing plus peak RSS from wait4."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_child.py"), op, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{op} {args} failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    result: Result = json.loads(out.decode().strip().splitlines()[-1])
    result["wall_s"] = wall
    result["maxrss_mb"] = rusage.ru_maxrss / 1024
    result["workers_maxrss_mb"] = result.pop("children_maxrss_kb") / 1024
    return result


def repeat_child(
    op: str,
    args: dict[str, Any],
    reps: int,
    before: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
) -> Result:
    runs = []
    for _ in range(reps):
        if before is not None:
            before()
        runs.append(child(op, args, env))
    out = _stats([r["seconds"] for r in runs])
    out["wall_median_s"] = statistics.median(r["wall_s"] for r in runs)
    out["maxrss_mb"] = max(r["maxrss_mb"] for r in runs)
    out["workers_maxrss_mb"] = max(r["workers_maxrss_mb"] for r in runs)
    extra = {k: v for k, v in runs[-1].items() if k not in ("seconds", "wall_s", "rc")}
    extra.pop("maxrss_mb", None)
    extra.pop("workers_maxrss_mb", None)
    out.update(extra)
    out["rc"] = runs[-1].get("rc")
    return out


def alternating(
    a: tuple[str, dict[str, Any]], b: tuple[str, dict[str, Any]], reps: int
) -> tuple[Result, Result]:
    """``repeat_child`` of two operations run by turns (ab, ba, ab...), so that load on a
    shared machine falls on both alike; ``b`` also gets the ratio b / a of each pair."""
    runs: dict[str, list[Result]] = {"a": [], "b": []}
    for rep in range(reps):
        for which in ("a", "b") if rep % 2 == 0 else ("b", "a"):
            op, args = a if which == "a" else b
            runs[which].append(child(op, args))
    out = []
    for which in ("a", "b"):
        got = runs[which]
        r = _stats([x["seconds"] for x in got])
        r["wall_median_s"] = statistics.median(x["wall_s"] for x in got)
        r["maxrss_mb"] = max(x["maxrss_mb"] for x in got)
        r["workers_maxrss_mb"] = max(x["workers_maxrss_mb"] for x in got)
        r["rc"] = got[-1].get("rc")
        out.append(r)
    for key, field in (("per_pair_ratio", "seconds"), ("per_pair_cpu_ratio", "cpu_s")):
        pairs = [y[field] / x[field] for x, y in zip(runs["a"], runs["b"], strict=True)]
        out[1][key] = {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)}
    for r, got in zip(out, (runs["a"], runs["b"]), strict=True):
        r["cpu_median_s"] = statistics.median(x["cpu_s"] for x in got)
    return out[0], out[1]


def drop_index(d: str) -> None:
    """Remove whatever scan index exists for ``d`` (first-scan measurements start cold)."""
    shutil.rmtree(os.path.join(d, "cachedoctor-index"), ignore_errors=True)
    try:
        from cachedoctor.cache import index_file as where
    except ImportError:  # a baseline from before House III: cache/index.py held it
        try:
            from cachedoctor.cache import index as where  # type: ignore[no-redef]
        except ImportError:
            return
    for path in where.index_locations(d):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def available_commands() -> set[str]:
    from cachedoctor.cli import COMMANDS

    return set(COMMANDS)


def startup(reps: int) -> Result:
    """Whole-process time of ``--help`` and of a scan of an empty dir, and what they import."""
    exe = [sys.executable, "-m", "cachedoctor"]
    out: Result = {}
    with tempfile.TemporaryDirectory() as empty:
        for name, argv in (("help", ["--help"]), ("scan_empty", ["scan", empty])):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                subprocess.run([*exe, *argv], capture_output=True, check=False)
                times.append(time.perf_counter() - t0)
            imp = subprocess.run(
                [sys.executable, "-X", "importtime", "-m", "cachedoctor", *argv],
                capture_output=True,
                text=True,
                check=False,
            )
            modules = [ln.split("|")[-1].strip() for ln in imp.stderr.splitlines() if "|" in ln]
            heavy = sorted(
                {m.split(".")[0] for m in modules if m.split(".")[0] in ("jax", "jaxlib")}
            )
            out[name] = {**_stats(times), "imports_jax": heavy, "modules_imported": len(modules)}
    return out


# --- the run ---------------------------------------------------------------------------------


def machine() -> Result:
    cpu = "unknown"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import importlib.metadata as md

    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "memory_gb": round(mem_gb, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "jax": md.version("jax"),
        "zstandard": md.version("zstandard"),
        "load_avg_at_start": os.getloadavg(),
        "note": "shared machine: other jobs ran at the same time",
    }


def bench_cache(d: str, reps: int, cmds: set[str], goals_only: bool = False) -> Result:
    """Floors and commands on one cache; ``goals_only``: only the first and repeated scan."""
    print(f"-- {d}", file=sys.stderr)
    floor_read(d)  # warm the page cache
    floors = {
        "L": timed(lambda: floor_list(d), reps),
        "R": timed(lambda: floor_read(d), reps),
        "D": timed(lambda: floor_decompress(d), max(1, reps // 2)),
    }
    print(
        f"   floors {json.dumps({k: round(v['median_s'], 3) for k, v in floors.items()})}",
        file=sys.stderr,
    )
    c: dict[str, Result] = {}
    c["scan"] = repeat_child("cli", {"argv": ["scan", d]}, reps, before=lambda: drop_index(d))
    if not goals_only:
        c["scan --json"] = repeat_child(
            "cli", {"argv": ["scan", d, "--json"]}, reps, before=lambda: drop_index(d)
        )
    child("cli", {"argv": ["scan", d]})  # leaves the index behind, if there is one
    child("cli", {"argv": ["scan", d, "--json"]})  # and the JSON text beside the scan memo
    c["scan (repeated)"], c["scan --json (repeated)"] = alternating(
        ("cli", {"argv": ["scan", d]}), ("cli", {"argv": ["scan", d, "--json"]}), reps
    )
    if not goals_only:
        _other_commands(d, reps, cmds, c)
    for name, r in c.items():
        print(f"   {name}: {r['median_s']:.3f}s rss {r['maxrss_mb']:.0f} MB", file=sys.stderr)
    return {"dir": d, "floors": floors, "commands": c}


def _other_commands(d: str, reps: int, cmds: set[str], c: dict[str, Result]) -> None:
    """What a full run measures beside the scans: grouping, prune, JAX's LRU pass, diff."""
    c["deep grouping"] = repeat_child("deep", {"dir": d}, max(1, reps // 2))
    c["deep grouping (1 process)"] = repeat_child("deep", {"dir": d, "workers": 1}, 1)
    size = sum(os.path.getsize(p) for p in _entry_paths(d))
    if "prune" in cmds:
        c["prune --max-size (dry run)"] = repeat_child(
            "cli", {"argv": ["prune", d, "--max-size", f"{max(1, size // 2 // 2**20)}MiB"]}, reps
        )
    c["JAX LRU eviction pass"] = repeat_child("jax_lru", {"dir": d}, reps)
    if "diff" in cmds:
        big = sorted(_entry_paths(d), key=os.path.getsize)[-2:]
        c["diff (two largest entries)"] = repeat_child("cli", {"argv": ["diff", *big]}, reps)


def bench_memory(d: str, entries: int) -> Result:
    """Peak RSS of the commands a user runs on a large cache, each first scan without an index."""
    print(f"-- {d} (memory)", file=sys.stderr)
    floor_read(d)
    out: Result = {"entries": entries, "L": timed(lambda: floor_list(d), 3)}
    for name, argv in (("scan", ["scan", d]), ("scan --json", ["scan", d, "--json"])):
        drop_index(d)
        out[name] = child("cli", {"argv": argv})
    drop_index(d)
    out["lint"] = child("cli", {"argv": ["lint", d]})
    out["scan (repeated)"] = child("cli", {"argv": ["scan", d]})
    for name in ("scan", "scan --json", "lint", "scan (repeated)"):
        r = out[name]
        print(f"   {name}: {r['seconds']:.3f}s rss {r['maxrss_mb']:.0f} MB", file=sys.stderr)
    return out


FLOOR_OF = {
    "scan": "R",
    "scan --json": "R",
    "scan (repeated)": "L",
    "scan --json (repeated)": "L",
    "deep grouping": "D",
    "deep grouping (1 process)": "D",
    "prune --max-size (dry run)": "L",
    "JAX LRU eviction pass": "L",
    "diff (two largest entries)": "D",
}


def add_ratios(res: Result) -> None:
    for name, r in res["commands"].items():
        floor = FLOOR_OF.get(name)
        if floor is None:
            continue
        f = res["floors"][floor]["median_s"]
        r["floor"] = floor
        r["ratio"] = r["median_s"] / f
        r["ratio_min"] = r["min_s"] / f
        r["ratio_max"] = r["max_s"] / f


def targets(results: Result, cores: int) -> list[Result]:
    out = []
    ten = results["caches"].get("10000")
    if ten:
        cmd, fl = ten["commands"], ten["floors"]
        R, L, D = (fl[k]["median_s"] for k in "RLD")
        out.append(_target("scan ≤ 1.3 × R (10k)", cmd["scan"]["median_s"], 1.3 * R))
        out.append(
            _target("repeated scan ≤ 2 × L (10k)", cmd["scan (repeated)"]["median_s"], 2 * L)
        )
        if "deep grouping" in cmd:  # not measured with --goals-only
            out.append(
                _target(
                    f"deep grouping ≤ 1.2 × D / {cores} cores (10k)",
                    cmd["deep grouping"]["median_s"],
                    1.2 * D / cores,
                )
            )
    for size, res in results["caches"].items():  # issue 26
        cmd = res["commands"]
        if "scan --json (repeated)" in cmd:
            text = cmd["scan (repeated)"]["median_s"]
            out.append(
                _target(
                    f"repeated scan --json ≤ 1.2 × repeated scan ({int(size) // 1000}k)",
                    cmd["scan --json (repeated)"]["median_s"],
                    1.2 * text,
                )
            )
    mem = results.get("memory")
    if mem:
        out.append(
            _target(
                f"scan peak memory ≤ 200 MB ({mem['entries']} entries)",
                mem["scan"]["maxrss_mb"],
                200,
                unit="MB",
            )
        )
    st = results["startup"]
    for name, label in (("help", "`cachedoctor --help`"), ("scan_empty", "`scan` of an empty dir")):
        t = _target(f"{label} ≤ 0.5 s, no jax import", st[name]["median_s"], 0.5)
        t["met"] = t["met"] and not st[name]["imports_jax"]
        out.append(t)
    return out


def corpus_rows(results: Result) -> list[tuple[str, Result, Result, Result | None]]:
    """(label, corpus description, bench_cache result, memory result) for every corpus run."""
    described = results["corpus"]
    rows: list[tuple[str, Result, Result, Result | None]] = []
    for key, res in results["caches"].items():
        rows.append((generate.cache_name(int(key)), described["caches"][key], res, None))
    dist = described.get("distinct", {}).get("caches", {})
    for key, res in results.get("distinct_caches", {}).items():
        rows.append((generate.dist_name(key), dist[key], res, None))
    for mem_key, label, info in (
        ("memory", "cache", described["caches"]),
        ("distinct_memory", "dist", dist),
    ):
        mem = results.get(mem_key)
        if mem and "L" in mem:
            name = (generate.cache_name if label == "cache" else generate.dist_name)(mem["entries"])
            rows.append((name, info[str(mem["entries"])], {}, mem))
    return rows


def _ms(seconds: float) -> str:
    """Milliseconds, with a decimal below 10 ms (the floors of the small corpora)."""
    return f"{seconds * 1000:,.1f} ms" if seconds < 0.01 else f"{seconds * 1000:,.0f} ms"


def goals(*runs: Result) -> list[str]:
    """Issue 12's goal table, one row per corpus of every run given (Markdown lines)."""
    cores = runs[0]["machine"]["cores"]
    lines = [
        f"| corpus | entries (distinct) | first scan: wall, {cores} workers | D: 1 thread "
        "| × D | goal | repeated scan | L | × L | goal | peak RSS scan / --json / lint |",
        "|---|---:|---:|---:|---:|:---:|---:|---:|---:|:---:|---:|",
    ]
    for name, info, res, mem in (row for results in runs for row in corpus_rows(results)):
        copies = name.startswith("cache")
        limit = 1.0 if copies else 3.0
        first = again = "—"
        first_goal = again_goal = "—"
        d_ms = l_ms = ratio_d = ratio_l = "—"
        if res:
            fl, cmd = res["floors"], res["commands"]
            d, lst = fl["D"]["median_s"], fl["L"]["median_s"]
            t = cmd["scan"]["median_s"]
            first, d_ms, ratio_d = _ms(t), _ms(d), f"{t / d:.1f}"
            first_goal = f"≤ {limit:.0f} × D {'✅' if t <= limit * d else '❌'}"
            rep = cmd["scan (repeated)"]["median_s"]
        else:
            assert mem is not None
            lst, rep = mem["L"]["median_s"], mem["scan (repeated)"]["seconds"]
            first = _ms(mem["scan"]["seconds"])
        again, l_ms, ratio_l = _ms(rep), _ms(lst), f"{rep / lst:.1f}"
        if info["entries"] >= 10_000:
            again_goal = f"≤ 2 × L {'✅' if rep <= 2 * lst else '❌'}"
        rss = "—"
        if mem:
            peaks = [mem[c]["maxrss_mb"] for c in ("scan", "scan --json", "lint")]
            rss = " / ".join(f"{v:.0f}" for v in peaks) + " MB "
            rss += "✅" if max(peaks) <= 200 else "❌"
        lines.append(
            f"| `{name}` | {info['entries']:,} ({info['distinct_programs']:,}) | {first} | {d_ms} "
            f"| {ratio_d} | {first_goal} | {again} | {l_ms} | {ratio_l} | {again_goal} | {rss} |"
        )
    return lines


def _target(name: str, value: float, limit: float, unit: str = "s") -> Result:
    return {"target": name, "value": value, "limit": limit, "unit": unit, "met": value <= limit}


def markdown(results: Result) -> str:
    lines = []
    m = results["machine"]
    lines.append(
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, Linux {m['kernel']}, "
        f"Python {m['python']}, jax {m['jax']}, zstandard {m['zstandard']} "
        f"(run {results['started']}, load average at start {m['load_avg_at_start'][0]:.1f})."
    )
    lines.append("")
    distinct = results["corpus"].get("distinct", {}).get("caches", {})
    sections = [
        (f"{int(key):,} entries", results["corpus"]["caches"].get(key, {}), res)
        for key, res in results["caches"].items()
    ]
    sections += [
        (f"`{generate.dist_name(key)}`", distinct.get(key, {}), res)
        for key, res in results.get("distinct_caches", {}).items()
    ]
    for title, corpus, res in sections:
        large = corpus.get("large_programs")
        lines.append(
            f"**{title}** ({corpus.get('entries', 0):,} entries, "
            f"{corpus.get('entry_bytes', 0) / 2**20:,.0f} MiB of "
            f"entries, {corpus.get('distinct_programs', 0):,} distinct programs"
            + (f" of which {large} large" if large is not None else "")
            + f", {corpus.get('relocated', '?')} relocated, {corpus.get('corrupt', '?')} corrupt)"
        )
        lines.append("")
        fl = res["floors"]
        lines.append(
            "Floors: "
            + ", ".join(
                f"{k} = {fl[k]['median_s'] * 1000:,.0f} ms ({fl[k]['min_s'] * 1000:,.0f}–"
                f"{fl[k]['max_s'] * 1000:,.0f})"
                for k in "LRD"
            )
        )
        lines.append("")
        lines.append(
            "| command | median | min–max | × floor (min–max) | whole process | peak RSS |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|")
        for name, r in res["commands"].items():
            ratio = (
                f"{r['ratio']:.2f} × {r['floor']} ({r['ratio_min']:.2f}–{r['ratio_max']:.2f})"
                if "ratio" in r
                else ""
            )
            rss = f"{r['maxrss_mb']:.0f} MB"
            if r.get("workers_maxrss_mb"):
                rss += f" (+ workers ≤ {r['workers_maxrss_mb']:.0f} MB each)"
            lines.append(
                f"| {name} | {r['median_s'] * 1000:,.0f} ms | {r['min_s'] * 1000:,.0f}–"
                f"{r['max_s'] * 1000:,.0f} ms | {ratio} | {r['wall_median_s'] * 1000:,.0f} ms "
                f"| {rss} |"
            )
        json_again = res["commands"].get("scan --json (repeated)", {})
        pair, cpu = json_again.get("per_pair_ratio"), json_again.get("per_pair_cpu_ratio")
        if pair and cpu:
            lines.append("")
            lines.append(
                f"Repeated `scan --json` / repeated `scan`, run by turns: wall time median "
                f"{pair['median']:.2f} (per pair {pair['min']:.2f}–{pair['max']:.2f}), CPU time "
                f"median {cpu['median']:.2f} ({cpu['min']:.2f}–{cpu['max']:.2f})."
            )
        lines.append("")
    dist = results.get("distinct")
    if dist:
        d_floor = dist["D"]["median_s"]
        lines.append(
            f"**Distinct programs only** (`cache-src`: each of the "
            f"{results['corpus']['compiled']['programs']} programs once, nothing to share): "
            f"D = {d_floor * 1000:,.0f} ms"
        )
        lines.append("")
        lines.append("| command | median | min–max | × D | peak RSS |")
        lines.append("|---|---:|---:|---:|---:|")
        for name in ("deep grouping", "deep grouping (1 process)"):
            r = dist[name]
            lines.append(
                f"| {name} | {r['median_s'] * 1000:,.0f} ms | {r['min_s'] * 1000:,.0f}–"
                f"{r['max_s'] * 1000:,.0f} ms | {r['median_s'] / d_floor:.1f} | "
                f"{r['maxrss_mb']:.0f} MB |"
            )
        lines.append("")
    for key, name in (("memory", generate.cache_name), ("distinct_memory", generate.dist_name)):
        mem = results.get(key)
        if not mem:
            continue
        corpus = results["corpus"]["caches"] if key == "memory" else distinct
        info = corpus.get(str(mem["entries"]), {})
        lines.append(
            f"**`{name(mem['entries'])}`** ({mem['entries']:,} entries, "
            f"{info.get('entry_bytes', 0) / 2**20:,.0f} MiB of entries, "
            f"{info.get('distinct_programs', 0):,} distinct programs), each first scan without "
            "an index:"
        )
        lines.append("")
        lines.append("| command | time | whole process | peak RSS |")
        lines.append("|---|---:|---:|---:|")
        for command in ("scan", "scan --json", "lint", "scan (repeated)"):
            r = mem.get(command)
            if r is None:  # results from before lint and scan --json were measured here
                continue
            label = command if command != "scan" else "scan (first)"
            rss = f"{r['maxrss_mb']:.0f} MB"
            if r["workers_maxrss_mb"]:
                rss += f" (workers ≤ {r['workers_maxrss_mb']:.0f} MB each)"
            lines.append(f"| {label} | {r['seconds']:.1f} s | {r['wall_s']:.1f} s | {rss} |")
        lines.append("")
    if "hook" in results:
        lines.append("**Hook key computation** (`benchmarks/bench_hook.py`):")
        lines.append("")
        lines.append("```")
        lines.append(results["hook"]["output"].strip())
        lines.append("```")
        lines.append("")
    else:
        lines.append("Hook key computation: not measured in this run.")
        lines.append("")
    missing = [c for c in ("prune", "diff") if c not in results["commands_available"]]
    if missing:
        lines.append(
            f"Not yet registered, so not measured: {', '.join(missing)} (measured automatically "
            "once registered; `prune` is compared with JAX's LRU pass above)."
        )
        lines.append("")
    lines.append(
        "**Goals of issue 12**, one row per corpus: a first scan is the command's wall time "
        "after its imports, with its worker pool, against D decompressed on one thread; ≤ 1 × D "
        "applies to the copies corpora (`cache-*`), ≤ 3 × D to the distinct ones (`dist-*`). "
        "Repeated scans against L; peak RSS at the memory size."
    )
    lines.append("")
    lines.extend(goals(results))
    lines.append("")
    lines.append("| target | measured | limit | met |")
    lines.append("|---|---:|---:|:---:|")
    for t in results["targets"]:
        fmt = (lambda v: f"{v:.0f} MB") if t["unit"] == "MB" else (lambda v: f"{v * 1000:,.0f} ms")
        lines.append(
            f"| {t['target']} | {fmt(t['value'])} | {fmt(t['limit'])} | "
            f"{'✅ met' if t['met'] else '❌ not met'} |"
        )
    return "\n".join(lines)


def profile(d: str, out_dir: Path, tag: str) -> dict[str, str]:
    """cProfile top entries, in this process: a first scan decoded serially (so the decoding
    shows up, not the wait on workers), a repeated scan, and the deep grouping, serially."""
    from cachedoctor.cache import listdir, reader
    from cachedoctor.cli import main
    from cachedoctor.core.scan.rules.keys import duplicate_groups

    def cli_scan() -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["scan", d])

    def first_scan() -> None:
        drop_index(d)
        os.environ["CACHEDOCTOR_WORKERS"] = "1"
        try:
            cli_scan()
        finally:
            del os.environ["CACHEDOCTOR_WORKERS"]

    def deep() -> None:
        duplicate_groups(list(reader.iter_entries(listdir.list_cache(d))))

    texts = {}
    for name, fn in (("scan-serial", first_scan), ("scan-repeated", cli_scan), ("deep", deep)):
        reader.clear_memos()
        prof = cProfile.Profile()
        prof.enable()
        fn()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        path = out_dir / f"profile-{tag}-{name}.txt"
        path.write_text(s.getvalue())
        texts[name] = str(path.relative_to(REPO))
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000", help="copies corpora (cache-NNk)")
    ap.add_argument(
        "--distinct-sizes",
        default="1000,10000,large",
        help="distinct corpora (dist-NNk; large: dist-lrg); '' for none",
    )
    ap.add_argument("--memory-size", type=int, default=50000, help="0 to skip")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true", help="also write cProfile top entries")
    ap.add_argument(
        "--goals-only",
        action="store_true",
        help="per cache, only what the goal table needs: floors, first and repeated scan",
    )
    ap.add_argument(
        "--table",
        metavar="JSON",
        nargs="+",
        help="only print the tables of earlier runs (several: and one goal table for all)",
    )
    args = ap.parse_args()
    if args.table:
        runs = [json.loads(Path(name).read_text()) for name in args.table]
        print("\n\n".join(markdown(results) for results in runs))
        if len(runs) > 1:
            print("\n**Goals of issue 12, all runs above**\n\n" + "\n".join(goals(*runs)))
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    memory = [args.memory_size] if args.memory_size else []
    all_sizes = tuple(sorted({*sizes, *memory})) if sizes else ()
    distinct: list[int | str] = [
        generate.LARGE if s == generate.LARGE else int(s)
        for s in args.distinct_sizes.split(",")
        if s
    ]
    distinct_sizes = (
        tuple(sorted({*(s for s in distinct if isinstance(s, int)), *memory})) if distinct else None
    )
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    corpus = generate.ensure_corpus(all_sizes, distinct_sizes=distinct_sizes)
    caches: dict[str, dict[str, Any]] = corpus["caches"]  # type: ignore[assignment]
    dist_caches: dict[str, dict[str, Any]] = (
        corpus["distinct"]["caches"] if distinct else {}  # type: ignore[index]
    )
    cmds = available_commands()
    results: Result = {
        "schema_version": 1,
        "started": started,
        "machine": machine(),
        "corpus": corpus,
        "commands_available": sorted(cmds),
        "caches": {},
    }
    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    for size in sizes:
        d = caches[str(size)]["path"]
        res = bench_cache(d, args.reps, cmds, args.goals_only)
        add_ratios(res)
        results["caches"][str(size)] = res
        if args.profile:
            res["profiles"] = profile(d, out_dir, f"{size}")
    results["distinct_caches"] = {}
    for which in distinct:
        d = dist_caches[str(which)]["path"]
        res = bench_cache(d, args.reps, cmds, args.goals_only)
        add_ratios(res)
        results["distinct_caches"][str(which)] = res
    # the distinct programs alone: no duplicate to share work between
    src = str(generate.bench_dir() / "cache-src")
    if sizes and not args.goals_only:
        floor_read(src)
        results["distinct"] = {
            "dir": src,
            "D": timed(lambda: floor_decompress(src), args.reps),
            "deep grouping": repeat_child("deep", {"dir": src}, args.reps),
            "deep grouping (1 process)": repeat_child(
                "deep", {"dir": src, "workers": 1}, args.reps
            ),
        }
    if args.memory_size:  # for each family run: the copies and the distinct corpora
        if sizes:
            d = caches[str(args.memory_size)]["path"]
            results["memory"] = bench_memory(d, args.memory_size)
        if distinct:
            d = dist_caches[str(args.memory_size)]["path"]
            results["distinct_memory"] = bench_memory(d, args.memory_size)
    hook = HERE / "bench_hook.py"  # written on the hook branch; measured here when present
    if hook.exists() and not args.goals_only:
        proc = subprocess.run(
            [sys.executable, str(hook)], capture_output=True, text=True, check=False
        )
        results["hook"] = {"rc": proc.returncode, "output": proc.stdout[-20000:]}
    results["startup"] = startup(args.reps)
    results["targets"] = targets(results, results["machine"]["cores"])
    results["finished"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    md = markdown(results)
    results["markdown"] = md
    name = args.out or out_dir / f"bench-{started.replace(':', '')}.json"
    Path(name).write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "latest.md").write_text(md + "\n")
    print(md)
    print(f"\nresults: {name}", file=sys.stderr)


if __name__ == "__main__":
    main()
