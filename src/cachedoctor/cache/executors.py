"""Decode on any ``concurrent.futures.Executor``: a thread or process pool, or a Dask cluster.

Each entry's decode is independent of the others, so it can run anywhere that can read the
entry. Items go to the executor in chunks (``parallel.grouped_batches``: about 8 MiB or 256 entries,
copies of one executable in one chunk), at most two chunks per worker in flight, and the results
are put back in listing order: the report is the one a serial decode gives. A chunk carries
plain, picklable data: ``(path, key)`` pairs for a local folder (every worker must see it at
the same path), or the store's description (``stores.spec_of``: URL, concurrency, endpoint
settings) and the listed items of a bucket; a worker opens the store once per process and keeps
its connections, and sends its request counters back with the entries.

``--executor`` names one (``parse_executor``): ``local`` (cachedoctor's own pool, the default),
``processes:N``, or a Dask scheduler as ``dask://host:port`` or ``tcp://host:port`` (the
``dask`` extra).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from cachedoctor.cache.listdir import DirItem
from cachedoctor.cache.model import EntryInfo
from cachedoctor.cache.parallel import ExecutorError, grouped_batches, in_order, mp_context, width
from cachedoctor.storage import stores

DASK_EXTRA = "pip install 'cachedoctor[dask]' ('.[dask]' in a clone of cachedoctor)"
CONNECT_TIMEOUT_S = 10
FORMS = "local, processes:N, dask://HOST:PORT or tcp://HOST:PORT"


@dataclass(frozen=True)
class ExecutorChoice:
    """What ``--executor`` names: ``kind`` is local, processes or dask."""

    kind: str
    workers: int | None = None
    address: str | None = None  # a Dask scheduler, as distributed spells it (tcp://host:port)

    @property
    def label(self) -> str:
        if self.kind == "processes":
            return f"{self.workers} processes"
        if self.kind == "dask":
            return f"Dask {self.address}"
        return "local"


_ADDRESS = re.compile(r"^(?:dask|tcp)://(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def parse_executor(text: str) -> ExecutorChoice:
    """``local``, ``processes:N`` (N >= 1), ``dask://host:port`` or ``tcp://host:port``."""
    value = text.strip()
    if value == "local":
        return ExecutorChoice("local")
    if value.startswith("processes:"):
        count = value.partition(":")[2]
        if count.isdigit() and int(count) > 0:
            return ExecutorChoice("processes", workers=int(count))
        raise ValueError(f"processes:N needs a number of processes >= 1, not {count!r} ({FORMS})")
    match = _ADDRESS.match(value)
    if match and 0 < int(match.group(2)) < 65536:
        return ExecutorChoice("dask", address=f"tcp://{match.group(1)}:{match.group(2)}")
    raise ValueError(f"not an executor: {text!r} (expected {FORMS})")


@contextlib.contextmanager
def open_executor(choice: ExecutorChoice) -> Iterator[Executor | None]:
    """The executor ``choice`` names (None for ``local``), shut down or disconnected after."""
    if choice.kind == "local":
        yield None
    elif choice.kind == "processes":
        import gc
        from concurrent.futures import ProcessPoolExecutor

        assert choice.workers is not None
        pool = ProcessPoolExecutor(choice.workers, mp_context=mp_context(), initializer=gc.enable)
        with pool:
            yield pool
    else:
        with _dask_client(str(choice.address)) as client:
            yield client.get_executor(pure=False)  # every chunk is new work: no hashing


@contextlib.contextmanager
def _dask_client(address: str) -> Iterator[Any]:
    try:
        import distributed
    except ImportError:
        raise ExecutorError(f"--executor {address} needs dask.distributed: {DASK_EXTRA}") from None
    connect: Any = distributed.Client  # untyped
    try:
        client = connect(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ExecutorError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    try:
        yield client
    finally:
        client.close()


Counts = tuple[int, int, int, dict[str, int]]  # storage.model.IoStats.counts()


def decode_store_chunk(
    spec: stores.StoreSpec, items: Sequence[DirItem], max_decompressed: int, defer_hlo: bool
) -> tuple[list[EntryInfo], Counts]:
    """Run by a worker: one chunk of a bucket's entries, read through the store ``spec`` names
    (concurrently, bounded by its pool), with the requests it took."""
    from cachedoctor.cache import reader

    store = stores.reopen(spec)
    listed = [(i.name, i.size, i.version) for i in items]
    with stores.one_line_errors(store.url), store.reading_as_listed(listed):
        found = reader.decode_store_entries(
            store, items, max_decompressed=max_decompressed, defer_hlo=defer_hlo
        )
    return found, store.stats.counts()


def decode_store_items(
    store: stores.Store,
    items: Sequence[DirItem],
    executor: Executor,
    *,
    max_decompressed: int,
    defer_hlo: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[EntryInfo]:
    """Every item of a bucket listing decoded on ``executor``, in the order of ``items``; the
    workers' request counts are added to ``store.stats``."""
    spec = stores.spec_of(store)
    order, chunks = grouped_batches(items, 8 * width(executor))
    calls = [(spec, [items[n] for n in chunk], max_decompressed, defer_hlo) for chunk in chunks]

    def finished(result: tuple[list[EntryInfo], Counts]) -> None:
        store.stats.merge(result[1])
        if progress is not None:
            progress(len(result[0]))

    found: list[EntryInfo | None] = [None] * len(items)
    results = in_order(executor, decode_store_chunk, calls, finished)
    decoded = (e for chunk, _ in results for e in chunk)
    for n, info in zip(order, decoded, strict=True):
        found[n] = info
    return [e for e in found if e is not None]
