"""One measured operation in a fresh interpreter (run by bench.py); prints one JSON line.

    python _child.py OP JSON-ARGS

The parent reads this process's peak RSS from ``wait4``; this process reports the time of the
operation itself (after its imports are warm) and the peak RSS of the worker processes it used
(``RUSAGE_CHILDREN``). Start-up is measured separately, as its own target.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any


def _quiet_cli(argv: list[str]) -> int:
    from cachedoctor.cli import main

    out = io.StringIO() if os.environ.get("BENCH_KEEP_OUTPUT") else open(os.devnull, "w")  # noqa: SIM115
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0


def op_cli(args: dict[str, Any]) -> dict[str, Any]:
    argv: list[str] = args["argv"]
    if argv[0] == "scan":  # warm every lazy import the command uses on an empty directory
        with tempfile.TemporaryDirectory() as empty:
            _quiet_cli(["scan", empty, *argv[2:]])
        if os.environ.get("BENCH_WARM_PROTOBUF"):  # and what decoding an HLO module imports
            import google.protobuf.descriptor_pb2
            import google.protobuf.descriptor_pool
            import google.protobuf.message_factory  # noqa: F401
    else:
        import importlib

        from cachedoctor.cli import COMMANDS

        importlib.import_module(f"cachedoctor.cli.{COMMANDS[argv[0]][0]}")
    if "pool_declared" in args:  # the pool's threshold (cache/parallel.py), 0: always a pool
        from cachedoctor.cache import parallel

        parallel.MIN_PARALLEL_DECLARED = int(args["pool_declared"])
    t0, cpu0 = time.perf_counter(), _cpu()
    rc = _quiet_cli(argv)
    return {"seconds": time.perf_counter() - t0, "cpu_s": _cpu() - cpu0, "rc": rc}


def _cpu() -> float:
    """CPU seconds of this process and of the children it reaped (pool workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def op_deep(args: dict[str, Any]) -> dict[str, Any]:
    """Decode every entry (serial or parallel) and group them modulo volatile fields."""
    from cachedoctor.cache import listdir, reader
    from cachedoctor.core.scan.rules.keys import duplicate_groups

    workers = args.get("workers")
    t0 = time.perf_counter()
    listing = listdir.list_cache(args["dir"])
    try:
        from cachedoctor.cache import parallel
    except ImportError:  # before parallel decode existed
        parallel = None  # type: ignore[assignment]
    if parallel is not None and workers != 1:
        entries = list(parallel.decode_entries(listing, workers=workers))
    else:
        entries = list(reader.iter_entries(listing))
    groups = duplicate_groups(entries)
    return {
        "seconds": time.perf_counter() - t0,
        "groups": len(groups),
        "grouped_entries": sum(len(g) for g in groups),
    }


def op_jax_lru(args: dict[str, Any]) -> dict[str, Any]:
    """JAX's own LRU eviction pass over the directory, with a budget above its size.

    ``_evict_if_needed`` globs ``*-cache``, stats each and reads its ``-atime`` file, then evicts
    while over budget; with the budget above the cache size it deletes nothing, so this is the
    cost of deciding, which is what a ``prune --max-size`` dry run does too.
    """
    from jax._src.lru_cache import LRUCache

    cache = LRUCache(args["dir"], max_size=1 << 62)
    t0 = time.perf_counter()
    cache._evict_if_needed()
    return {"seconds": time.perf_counter() - t0}


def main() -> None:
    op, raw = sys.argv[1], sys.argv[2]
    result = globals()[f"op_{op}"](json.loads(raw))
    result["children_maxrss_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
