"""A cache restored elsewhere (issue 26): the first scan of a copy, with and without its index.

A CI runner restores the JAX cache onto a fresh machine: a new path, new inodes and mtimes, an
empty user cache dir. This harness makes that with ``cp -r`` from a copy of the corpus that was
scanned once (its index in ``cachedoctor-index/``, as the last CI run left it), then times, in
alternating repetitions, each in a fresh interpreter (``_child.py``, the command's own time):

- **travel**: ``scan`` of the restored copy, fresh ``XDG_CACHE_HOME``: served from the index
  that came with the copy (each entry hashed, none decoded);
- **cold**: the same restored copy without its index folder: today's first scan (everything
  decoded, on all cores);
- **in place**: the command on the copy it was first run on (its index beside it, same path),
  what a runner that kept its disk pays;

and the floors on the restored copy in this process: **L** (list and ``lstat`` every file) and
**R** (read every byte of every entry). The target is travel <= 2 x (L + R). ``--hash`` also
times XXH3-128 against BLAKE2b over the corpus's entry bytes in memory (the digest's choice).
``--baseline OTHER/src`` times, instead of cold, the travel scan by another checkout's code
(its own index, written by a scan of its own), alternating, with the ratio of each pair: the
floors move +-20 % between runs on a shared machine, a pair's ratio much less.

    python benchmarks/bench_restore.py [--corpus cache-10k,dist-10k] [--reps 5] [--hash]
                                       [--command scan|lint] [--json-output]
                                       [--baseline OTHER/src] [--work DIR]
                                       [--out benchmarks/results/NAME.json]

The corpora come from ``$CACHEDOCTOR_BENCH_DIR`` (``generate.py``); they are only read.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as harness  # noqa: E402

RACY_S = 2.0  # cachedoctor.cache.index.RACY_S

Result = dict[str, Any]


def restore(base: Path, dst: Path, keep_index: bool) -> None:
    """``cp -r``: new inodes, mtimes and ctimes, as a cache restored on another machine."""
    shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["cp", "-r", str(base), str(dst)], check=True)
    if not keep_index:
        shutil.rmtree(dst / "cachedoctor-index")


def scan_once(d: Path, xdg: Path, argv: list[str], code: str | None = None) -> Result:
    """One scan in a fresh interpreter, by this checkout or by the code in ``code``."""
    shutil.rmtree(xdg, ignore_errors=True)
    env = {"XDG_CACHE_HOME": str(xdg), "CACHEDOCTOR_INDEX_IN_CACHE": "1"}
    if code is not None:
        env["PYTHONPATH"] = code
    return harness.child("cli", {"argv": [argv[0], str(d), *argv[1:]]}, env)


def _fallback_index(xdg: Path, cache: Path) -> bool:
    """Whether the user cache dir holds an index of ``cache`` (``index_file.fallback_path``)."""
    name = hashlib.sha256(os.fsencode(os.path.realpath(cache))).hexdigest()[:32]
    return (xdg / "cachedoctor" / "index" / f"{name}.sqlite").exists()


def bench_corpus(
    src: Path, work: Path, reps: int, argv: list[str], baseline: str | None = None
) -> Result:
    base, restored, xdg = work / "base", work / "restored", work / "xdg"
    other_base = work / "baseline-base"  # the baseline's copy, holding the baseline's index
    work.mkdir(parents=True, exist_ok=True)
    bases = [(base, None)] + ([(other_base, baseline)] if baseline else [])
    for copy, _ in bases:
        shutil.rmtree(copy, ignore_errors=True)
        subprocess.run(["cp", "-r", str(src), str(copy)], check=True)
    # the run before, on files older than the index's racy window (a file changed in the last
    # RACY_S is never stored: a copy made just now would leave most rows out of the index)
    time.sleep(RACY_S + 0.5)
    for copy, code in bases:
        scan_once(copy, xdg, ["scan"], code)  # its index is written into the cache
    index_bytes = sum(p.stat().st_size for p in (base / "cachedoctor-index").iterdir())
    with contextlib.closing(sqlite3.connect(base / "cachedoctor-index" / "index.sqlite")) as db:
        index_rows = db.execute("SELECT count(*) FROM entries").fetchone()[0]
    other = "baseline" if baseline else "cold"
    runs: dict[str, list[Result]] = {"travel": [], other: [], "in_place": []}
    floors: dict[str, list[float]] = {"L": [], "R": []}
    for rep in range(reps):
        order = ("travel", other, "in_place") if rep % 2 == 0 else ("in_place", other, "travel")
        for variant in order:  # alternating: load on the machine hits both
            if variant == "in_place":  # the cache where its index was written: no restore
                harness.floor_read(str(base))
                runs[variant].append(scan_once(base, xdg, argv))
                continue
            code = baseline if variant == "baseline" else None
            restore(other_base if code else base, restored, keep_index=variant != "cold")
            harness.floor_read(str(restored))  # the page cache as after a restore
            runs[variant].append(scan_once(restored, xdg, argv, code))
            if variant != "cold":  # the index came with the copy: none in the user dir
                runs[variant][-1]["user_dir_untouched"] = not _fallback_index(xdg, restored)
        for name, fn in (("L", harness.floor_list), ("R", harness.floor_read)):
            t0 = time.perf_counter()
            fn(str(restored))
            floors[name].append(time.perf_counter() - t0)
    for folder in (restored, base, other_base, xdg):
        shutil.rmtree(folder, ignore_errors=True)
    out: Result = {
        "corpus": src.name,
        "argv": argv,
        "index_bytes": index_bytes,
        "index_rows": index_rows,
    }
    out["floors"] = {k: harness._stats(v) for k, v in floors.items()}
    for variant, results in runs.items():
        stats = harness._stats([r["seconds"] for r in results])
        stats["wall_median_s"] = statistics.median(r["wall_s"] for r in results)
        stats["maxrss_mb"] = max(r["maxrss_mb"] for r in results)
        stats["all_s"] = [r["seconds"] for r in results]
        out[variant] = stats
    out["travel"]["user_dir_untouched"] = all(r["user_dir_untouched"] for r in runs["travel"])
    floor = out["floors"]["L"]["median_s"] + out["floors"]["R"]["median_s"]
    out["travel_over_L_plus_R"] = out["travel"]["median_s"] / floor
    out["travel_over_L_plus_R_range"] = [
        min(out["travel"]["all_s"]) / floor,
        max(out["travel"]["all_s"]) / floor,
    ]
    out[f"travel_over_{other}"] = out["travel"]["median_s"] / out[other]["median_s"]
    # the goal of issue 57: a restored copy costs at most its in-place run plus 2 x (L + R)
    out["travel_minus_in_place_over_L_plus_R"] = (
        out["travel"]["median_s"] - out["in_place"]["median_s"]
    ) / floor
    if baseline:
        out["baseline_code"] = baseline
        out["baseline"]["user_dir_untouched"] = all(
            r["user_dir_untouched"] for r in runs["baseline"]
        )
        pairs = [
            t["seconds"] / b["seconds"]
            for t, b in zip(runs["travel"], runs["baseline"], strict=True)
        ]
        out["travel_over_baseline_per_pair"] = {
            "median": statistics.median(pairs),
            "min": min(pairs),
            "max": max(pairs),
        }
        out["baseline_over_L_plus_R"] = out["baseline"]["median_s"] / floor
    return out


def bench_hash(src: Path, reps: int) -> Result:
    """XXH3-128 against BLAKE2b-128 over every entry's bytes, already in memory, and R."""
    import xxhash

    paths = sorted(p for p in src.iterdir() if p.name.endswith("-cache"))
    datas = [p.read_bytes() for p in paths]
    fns = {
        "xxh3_128": lambda: [xxhash.xxh3_128(b).hexdigest() for b in datas],
        "blake2b_128": lambda: [hashlib.blake2b(b, digest_size=16).hexdigest() for b in datas],
        "R": lambda: harness.floor_read(str(src)),
    }
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    out: Result = {"corpus": src.name, "bytes": sum(map(len, datas)), "entries": len(datas)}
    out.update({k: harness._stats(v) for k, v in times.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="cache-10k,dist-10k")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--hash", action="store_true", help="also time XXH3 against BLAKE2b")
    parser.add_argument("--json-output", action="store_true", help="time `scan --json`")
    parser.add_argument(
        "--command",
        choices=("scan", "lint"),
        default="scan",
        help="what runs on the restored copy: scan, or lint (a CI job's first step)",
    )
    parser.add_argument("--baseline", help="another checkout's src/: its travel scan, not cold")
    parser.add_argument("--work", help="where the copies go (default: a temporary folder)")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    bench_dir = Path(os.environ.get("CACHEDOCTOR_BENCH_DIR", "~/.cache/cachedoctor-bench"))
    argv = [args.command, *(["--json"] if args.json_output else [])]
    results: Result = {"machine": harness.machine(), "reps": args.reps, "corpora": []}
    work_root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-restore-"))
    try:
        for name in args.corpus.split(","):
            src = bench_dir.expanduser() / name
            if args.hash:
                results.setdefault("hash", []).append(bench_hash(src, args.reps))
                print(json.dumps(results["hash"][-1]), flush=True)
            res = bench_corpus(src, work_root / name, args.reps, argv, args.baseline)
            results["corpora"].append(res)
            print(json.dumps({k: v for k, v in res.items() if k != "floors"}), flush=True)
            print(json.dumps(res["floors"]), flush=True)
    finally:
        if not args.work:
            shutil.rmtree(work_root, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
