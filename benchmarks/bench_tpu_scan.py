"""The first scan of a real TPU cache against a CPU cache of the same size, each against its own
floor (issue 53: a TPU cache costs no more, against the decompression floor, than a CPU one).

    python benchmarks/bench_tpu_scan.py [--reps 5] [--out FILE]

The TPU cache: every distinct entry of the real TPU caches in tests/fixtures/tpu-v5e (libtpu's
six messages, Pallas kernels among them, moved kernels whose bodies the kernel tier reads with
jaxlib's MLIR). The CPU cache: distinct small programs compiled by the installed JAX on the CPU
until the decompressed size matches. Each is made F (``--factor``) and 2F times larger with
distinct copies (the cache path in each copy's compile options changed). For each, alternating:
the floor D (read and decompress every entry, one thread, ``run.floor_decompress``) and a first
``cachedoctor scan`` (index and memo dropped before each run, start-up excluded: ``_child.py``).
The F to 2F difference is the scan's work per entry, against D's: what a scan does once (the
option schema, importing jaxlib's MLIR) cancels. Prints the medians, each scan's ratio to its
own D and the per-entry ratios; the claim holds when the TPU's is at most the CPU's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import run  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "tpu-v5e"

CPU_PROGRAM = textwrap.dedent(
    """
    import os, sys
    import jax, jax.numpy as jnp
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    start = int(sys.argv[3])
    for i in range(start, start + int(sys.argv[2])):
        n = 8 + i % 24
        f = jax.jit(lambda x, i=i: jnp.tanh(x @ x.T * (i + 1)).sum() + jnp.sin(x).sum() * i)
        f(jnp.ones((n, 16 + i % 7), jnp.float32)).block_until_ready()
    """
)


def tpu_corpus(target: Path) -> int:
    """Every distinct TPU entry of the fixtures, once each, in ``target``; their count."""
    seen: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for archive in sorted(FIXTURES.glob("*.tar.gz")):
            with tarfile.open(archive) as tar:
                tar.extractall(Path(tmp) / archive.name, filter="data")
        for path in sorted(Path(tmp).glob("*/caches/*/*-cache")):
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            (target / path.name).write_bytes(data)
    return len(seen)


def cpu_corpus(target: Path, decompressed: int) -> int:
    """Distinct CPU programs compiled into ``target`` until its entries decompress to about
    ``decompressed`` bytes; their count."""
    count = 0
    batch = 40
    while True:
        work = target.with_name(target.name + "-batch")
        subprocess.run(
            [sys.executable, "-c", CPU_PROGRAM, str(work), str(batch), str(count)],
            check=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
            capture_output=True,
        )
        for path in sorted(work.glob("*-cache")):
            if run.floor_decompress(str(target)) >= decompressed:
                return count
            path.rename(target / f"{path.name[:-70]}-{count:064x}-cache")
            count += 1
        for path in work.glob("*-cache"):
            path.unlink()
        batch *= 2


AUTOTUNE = b"/xla_gpu_per_fusion_autotune_cache_dir"


def replicate(folder: Path, factor: int) -> int:
    """Each entry of ``folder`` made ``factor`` distinct entries: the cache path its compile
    options name (before the autotune folder) changed in place, same length, and the payload
    recompressed as JAX does (as benchmarks/generate.py lays out its corpora): distinct bytes,
    so that every entry is decoded, with the sizes and layouts of the real ones. Their count."""
    import zstandard

    count = 0
    for path in sorted(folder.glob("*-cache")):
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
        at = raw.find(AUTOTUNE)
        if at < 8:
            continue
        for n in range(1, factor):
            tag = f"{n:04d}".encode()
            copy = raw[: at - len(tag)] + tag + raw[at:]
            name = f"{path.name.rsplit('-', 2)[0]}-{hashlib.sha256(copy).hexdigest()}-cache"
            (folder / name).write_bytes(zstandard.ZstdCompressor(level=3).compress(copy))
            count += 1
    return count + len(list(folder.glob("*-cache"))) - count


def first_scan(folder: Path) -> tuple[float, float]:
    """One first scan (no index, no memo), start-up excluded: (seconds, CPU seconds)."""
    from bench_tiers import child_cpu

    index = folder / "cachedoctor-index"
    if index.exists():
        import shutil

        shutil.rmtree(index)
    env_index = os.environ.get("CACHEDOCTOR_NO_INDEX")
    os.environ["CACHEDOCTOR_NO_INDEX"] = "1"
    try:
        return child_cpu(["scan", str(folder)], str(REPO / "src"))
    finally:
        if env_index is None:
            os.environ.pop("CACHEDOCTOR_NO_INDEX", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--factor", type=int, default=10, help="distinct copies of each entry")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-tpu-"))
    tpu, cpu = root / "tpu", root / "cpu"
    tpu.mkdir()
    cpu.mkdir()
    tpu_corpus(tpu)
    size = run.floor_decompress(str(tpu))
    cpu_corpus(cpu, size)
    # each corpus twice: F copies of each entry, and 2F (the F more beside them): what a scan
    # does once (the option schema, importing jaxlib's MLIR) cancels in the difference
    folders = {}
    for name, base in (("tpu", tpu), ("cpu", cpu)):
        small = root / f"{name}-x{args.factor}"
        small.mkdir()
        for path in base.glob("*-cache"):
            (small / path.name).write_bytes(path.read_bytes())
        replicate(small, args.factor)
        replicate(base, 2 * args.factor)
        folders[f"{name} x{args.factor}"], folders[f"{name} x{2 * args.factor}"] = small, base
    results: dict[str, object] = {
        "load": os.getloadavg(),
        "factor": args.factor,
        "entries": {k: len(list(f.glob("*-cache"))) for k, f in folders.items()},
        "decompressed": {k: run.floor_decompress(str(f)) for k, f in folders.items()},
    }
    times: dict[str, list[float]] = {f"{k} {m}": [] for k in folders for m in ("D", "scan")}
    for _ in range(args.reps):
        for name, folder in folders.items():
            run.floor_read(str(folder))
            t0 = time.perf_counter()
            run.floor_decompress(str(folder))
            times[f"{name} D"].append(time.perf_counter() - t0)
            times[f"{name} scan"].append(first_scan(folder)[0])
    medians = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: medians[f"{k} scan"] / medians[f"{k} D"] for k in folders}
    small, large = f"x{args.factor}", f"x{2 * args.factor}"
    marginal = {
        n: (medians[f"{n} {large} scan"] - medians[f"{n} {small} scan"])
        / (medians[f"{n} {large} D"] - medians[f"{n} {small} D"])
        for n in ("tpu", "cpu")
    }
    results.update(
        {"medians_s": medians, "ratio_to_D": ratios, "per_entry_ratio": marginal, "raw_s": times}
    )
    print(json.dumps({"medians_s": medians, "ratio_to_D": ratios}, indent=1))
    for key in folders:
        print(f"first scan {key}: {ratios[key]:.1f}×D ({results['entries'][key]} entries)")  # type: ignore[index]
    print(
        f"per entry (the {small} → {large} difference, against D's): TPU {marginal['tpu']:.1f}×, "
        f"CPU {marginal['cpu']:.1f}× (TPU/CPU {marginal['tpu'] / marginal['cpu']:.2f})"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
