"""Build realistic JAX caches of 1k, 10k and 50k entries for the benchmarks, from real compilations.

    python benchmarks/generate.py [--sizes 1000,10000,50000] [--force]

Where: ``$CACHEDOCTOR_BENCH_DIR`` (default ``~/.cache/cachedoctor-bench``), outside the repository.
A corpus is reused while its stamp (generator version, JAX version, sizes) matches.

How, in two steps:

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
from pathlib import Path

GENERATOR_VERSION = 3
DEFAULT_SIZES = (1000, 10000, 50000)
RELOCATED_SHARE = 0.03
CORRUPT_SHARE = 0.01
ELSEWHERE_PROGRAMS = range(0, 280, 9)  # small programs also compiled at another cache path
CP_WEIGHT = 6  # custom_partitioning programs get a new key per process: they pile up
HERE = Path(__file__).resolve().parent


def bench_dir() -> Path:
    env = os.environ.get("CACHEDOCTOR_BENCH_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cachedoctor-bench"


def cache_name(size: int) -> str:
    """``cache-01k`` ... ``cache-50k``: all as long as ``cache-src`` (see the path rewrite)."""
    return f"cache-{size // 1000:02d}k" if size < 100_000 else f"cache{size // 1000:03d}k"


def jax_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('jax'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _compile(python: str, cache: Path, ranges: list[tuple[int, int]], log: Path) -> None:
    """Compile program ranges, one JAX process per range, all at once (2 cores: 2 ranges)."""
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_PERSISTENT_CACHE_MAX_SIZE", None)
    procs = []
    with log.open("a") as fh:
        for start, stop in ranges:
            procs.append(
                subprocess.Popen(
                    [python, str(HERE / "_compile_programs.py"), str(start), str(stop)],
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
    _compile(python, src, [(0, 288), (288, 400)], log)
    _compile_list(python, elsewhere, list(ELSEWHERE_PROGRAMS), log)
    print(f"compiled programs in {time.monotonic() - t0:.0f} s", file=sys.stderr)


def _entries(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.endswith("-cache"))


def _module(name: str) -> str:
    return name[: -len("-cache")].rsplit("-", 1)[0]


def _rewrite(data: bytes, old: bytes, new: bytes) -> bytes:
    """Rewrite the cache path inside an entry (same length) and recompress as JAX does."""
    import zstandard

    assert len(old) == len(new)
    raw = zstandard.ZstdDecompressor().decompress(data)
    return zstandard.ZstdCompressor().compress(raw.replace(old, new))


def layout(root: Path, size: int, seed: int) -> dict[str, object]:
    """Write ``cache-NNk`` with ``size`` entries from the compiled corpus."""
    rng = random.Random(seed)
    target = root / cache_name(size)
    tmp = root / (cache_name(size) + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    tmp.mkdir(parents=True)
    old, new = str(root / "cache-src").encode(), str(target).encode()
    base = [(p.name, _rewrite(p.read_bytes(), old, new)) for p in _entries(root / "cache-src")]
    moved = [(p.name, p.read_bytes()) for p in _entries(root / "elsewhere-cache")]
    weights = [CP_WEIGHT if _module(n) == "jit_f" else 1 for n, _ in base]
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

    for name, data in base[:size]:
        put(name, data)
    n_moved = int(size * RELOCATED_SHARE)
    n_corrupt = int(size * CORRUPT_SHARE)
    for _ in range(n_moved):
        name, data = rng.choice(moved)
        put(new_name(_module(name)), data)
        relocated += 1
    for _ in range(n_corrupt):
        name, data = rng.choice(base)
        put(new_name(_module(name)), data[: rng.randrange(1, len(data))])
        corrupt += 1
    while written < size:
        name, data = rng.choices(base, weights)[0]
        put(new_name(_module(name)), data)
    tmp.rename(target)
    return {
        "path": str(target),
        "entries": written,
        "distinct_programs": min(len(base), size),
        "relocated": relocated,
        "corrupt": corrupt,
        "entry_bytes": total_bytes,
        "disk_bytes": _du(target),
    }


def _du(d: Path) -> int:
    return sum(e.stat().st_blocks * 512 for e in os.scandir(d))


def ensure_corpus(
    sizes: tuple[int, ...] = DEFAULT_SIZES, python: str | None = None, force: bool = False
) -> dict[str, object]:
    """Generate what is missing and return the corpus description (also in ``corpus.json``)."""
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
    stamp_path.write_text(json.dumps(stamp, indent=2))
    return stamp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--force", action="store_true", help="recompile and rewrite everything")
    ap.add_argument("--python", default=None, help="interpreter with JAX (default: this one)")
    args = ap.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    stamp = ensure_corpus(sizes, args.python, args.force)
    print(json.dumps(stamp, indent=2))


if __name__ == "__main__":
    main()
