"""Build realistic JAX caches of 1k, 10k and 50k entries for the benchmarks, from real compilations.

    python benchmarks/generate.py [--sizes 1000,10000,50000] [--distinct-sizes 1000,10000,50000]
                                  [--force]

Where: ``$CACHEDOCTOR_BENCH_DIR`` (default ``~/.cache/cachedoctor-bench``), outside the repository.
A corpus is reused while its stamp (generator version, JAX version, sizes) matches.

How, for the copies corpora:

1. *Compile* ~320 distinct real programs with the installed JAX (``_compile_programs.py``: small
   elementwise jits up to 300-layer unrolled stacks and 6 MB constant-heavy programs, including
   sharded and custom_partitioning ones) into ``cache-src/``, two JAX processes at once, many
   programs per process. A subset is compiled again into ``elsewhere-cache/``: those entries name
   another cache path in their compile options (relocated entries).
2. *Lay out* each cache ``cache-NNk/`` from those real entries: every program once under its real
   key, then copies under new random keys (what unstable keys produce: the same executable
   written again and again), 3% relocated entries, 1% corrupt files (real entries cut short at a
   random offset), an ``-atime`` file per entry (LRU eviction in use) and mtimes spread over 30
   days. The entries of ``cache-src`` name their cache path inside the payload; it is rewritten
   (same length, so no protobuf length changes) to the target cache's path and recompressed as JAX
   does (zstd, default level), so that copies are not all "relocated".

These *copies* corpora (``cache-NNk``, ~300 programs each copied many times) are kept as they are,
so that the trend stays visible. Beside them, the *distinct* corpora look like real caches, where
most entries are programs of their own:

3. *Compile* (``dist-src/``) the ``deep`` family (20 unrolled stacks of 150-1,000 layers: large
   HLO, 1.1-9 MB decompressed entries) and 5,000 programs of the ``varied`` family (small, each
   distinct): ~1,100 CPU-seconds, about 10 minutes on 2 quiet cores.
4. *Lay out* ``dist-01k`` (600 small distinct programs, the 6 smallest large ones, then copies),
   ``dist-10k`` (all 5,020 distinct programs, then copies), ``dist-50k`` (the same 5,020, then
   copies: 25,000 distinct programs would take ~45 CPU-minutes to compile) and ``dist-lrg`` (the 20
   large programs once each, nothing else). Copies, relocated and corrupt entries, ``-atime``
   files and mtimes as in step 2; a tenth of the copies are copies of large programs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

GENERATOR_VERSION = 3
DEFAULT_SIZES = (1000, 10000, 50000)
RELOCATED_SHARE = 0.03
CORRUPT_SHARE = 0.01
ELSEWHERE_PROGRAMS = range(0, 280, 9)  # small programs also compiled at another cache path
CP_WEIGHT = 6  # custom_partitioning programs get a new key per process: they pile up
HERE = Path(__file__).resolve().parent
DISTINCT_GENERATOR_VERSION = 2  # 2: deep stacks of 150-1,000 layers (1: 120-900)
DEFAULT_DISTINCT_SIZES = (1000, 10000, 50000)
LARGE = "large"  # the corpus of distinct large programs only (``dist-lrg``)
DEEP_PROGRAMS = 20  # the ``deep`` family of _compile_programs.py, all of it
VARIED_PROGRAMS = 5000  # enough for half of dist-10k
LARGE_ENTRY = 512 * 1024  # decompressed bytes from which an entry counts as a large program
LARGE_COPY_SHARE = 0.1  # of the copies in a distinct corpus
SMALL_SHARE = 0.6  # small distinct programs in dist-NNk, as a share of its entries (if compiled)
LARGE_UNDER_10K = 6  # large programs in a distinct corpus under 10k entries: the smallest


def bench_dir() -> Path:
    env = os.environ.get("CACHEDOCTOR_BENCH_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cachedoctor-bench"


def cache_name(size: int) -> str:
    """``cache-01k`` ... ``cache-50k``: all as long as ``cache-src`` (see the path rewrite)."""
    return f"cache-{size // 1000:02d}k" if size < 100_000 else f"cache{size // 1000:03d}k"


def dist_name(size: int | str) -> str:
    """``dist-01k`` ... ``dist-lrg``: all as long as ``dist-src`` (see the path rewrite)."""
    return "dist-lrg" if size == LARGE else f"dist-{int(size) // 1000:02d}k"


def jax_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('jax'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _compile(python: str, cache: Path, ranges: list[list[str]], log: Path) -> None:
    """Compile program ranges, one JAX process per range, all at once (2 cores: 2 ranges).

    A range is the argument list of ``_compile_programs.py``: ``[START, STOP]`` (indices) or
    ``[FAMILY:START:STOP, ...]``."""
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_PERSISTENT_CACHE_MAX_SIZE", None)
    procs = []
    with log.open("a") as fh:
        for specs in ranges:
            procs.append(
                subprocess.Popen(
                    [python, str(HERE / "_compile_programs.py"), *specs],
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                )
            )
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"compiling programs failed; see {log}")


def _compile_list(python: str, cache: Path, indices: list[int], log: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    env["JAX_PLATFORMS"] = "cpu"
    with log.open("a") as fh:
        script = (  # one process for the whole list: JAX start-up once
            "import runpy\n"
            f"ns = runpy.run_path({str(HERE / '_compile_programs.py')!r}, run_name='lib')\n"
            f"for i in {indices!r}:\n"
            "    fn, args = ns['build'](i)\n"
            "    fn.lower(*args).compile()\n"
        )
        proc = subprocess.run([python, "-c", script], env=env, stdout=fh, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise SystemExit(f"compiling relocated programs failed; see {log}")


def compile_corpus(root: Path, python: str, log: Path) -> None:
    src, elsewhere = root / "cache-src", root / "elsewhere-cache"
    for d in (src, elsewhere):
        shutil.rmtree(d, ignore_errors=True)
    t0 = time.monotonic()
    # the unrolled stacks (indices 288-299) dominate: give them a process of their own
    _compile(python, src, [["0", "288"], ["288", "314"]], log)
    _compile_list(python, elsewhere, list(ELSEWHERE_PROGRAMS), log)
    print(f"compiled programs in {time.monotonic() - t0:.0f} s", file=sys.stderr)


def _entries(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.endswith("-cache"))


def _module(name: str) -> str:
    return name[: -len("-cache")].rsplit("-", 1)[0]


def _rewritten(src: Path, target: Path) -> tuple[list[tuple[str, bytes]], set[str]]:
    """The entries of ``src`` with the cache path inside rewritten to ``target``'s (same length)
    and recompressed as JAX does; and the names of the large ones (see ``LARGE_ENTRY``)."""
    import zstandard

    old, new = str(src).encode(), str(target).encode()
    assert len(old) == len(new)
    entries, large = [], set()
    for path in _entries(src):
        raw = zstandard.ZstdDecompressor().decompress(path.read_bytes())
        entries.append((path.name, zstandard.ZstdCompressor().compress(raw.replace(old, new))))
        if len(raw) >= LARGE_ENTRY:
            large.add(path.name)
    return entries, large


def layout(root: Path, size: int, seed: int) -> dict[str, object]:
    """Write ``cache-NNk`` with ``size`` entries from the compiled corpus."""
    base, _ = _rewritten(root / "cache-src", root / cache_name(size))
    weights = [CP_WEIGHT if _module(n) == "jit_f" else 1 for n, _ in base]
    return _write_cache(root, cache_name(size), base, weights, size, seed)


def layout_distinct(root: Path, which: int | str, seed: str) -> dict[str, object]:
    """Write ``dist-NNk`` (at least half distinct programs, some large) or ``dist-lrg``."""
    entries, large_names = _rewritten(root / "dist-src", root / dist_name(which))
    large = sorted((e for e in entries if e[0] in large_names), key=lambda e: len(e[1]))
    small = [e for e in entries if e[0] not in large_names]
    if which == LARGE:
        return _write_cache(root, dist_name(which), large, [1.0] * len(large), len(large), seed)
    size = int(which)
    if size < 10_000:
        large = large[:LARGE_UNDER_10K]
    small = small[: int(SMALL_SHARE * size)]
    originals = small + large
    # a tenth of the copies are copies of large programs, the rest of small ones
    share = LARGE_COPY_SHARE if small and large else float(bool(large))
    weights = [(1 - share) / max(1, len(small))] * len(small)
    weights += [share / max(1, len(large))] * len(large)
    info = _write_cache(root, dist_name(which), originals, weights, size, seed)
    info["large_programs"] = len(large)
    return info


def _write_cache(
    root: Path,
    name: str,
    originals: list[tuple[str, bytes]],
    weights: Sequence[float],
    size: int,
    seed: int | str,
) -> dict[str, object]:
    """Every original once under its own key, then relocated, corrupt and copied entries."""
    rng = random.Random(seed)
    target = root / name
    tmp = root / (name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    tmp.mkdir(parents=True)
    moved = [(p.name, p.read_bytes()) for p in _entries(root / "elsewhere-cache")]
    now = time.time()
    written = corrupt = relocated = 0
    total_bytes = 0

    def put(name: str, data: bytes) -> None:
        nonlocal written, total_bytes
        path = tmp / name
        path.write_bytes(data)
        mtime = now - rng.uniform(3600, 30 * 86400)
        os.utime(path, (mtime, mtime))
        atime_ns = int((mtime + rng.uniform(0, now - mtime - 60)) * 1e9)
        (tmp / (name[: -len("-cache")] + "-atime")).write_bytes(atime_ns.to_bytes(8, "little"))
        written += 1
        total_bytes += len(data)

    def new_name(module: str) -> str:
        return f"{module}-{rng.getrandbits(256):064x}-cache"

    for name, data in originals[:size]:
        put(name, data)
    n_moved = int(size * RELOCATED_SHARE)
    n_corrupt = int(size * CORRUPT_SHARE)
    for _ in range(n_moved):
        name, data = rng.choice(moved)
        put(new_name(_module(name)), data)
        relocated += 1
    for _ in range(n_corrupt):
        name, data = rng.choice(originals)
        put(new_name(_module(name)), data[: rng.randrange(1, len(data))])
        corrupt += 1
    while written < size:
        name, data = rng.choices(originals, weights)[0]
        put(new_name(_module(name)), data)
    tmp.rename(target)
    return {
        "path": str(target),
        "entries": written,
        "distinct_programs": min(len(originals), size),
        "relocated": relocated,
        "corrupt": corrupt,
        "entry_bytes": total_bytes,
        "disk_bytes": _du(target),
    }


def _du(d: Path) -> int:
    return sum(e.stat().st_blocks * 512 for e in os.scandir(d))


def ensure_corpus(
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    python: str | None = None,
    force: bool = False,
    distinct_sizes: tuple[int, ...] | None = DEFAULT_DISTINCT_SIZES,
) -> dict[str, object]:
    """Generate what is missing and return the corpus description (also in ``corpus.json``).

    The distinct corpora (``stamp["distinct"]``) have a version of their own, so that changing
    them leaves the copies corpora (the trend row) as they are; ``dist-lrg`` comes with them
    (``()``: ``dist-lrg`` alone; ``None``: no distinct corpus)."""
    python = python or sys.executable
    root = bench_dir()
    root.mkdir(parents=True, exist_ok=True)
    stamp_path = root / "corpus.json"
    jv = jax_version(python)
    stamp: dict[str, object] = {}
    if stamp_path.exists() and not force:
        try:
            stamp = json.loads(stamp_path.read_text())
        except ValueError:
            stamp = {}
    if stamp.get("generator") != GENERATOR_VERSION or stamp.get("jax") != jv:
        stamp = {"generator": GENERATOR_VERSION, "jax": jv, "caches": {}}
    caches: dict[str, dict[str, object]] = stamp.setdefault("caches", {})  # type: ignore[assignment]
    log = root / "generate.log"
    t0 = time.monotonic()
    if "compiled" not in stamp or not (root / "cache-src").is_dir():
        compile_corpus(root, python, log)
        stamp["compiled"] = {
            "programs": len(_entries(root / "cache-src")),
            "relocated_programs": len(_entries(root / "elsewhere-cache")),
            "seconds": round(time.monotonic() - t0, 1),
        }
        caches.clear()
        stamp.pop("distinct", None)  # their relocated entries come from elsewhere-cache
    for size in sizes:
        key = str(size)
        if key in caches and Path(str(caches[key]["path"])).is_dir():
            continue
        t1 = time.monotonic()
        info = layout(root, size, seed=size)
        info["seconds"] = round(time.monotonic() - t1, 1)
        caches[key] = info
        print(f"wrote {cache_name(size)}: {info}", file=sys.stderr)
        stamp_path.write_text(json.dumps(stamp, indent=2))
    if distinct_sizes is not None:
        ensure_distinct(root, stamp, distinct_sizes, python, log)
    stamp_path.write_text(json.dumps(stamp, indent=2))
    return stamp


def ensure_distinct(
    root: Path, stamp: dict[str, object], sizes: tuple[int, ...], python: str, log: Path
) -> None:
    """Compile ``dist-src`` if needed and lay out the distinct corpora that are missing."""
    dist: dict[str, object] = stamp.get("distinct") or {}  # type: ignore[assignment]
    if dist.get("generator") != DISTINCT_GENERATOR_VERSION:
        dist = {"generator": DISTINCT_GENERATOR_VERSION, "caches": {}}
    stamp["distinct"] = dist
    caches: dict[str, dict[str, object]] = dist["caches"]  # type: ignore[assignment]
    src = root / "dist-src"
    if "compiled" not in dist or not src.is_dir():
        shutil.rmtree(src, ignore_errors=True)
        t0 = time.monotonic()
        # ~500 CPU-seconds each: the varied programs in one process, the deep family in the other
        _compile(python, src, [[f"varied:0:{VARIED_PROGRAMS}"], [f"deep:0:{DEEP_PROGRAMS}"]], log)
        seconds = time.monotonic() - t0
        print(f"compiled distinct programs in {seconds:.0f} s", file=sys.stderr)
        dist["compiled"] = {"programs": len(_entries(src)), "seconds": round(seconds, 1)}
        caches.clear()
    corpora: list[int | str] = [*sizes, LARGE]
    for which in corpora:
        key = str(which)
        if key in caches and Path(str(caches[key]["path"])).is_dir():
            continue
        t1 = time.monotonic()
        info = layout_distinct(root, which, seed=f"dist-{key}")
        info["seconds"] = round(time.monotonic() - t1, 1)
        caches[key] = info
        print(f"wrote {dist_name(which)}: {info}", file=sys.stderr)
        (root / "corpus.json").write_text(json.dumps(stamp, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument(
        "--distinct-sizes",
        default=",".join(map(str, DEFAULT_DISTINCT_SIZES)),
        help="sizes of the distinct corpora (dist-NNk; dist-lrg comes with them); '' for none",
    )
    ap.add_argument("--force", action="store_true", help="recompile and rewrite everything")
    ap.add_argument("--python", default=None, help="interpreter with JAX (default: this one)")
    args = ap.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(",") if s)
    distinct = tuple(int(s) for s in args.distinct_sizes.split(",") if s) or None
    stamp = ensure_corpus(sizes, args.python, args.force, distinct)
    print(json.dumps(stamp, indent=2))


if __name__ == "__main__":
    main()
