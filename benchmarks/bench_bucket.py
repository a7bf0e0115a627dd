"""Repeated scan of a bucket cache against its listing alone, on a local S3 server (moto).

    python benchmarks/bench_bucket.py --objects 10000 --source DIR --reps 3

Uploads ``--objects`` copies of the entries in ``--source`` (a JAX cache directory) under new
random keys to a moto S3 server on 127.0.0.1, then times, in this process:

- **listing**: ``list_cache`` of the bucket prefix (one paginated listing, nothing read);
- **first scan**: ``scan_directory`` with an empty scan index (every object is read);
- **repeated scan**: the same scan again, the index warm (objects known by their ETag);
- **scan without index**: ``CACHEDOCTOR_NO_INDEX=1``, what every scan cost before.

Needs the ``test-remote`` extra (moto[server], s3fs). Medians of ``--reps`` runs.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _median_s(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--source", required=True, help="a JAX cache directory to copy from")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    from moto.server import ThreadedMotoServer

    port = _free_port()
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="bench-bucket-index-"),
        }
    )
    os.environ.pop("CACHEDOCTOR_NO_INDEX", None)  # measured both ways below
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        from cachedoctor.cache import listdir
        from cachedoctor.commands.scan import scan_directory
        from cachedoctor.storage import stores

        sources = sorted(p for p in Path(args.source).glob("*-cache") if p.is_file())
        if not sources:
            sys.exit(f"no entries in {args.source}")
        url = "s3://bench/cache"
        store = stores.open_store(url)
        assert isinstance(store, stores.RemoteStore)
        store.fs.mkdir("bench")
        blobs = {p: p.read_bytes() for p in sources}
        start = time.perf_counter()
        batch: dict[str, bytes] = {}
        for n in range(args.objects):
            src = sources[n % len(sources)]
            module = src.name[: -len("-cache") - 65]
            batch[store.path_of(f"{module}-{secrets.token_hex(32)}-cache")] = blobs[src]
            if len(batch) >= 32 or n == args.objects - 1:
                store.fs.pipe(batch)
                batch = {}
        print(f"uploaded {args.objects} objects in {time.perf_counter() - start:.1f} s")

        def listing() -> None:
            listdir.list_cache(stores.open_store(url))  # a new store: nothing cached

        first = _median_s(lambda: scan_directory(url), 1)
        lst = _median_s(listing, args.reps)
        repeated = _median_s(lambda: scan_directory(url), args.reps)
        os.environ["CACHEDOCTOR_NO_INDEX"] = "1"
        no_index = _median_s(lambda: scan_directory(url), 1)
        print(f"objects: {args.objects}, distinct sources: {len(sources)}")
        print(f"listing alone          {lst * 1000:9.0f} ms")
        print(f"first scan (cold index){first * 1000:9.0f} ms  {first / lst:6.2f} x listing")
        print(f"repeated scan          {repeated * 1000:9.0f} ms  {repeated / lst:6.2f} x listing")
        print(f"scan without the index {no_index * 1000:9.0f} ms  {no_index / lst:6.2f} x listing")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
