"""Cost of reading distinct large HLO programs, against D (read and decompress) on one thread.

A cache of distinct large programs (unrolled models) is where the first scan is slowest: each
module is seen once, so nothing is memoised, and the pure-Python wire walk of
``hlo.summarize`` + ``hlo.canonicalize`` dwarfs zstd. Rounds alternate the three measurements:

- ``D``: read every entry file and decompress it (zstd), one thread;
- ``walk``: ``hlo.module_facts`` of every module (the pure walker, what scans ran before);
- ``view``: ``hlo_facts.scan_facts`` of every module (what ``decode_entry`` runs now);
- ``decode``: ``reader.decode_entry`` of every entry, memos emptied (a first scan, one core);
- ``upb parse``: ``HloModuleProto.FromString`` with protobuf's C parser over a descriptor pool
  built from the descriptors embedded in the installed jaxlib: a floor for any fast path that
  parses the whole module (skipped when protobuf or the descriptors are missing).

    python benchmarks/bench_hlo.py CACHE_DIR [--reps 5]

Times are CPU time of this process (``time.process_time``): on a shared machine wall time
mostly measures the other jobs. With an empty or missing CACHE_DIR, the ``unrolled`` family of
``_compile_programs.py`` (programs 288-299: 10-300 layers) is compiled into it first (about 5
minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import glob
import mmap
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import zstandard

from cachedoctor.cache import reader
from cachedoctor.xla import hlo, hlo_facts, optionschema

HERE = Path(__file__).resolve().parent
UNROLLED_FAMILY = ("288", "300")


def _entries(cache: Path) -> list[str]:
    return sorted(glob.glob(str(cache / "*-cache")))


def _modules(paths: list[str]) -> list[bytes]:
    modules = []
    for path in paths:
        detail = reader.decode_entry(path, detail=True)
        assert isinstance(detail, reader.EntryDetail)
        if detail.hlo_module is not None:
            modules.append(detail.hlo_module)
    return modules


def _upb_parser() -> Callable[[bytes], object] | None:
    """``HloModuleProto.FromString`` over jaxlib's embedded descriptors, or None."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        return None
    libraries = optionschema.jaxlib_libraries()
    if not libraries:
        return None
    pool = descriptor_pool.DescriptorPool()
    with open(libraries[0], "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:

        def add(name: str, seen: set[str]) -> None:
            if name in seen:
                return
            seen.add(name)
            for candidate in optionschema.descriptor_candidates(mm, name):
                proto = descriptor_pb2.FileDescriptorProto.FromString(candidate)
                for dependency in proto.dependency:
                    add(dependency, seen)
                pool.Add(proto)
                return
            raise LookupError(name)

        try:
            add("xla/service/hlo.proto", set())
        except LookupError:
            return None
    message = message_factory.GetMessageClass(pool.FindMessageTypeByName("xla.HloModuleProto"))
    return message.FromString


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", type=Path)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if not _entries(args.cache):
        args.cache.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(args.cache)}
        script = str(HERE / "_compile_programs.py")
        subprocess.run([sys.executable, script, *UNROLLED_FAMILY], env=env, check=True)
    paths = _entries(args.cache)
    modules = _modules(paths)
    upb_parse = _upb_parser()

    def floor_d() -> None:
        for path in paths:
            with open(path, "rb") as fh:
                zstandard.ZstdDecompressor().decompressobj().decompress(fh.read())

    def walk() -> None:
        for module in modules:
            hlo.module_facts(module)

    def view() -> None:
        for module in modules:
            hlo_facts.scan_facts(module)

    def decode() -> None:  # what a first scan does per distinct entry, memos emptied
        reader.clear_memos()
        for path in paths:
            reader.decode_entry(path)

    rounds: dict[str, Callable[[], None]] = {
        "D": floor_d,
        "walk": walk,
        "view": view,
        "decode": decode,
    }
    if upb_parse is not None:
        rounds["upb parse"] = lambda: [upb_parse(m) for m in modules] and None
    times: dict[str, list[float]] = {name: [] for name in rounds}
    for _ in range(args.reps):
        for name, fn in rounds.items():
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    sizes = sorted(len(m) for m in modules)
    print(
        f"{len(paths)} entries, {len(modules)} HLO modules, "
        f"{sizes[0] / 1e3:.0f}-{sizes[-1] / 1e3:.0f} KB decompressed, {sum(sizes) / 1e6:.1f} MB"
    )
    d_min, d_median = min(times["D"]), statistics.median(times["D"])
    for name, values in times.items():
        low, mid = min(values), statistics.median(values)
        print(
            f"{name:10} min {low * 1e3:8.1f} ms  median {mid * 1e3:8.1f} ms"
            f"  x D {low / d_min:6.1f} (min)  {mid / d_median:6.1f} (median)"
        )


if __name__ == "__main__":
    main()
