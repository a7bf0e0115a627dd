"""A first scan of a bucket on 1, 2 and 4 Dask workers against the default scan, on moto's S3.

    python benchmarks/bench_executor.py --source DIR --objects 10000 --reps 5 [--json FILE]

Uploads ``--objects`` copies of the entries of ``--source`` (a JAX cache directory) under new
random keys to moto's S3 server (its own process on 127.0.0.1, so that its CPU is not the
scan's), then, alternating the configurations within each repetition, times a full scan
(``use_index=False``: every object read and decoded; the reader's memos cleared in this process
and in every worker first):

- **listing**: ``list_cache`` alone (pages of 1,000 keys);
- **default**: ``scan_directory`` with no executor (16 concurrent reads in this process);
- **dask-N**: ``scan_directory(executor=client.get_executor())`` on a ``LocalCluster`` of N
  single-threaded worker processes.

For the cost model it records the bytes read from the bucket, the CPU seconds of this process
and of the workers per entry, and the pickled size of what a chunk sends and returns. Needs the
``test-remote`` extra (moto[server], s3fs, dask[distributed]).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _moto(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    sys.exit("moto's server did not start")


def _clear_memos() -> None:
    from cachedoctor.cache import reader
    from cachedoctor.xla import hlo_facts

    reader.clear_memos()
    hlo_facts._SHAPES.clear()


def _cpu() -> float:
    return time.process_time()


def _warm() -> None:
    """What a worker imports on its first chunk (the reader, s3fs): not part of any scan."""
    import s3fs  # noqa: F401

    from cachedoctor.cache import executors, reader  # noqa: F401


def _upload(url: str, source: Path, objects: int) -> tuple[int, float]:
    from cachedoctor.storage import remote_store, stores

    store = stores.open_store(url)
    assert isinstance(store, remote_store.RemoteStore)
    store.fs.mkdir(store.bucket)
    sources = sorted(p for p in source.glob("*-cache") if p.is_file())
    if not sources:
        sys.exit(f"no entries in {source}")
    blobs = [p.read_bytes() for p in sources]
    start, total, batch = time.perf_counter(), 0, {}
    for n in range(objects):
        src = sources[n % len(sources)]
        module = src.name[: -len("-cache") - 65]
        batch[store.path_of(f"{module}-{secrets.token_hex(32)}-cache")] = blobs[n % len(blobs)]
        total += len(blobs[n % len(blobs)])
        if len(batch) >= 64 or n == objects - 1:
            store.fs.pipe(batch)
            batch = {}
    return total, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="a JAX cache directory to copy from")
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workers", default="1,2,4", help="Dask cluster sizes")
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()

    port = _free_port()
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="bench-executor-"),
        }
    )
    server = _moto(port)
    try:
        print(json.dumps(_run(args, "s3://bench/cache"), indent=1))
    finally:
        server.kill()


def _run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from distributed import Client, LocalCluster

    from cachedoctor.cache import listdir
    from cachedoctor.core.scan.run import scan_directory
    from cachedoctor.storage import stores
    from cachedoctor.storage.location import Location

    total, upload_s = _upload(url, Path(args.source), args.objects)
    print(f"uploaded {args.objects} objects ({total / 1e6:.0f} MB) in {upload_s:.0f} s", flush=True)
    sizes = [int(w) for w in args.workers.split(",") if w]
    clusters = {
        w: LocalCluster(n_workers=w, threads_per_worker=1, processes=True, dashboard_address=":0")
        for w in sizes
    }
    clients = {w: Client(c, set_as_default=False) for w, c in clusters.items()}
    for c in clients.values():
        c.run(_warm)
    runs: dict[str, list[dict[str, float]]] = {"listing": [], "default": []}
    runs.update({f"dask-{w}": [] for w in sizes})

    def timed(name: str, fn: Callable[[], Any], client: Any = None) -> None:
        _clear_memos()
        if client is not None:
            client.run(_clear_memos)
            before = sum(client.run(_cpu).values())
        store = stores.open_store(url)
        cpu, start = _cpu(), time.perf_counter()
        fn_store = fn(store)
        wall = time.perf_counter() - start
        row = {"wall_s": wall, "client_cpu_s": _cpu() - cpu, "bytes_read": store.stats.bytes_read}
        if client is not None:
            row["worker_cpu_s"] = sum(client.run(_cpu).values()) - before
        if name != "listing":
            assert fn_store.summary.entries == args.objects, fn_store.summary.entries
        runs[name].append(row)
        print(f"  {name:9s} {wall:8.2f} s", flush=True)

    for rep in range(args.reps):
        print(f"rep {rep + 1}/{args.reps}", flush=True)
        timed("listing", lambda s: listdir.list_cache(s))
        timed(
            "default",
            lambda s: scan_directory(Location.of_store(s), use_index=False, entries=False),
        )
        for w in sizes:
            ex = clients[w].get_executor(pure=False)
            timed(
                f"dask-{w}",
                lambda s, ex=ex: scan_directory(
                    Location.of_store(s), use_index=False, entries=False, executor=ex
                ),
                clients[w],
            )
    shipped = _shipped(url, args.objects)
    for c in clients.values():
        c.close()
    for cl in clusters.values():
        cl.close()
    result = {
        "objects": args.objects,
        "object_bytes": total,
        "source": str(args.source),
        "upload_s": upload_s,
        "cores": len(os.sched_getaffinity(0)),
        "chunk_entries": _chunk_size(),
        "shipped_per_entry": shipped,
        "runs": runs,
        "medians": {
            k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()
        },
        "spread_wall_s": {
            k: [min(r["wall_s"] for r in v), max(r["wall_s"] for r in v)] for k, v in runs.items()
        },
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def _chunk_size() -> int:
    from cachedoctor.cache import parallel

    return parallel.BATCH_ENTRIES


def _shipped(url: str, objects: int) -> dict[str, float]:
    """Pickled bytes per entry of what a chunk sends (items, store description) and returns."""
    from cachedoctor.cache import executors, listdir
    from cachedoctor.storage import stores

    store = stores.open_store(url)
    items = listdir.list_cache(store).entries[:256]
    spec = stores.spec_of(store)
    sent = len(pickle.dumps((spec, items, 0)))
    back = len(pickle.dumps(executors.decode_store_chunk(spec, items, 1 << 33, False)))
    return {"sent_bytes": sent / len(items), "returned_bytes": back / len(items)}


if __name__ == "__main__":
    main()
