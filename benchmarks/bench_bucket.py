"""Repeated scan of a bucket cache against its listing alone, on a local S3 or GCS server.

    python benchmarks/bench_bucket.py --objects 10000 --source DIR --reps 3 [--store gcs]

Uploads ``--objects`` copies of the entries in ``--source`` (a JAX cache directory) under new
random keys to a server on 127.0.0.1 (``--store s3``: moto's S3 server; ``--store gcs``: the
GCS emulator behind the tests' forwarding proxy, which turns gcsfs's multipart uploads into
media uploads and retries the emulator's refused connections, as in
``tests/storage/test_storage_remote.py``), then times, in this process:

- **listing**: ``list_cache`` of the bucket prefix (one paginated listing, nothing read);
- **first scan**: ``scan_directory`` with an empty scan index (every object is read);
- **repeated scan**: the same scan again, the index warm (objects known by their ETag);
- **scan without index**: ``CACHEDOCTOR_NO_INDEX=1``, what every scan cost before.

Needs the ``test-remote`` extra (moto[server], s3fs, gcp-storage-emulator, gcsfs). Medians of
``--reps`` runs; ``--no-unindexed`` skips the last row (it reads every object again).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


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


Put = Callable[[Any, dict[str, bytes]], None]  # (store, {fsspec path: bytes}) -> None


@contextlib.contextmanager
def _s3_server() -> Iterator[tuple[str, Put]]:
    """moto's S3 server on 127.0.0.1 with a bucket ``bench``: the cache URL, how to upload."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        from cachedoctor.storage import remote_store, stores

        store = stores.open_store("s3://bench/cache")
        assert isinstance(store, remote_store.RemoteStore)
        store.fs.mkdir("bench")
        yield "s3://bench/cache", _upload
    finally:
        server.stop()


@contextlib.contextmanager
def _gcs_server() -> Iterator[tuple[str, Put]]:
    """The GCS emulator on 127.0.0.1 (bucket ``bench``), reached through the tests' proxy.

    Objects are registered in the emulator's storage directly, with the emulator's own object
    resources (checksums, a new generation each): through its API, every upload rewrites the
    metadata of all objects (``Storage._write_config_to_file``), so 10,000 uploads never end.
    """
    import fsspec.config
    from gcp_storage_emulator.handlers import objects
    from gcp_storage_emulator.server import create_server

    sys.path.insert(0, str(ROOT))
    from tests.support.buckets import Proxy, serve

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="bench")
    server.start()
    try:
        with serve(Proxy(port, every=0, fix_multipart=True)) as endpoint:
            os.environ.update(
                {
                    "STORAGE_EMULATOR_HOST": endpoint,
                    "FSSPEC_GCS_TOKEN": "anon",
                    "NO_GCE_CHECK": "true",
                    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # the emulator serves no gRPC
                }
            )
            fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"
            storage = server._storage

            def register(store: Any, batch: dict[str, bytes]) -> None:
                for path, data in batch.items():
                    bucket, name = path.split("/", 1)
                    obj = objects._make_object_resource(
                        endpoint, bucket, name, "application/octet-stream", len(data)
                    )
                    storage._store.write_bytes(storage._object_path(bucket, name), data)
                    storage.objects.setdefault(bucket, {})[name] = objects._checksums(data, obj)
                storage._write_config_to_file()

            yield "gs://bench/cache", register
    finally:
        server.stop()


def _upload(store: Any, batch: dict[str, bytes]) -> None:
    """Put a batch of objects, again on a dropped connection (the emulator's short queue)."""
    for attempt in range(5):
        try:
            store.fs.pipe(batch)
            return
        except Exception:
            if attempt == 4:
                raise
            time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--source", required=True, help="a JAX cache directory to copy from")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--store", choices=("s3", "gcs"), default="s3")
    parser.add_argument("--no-unindexed", action="store_true", help="skip the scan without index")
    args = parser.parse_args()

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="bench-bucket-index-")
    os.environ.pop("CACHEDOCTOR_NO_INDEX", None)  # measured both ways below
    with _s3_server() if args.store == "s3" else _gcs_server() as (url, put):
        from cachedoctor.cache import listdir, reader
        from cachedoctor.core.scan.run import scan_directory
        from cachedoctor.storage import remote_store, stores
        from cachedoctor.storage.location import Location

        sources = sorted(p for p in Path(args.source).glob("*-cache") if p.is_file())
        if not sources:
            sys.exit(f"no entries in {args.source}")
        store = stores.open_store(url)
        assert isinstance(store, remote_store.RemoteStore)
        blobs = {p: p.read_bytes() for p in sources}
        batch_size = 32 if args.store == "s3" else 2500
        start = time.perf_counter()
        batch: dict[str, bytes] = {}
        for n in range(args.objects):
            src = sources[n % len(sources)]
            module = src.name[: -len("-cache") - 65]
            batch[store.path_of(f"{module}-{secrets.token_hex(32)}-cache")] = blobs[src]
            if len(batch) >= batch_size or n == args.objects - 1:
                put(store, batch)
                batch = {}
        upload_s = time.perf_counter() - start
        print(f"{args.store}: uploaded {args.objects} objects in {upload_s:.1f} s")

        def listing() -> None:
            listdir.list_cache(stores.open_store(url))  # a new store: nothing cached

        decoded: list[str] = []
        decode_item = reader.decode_item

        def counting(*a: Any, **kw: Any) -> Any:
            decoded.append(a[1].name)
            return decode_item(*a, **kw)

        reader.decode_item = counting  # type: ignore[assignment]
        first = _median_s(lambda: scan_directory(Location.parse(url)), 1)
        read_first, decoded[:] = len(decoded), []
        lst, repeated, ratios = [], [], []
        for _ in range(args.reps):  # alternating, so that load on the machine hits both
            lst.append(_median_s(listing, 1))
            repeated.append(_median_s(lambda: scan_directory(Location.parse(url)), 1))
            ratios.append(repeated[-1] / lst[-1])
        read_repeated = len(decoded) // args.reps
        lst_s, rep_s = statistics.median(lst), statistics.median(repeated)
        print(f"objects: {args.objects}, distinct sources: {len(sources)}, store: {args.store}")
        print(f"listing alone          {lst_s * 1000:9.0f} ms")
        print(
            f"first scan (cold index){first * 1000:9.0f} ms  {first / lst_s:6.2f} x listing"
            f"  ({read_first} objects read)"
        )
        print(
            f"repeated scan          {rep_s * 1000:9.0f} ms  {rep_s / lst_s:6.2f} x listing"
            f"  ({read_repeated} objects read; per-pair ratios {min(ratios):.2f}-{max(ratios):.2f})"
        )
        if not args.no_unindexed:
            os.environ["CACHEDOCTOR_NO_INDEX"] = "1"
            no_index = _median_s(lambda: scan_directory(Location.parse(url)), 1)
            print(
                f"scan without the index {no_index * 1000:9.0f} ms"
                f"  {no_index / lst_s:6.2f} x listing"
            )


if __name__ == "__main__":
    main()
