"""Decode many cache entries on every core: a bounded process pool, results in input order.

Decoding is CPU-bound (decompression, hashing, walking the protobufs, canonicalising HLO), so
threads do not help; processes do. On N cores, N - 1 workers take batches of about
``BATCH_BYTES`` (or ``BATCH_ENTRIES``) from the front, at most two each in flight, while this
process decodes from the back instead of waiting; results come back in the order of the
input, so the report is the same as a serial decode's. Small jobs are decoded in
this process: starting workers costs more than it saves. If the pool cannot start or a worker
dies, the remaining entries are decoded here. Given an executor (``executors.py``: a pool of the
caller's, a Dask cluster), the same batches go to it instead, whatever the job's size.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import multiprocessing
import os
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

from cachedoctor.cache import decompress, reader, travel
from cachedoctor.cache.listdir import CacheListing, DirItem
from cachedoctor.cache.model import EntryInfo
from cachedoctor.errors import CachedoctorError

BATCH_BYTES = 8 << 20
BATCH_ENTRIES = 256
MIN_PARALLEL_ENTRIES = 64  # fewer entries than this...
MIN_PARALLEL_BYTES = 16 << 20  # ...and fewer bytes than this...
# ...and fewer declared decompressed bytes than this x N / (N - 1) on N cores (min_declared):
# decode in this process
MIN_PARALLEL_DECLARED = 20 << 20
WORKERS_ENV = "CACHEDOCTOR_WORKERS"

Job = tuple[str, str | None, bool]  # path, key, the first tier only (``defer_hlo``)
Decoded = tuple[EntryInfo, str | None]  # an entry, and the digest of its bytes when asked for
T = TypeVar("T")
R = TypeVar("R")


class ExecutorError(CachedoctorError):
    """The executor named cannot be had, or failed while decoding."""

    slug = "executor"


def width(executor: Executor) -> int:
    """How many chunks ``executor`` runs at once: a pool's size, a Dask cluster's threads."""
    size = getattr(executor, "_max_workers", None)
    if isinstance(size, int) and size > 0:
        return size
    client = getattr(executor, "_client", None)  # dask.distributed's ClientExecutor
    if client is not None:
        with contextlib.suppress(Exception):
            threads: dict[str, int] = client.nthreads()
            return max(1, sum(threads.values()))
    return 4


def in_order(
    executor: Executor,
    fn: Callable[..., R],
    calls: Sequence[tuple[Any, ...]],
    progress: Callable[[R], None] | None = None,
) -> Iterator[R]:
    """``fn(*args)`` for each of ``calls`` on ``executor``, at most two per worker in flight,
    results in the order of ``calls``. A failure of the executor (a lost worker, a closed
    cluster) is an ``ExecutorError``; the calls not yet finished are cancelled."""
    window = 2 * width(executor)
    pending: deque[Future[R]] = deque()
    submitted = 0
    try:
        while submitted < len(calls) or pending:
            while submitted < len(calls) and len(pending) < window:
                pending.append(executor.submit(fn, *calls[submitted]))
                submitted += 1
            result = pending.popleft().result()
            if progress is not None:
                progress(result)
            yield result
    except CachedoctorError:
        raise
    except Exception as exc:
        raise ExecutorError(f"the executor failed: {type(exc).__name__}: {exc}") from exc
    finally:
        for future in pending:
            future.cancel()


def default_workers() -> int:
    """All cores this process may use (``CACHEDOCTOR_WORKERS`` overrides; 1 = no pool)."""
    env = os.environ.get(WORKERS_ENV)
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def min_declared(workers: int) -> int:
    """The declared decompressed bytes from which a pool of ``workers`` (this process and
    ``workers - 1`` forked ones) pays for its start. A pool's wall is about its start plus a
    1/N share of the decode, so it beats one process once the decode is worth N/(N-1) starts:
    twice ``MIN_PARALLEL_DECLARED`` on 2 cores, near it on many. Measured on 2 cores with
    ``benchmarks/bench_pool.py`` (docs/performance.md, Performance IV), the largest batches
    first (``grouped_batches``): a pool cost 3 % more wall than one process for 33 MB of large
    programs, 7 % less for 48 MB and 13-14 % less for 60 MB, so it starts at 40 MiB there (64
    MiB before, from Performance III's "Sixth round"); not measured on more cores."""
    return MIN_PARALLEL_DECLARED * workers // max(1, workers - 1)


def _decode_batch(jobs: Sequence[Job], max_decompressed: int, digested: bool) -> list[Decoded]:
    """Each job's entry; with ``digested``, also the digest of the bytes it was decoded from
    (``travel.decode_digested``: the same read, which also lets the reader serve a file equal
    to one decoded before without decoding it); the first tier only where the job says so
    (``reader.decode_entry(defer_hlo=True)``)."""
    out: list[Decoded] = []
    for path, key, defer_hlo in jobs:
        info, digest = travel.decode_digested(
            path, key, max_decompressed, defer_hlo, hash_big=digested
        )
        out.append((info, digest if digested else None))
    return out


def _batches(jobs: Sequence[T], sizes: Sequence[int], parts: int = 1) -> list[list[T]]:
    """Consecutive jobs cut into batches of at most BATCH_BYTES / BATCH_ENTRIES, and at least
    ``parts`` batches when there are enough jobs (so that every worker gets work)."""
    per_batch = max(1, min(BATCH_ENTRIES, -(-len(jobs) // max(1, parts))))
    batches: list[list[T]] = []
    current: list[T] = []
    current_bytes = 0
    for job, size in zip(jobs, sizes, strict=True):
        current.append(job)
        current_bytes += size
        if current_bytes >= BATCH_BYTES or len(current) >= per_batch:
            batches.append(current)
            current, current_bytes = [], 0
    if current:
        batches.append(current)
    return batches


def mp_context() -> multiprocessing.context.BaseContext:
    # fork starts workers in milliseconds with the reader already imported; but forking a
    # process that runs other threads (JAX's, when cachedoctor is used from a JAX program) can
    # deadlock the child, so then, and off Linux, use forkserver/spawn
    import threading

    if sys.platform.startswith("linux"):
        if threading.active_count() == 1 and "jax" not in sys.modules:
            return multiprocessing.get_context("fork")
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context()


def decode_items(
    listing: CacheListing,
    items: Sequence[DirItem],
    *,
    max_decompressed: int = reader.DEFAULT_MAX_DECOMPRESSED,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    defer_hlo: bool = False,
    executor: Executor | None = None,
) -> Iterator[EntryInfo]:
    """Decode ``items`` of ``listing`` (in their order), on ``workers`` processes, or on
    ``executor`` when one is given (every worker must see the folder at the same path).

    ``progress(n)`` is called with the number of entries finished since the last call.
    ``defer_hlo``: the first tier only (``reader.decode_entry``).
    """
    decoded = _decode_items(
        listing, items, max_decompressed, workers, progress, False, defer_hlo, executor
    )
    for info, _ in decoded:
        yield info


def decode_items_digested(
    listing: CacheListing,
    items: Sequence[DirItem],
    *,
    max_decompressed: int = reader.DEFAULT_MAX_DECOMPRESSED,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    defer_hlo: bool = False,
    executor: Executor | None = None,
) -> Iterator[Decoded]:
    """``decode_items``, each entry with the digest of the bytes it was decoded from (None
    when unknown), for the scan index (``travel.py``)."""
    return _decode_items(
        listing, items, max_decompressed, workers, progress, True, defer_hlo, executor
    )


def _decode_items(
    listing: CacheListing,
    items: Sequence[DirItem],
    max_decompressed: int,
    workers: int | None,
    progress: Callable[[int], None] | None,
    digested: bool,
    defer_hlo: bool,
    executor: Executor | None = None,
) -> Iterator[Decoded]:
    decode = functools.partial(_decode_batch, max_decompressed=max_decompressed, digested=digested)
    base = str(Path(listing.root))  # str(listing.path(item)), without a Path per entry
    deferred = first_tier_only(items) if defer_hlo else [False] * len(items)

    def job(n: int) -> Job:
        item = items[n]
        path = item.name if base == "." else os.path.join(base, item.name)
        return (path, item.key, deferred[n])

    sizes = [i.size for i in items]
    workers = default_workers() if workers is None else max(1, workers)
    pool_from = min_declared(workers)

    def small() -> bool:  # too little work for a pool (the frames' headers read last, if at all)
        return (
            len(items) < MIN_PARALLEL_ENTRIES
            and sum(sizes) < MIN_PARALLEL_BYTES
            and decompress.declared_total(job(n)[0] for n in range(len(items))) < pool_from
        )

    if executor is None and (workers == 1 or len(items) <= 1 or small()):
        jobs = [job(n) for n in range(len(items))]
        yield from _serial(_batches(jobs, sizes), decode, progress)
        return
    if executor is not None:
        workers = width(executor)
    order, batches = grouped_batches(items, 8 * workers)
    found: list[Decoded | None] = [None] * len(items)
    decoded: Iterator[Decoded]
    if executor is not None:
        calls = [([job(n) for n in batch],) for batch in batches]
        step = None if progress is None else (lambda done: progress(len(done)))
        decoded = (e for done in in_order(executor, decode, calls, step) for e in done)
    else:
        decoded = _pooled(batches, job, decode, min(workers, len(batches)), progress)
    for n, info in zip(order, decoded, strict=True):
        found[n] = info
    for result in found:
        assert result is not None
        yield result


def first_tier_only(items: Sequence[DirItem]) -> list[bool]:
    """For a first-tier decode (``tiers.py``): which items to decode with the first tier only.
    An entry that shares its module and its size with another is likely a copy of it (unstable
    keys write one executable again and again): copies tie, so every tier of theirs will be
    needed, and one decode with every tier now spares a second decode later. The others, and
    any copy this misses, are completed by ``tiers.complete`` where they tie."""
    seen = Counter((_module_of(i.key), i.size) for i in items)
    return [seen[(_module_of(i.key), i.size)] == 1 for i in items]


def grouped_batches(items: Sequence[DirItem], parts: int) -> tuple[list[int], list[list[int]]]:
    """The items' indices in batches (at least ``parts`` when there are enough), and the order
    they were batched in. Copies of one executable (unstable keys) have the same module and
    size: they go to the same batch, so one worker's memo decodes their HLO once
    (reader.hlo_facts). Largest first: the workers take batches from the front and the calling
    process from the back (``_pooled``), so the batches still held when they meet are the
    small ones (on ``dist-lrg``'s 20 large programs, 2 cores: 75-77 ms before, 67 ms;
    docs/performance.md, Performance IV)."""
    sizes = [i.size for i in items]
    order = sorted(range(len(items)), key=lambda n: (-sizes[n], _module_of(items[n].key), n))
    return order, _batches(order, [sizes[n] for n in order], parts=parts)


def start_digests(
    paths: Sequence[str], sizes: Sequence[int], *, workers: int | None = None
) -> Callable[[], list[str | None]]:
    """Start hashing the files at ``paths`` (``travel.file_digest``, each expected ``sizes``
    long) on other processes, while this one goes on (the scan index decodes its rows); the
    function returned waits for the digests, in order. Few files, one worker or no pool: they
    are hashed in this process when asked for."""
    workers = default_workers() if workers is None else max(1, workers)
    jobs = list(zip(paths, sizes, strict=True))

    def here() -> list[str | None]:
        return _digest_batch(jobs)

    if workers == 1 or (len(jobs) < MIN_PARALLEL_ENTRIES and sum(sizes) < MIN_PARALLEL_BYTES):
        return here
    # this process decodes the index's rows meanwhile: leave it a core
    batches = _batches(jobs, sizes, parts=max(1, workers - 1))
    try:
        pool = ProcessPoolExecutor(max_workers=max(1, workers - 1), mp_context=mp_context())
        futures = [pool.submit(_digest_batch, batch) for batch in batches]
    except (OSError, ValueError, NotImplementedError, RuntimeError):
        return here

    def wait() -> list[str | None]:
        try:
            return [d for f in futures for d in f.result()]
        except (BrokenProcessPool, OSError):
            return here()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return wait


class EarlyDigests:
    """Digests of a directory's entry files, being made on other cores since before the scan
    listed it (``start_hashing_dir``)."""

    def __init__(self, pool: ProcessPoolExecutor, futures: list[Future[dict[str, travel.Hashed]]]):
        self._pool = pool
        self._futures = futures

    def of(
        self, items: list[DirItem], path_of: Callable[[DirItem], str]
    ) -> Callable[[], list[str | None]]:
        """What waits for the digests of ``items``, in order: the early one where its file
        had the identity the listing saw, else one made here, now (after that ``lstat``)."""

        def wait() -> list[str | None]:
            seen: dict[str, travel.Hashed] = {}
            try:
                for f in self._futures:
                    seen.update(f.result())
            except (BrokenProcessPool, OSError):
                seen = {}
            finally:
                self.close()
            out: list[str | None] = []
            for item in items:
                got = seen.get(item.name)
                listed = (item.size, item.mtime_ns, item.ino, item.ctime_ns)
                if got is not None and got[:4] == listed:
                    out.append(got[4])
                else:
                    out.append(travel.file_digest(path_of(item), item.size))
            return out

        return wait

    def close(self) -> None:
        """Stop hashing (a scan that needs no digest after all): nothing waits on the pool."""
        if all(f.done() for f in self._futures):
            self._pool.shutdown(wait=True)
        else:
            _abandon(self._pool)


def start_hashing_dir(root: str, *, workers: int | None = None) -> EarlyDigests | None:
    """Start hashing every entry file in ``root`` on other processes now, before the scan
    lists it: for a restored copy (``index.travelled``), whose every row is served by the
    digest of its file's bytes, so hashing need not wait for the listing and the rows. None
    with one worker, or when no pool can start (the scan hashes later, as for other caches)."""
    workers = default_workers() if workers is None else max(1, workers)
    if workers == 1:
        return None
    parts = workers - 1  # this process lists the directory and decodes the rows meanwhile
    try:
        pool = ProcessPoolExecutor(max_workers=parts, mp_context=mp_context())
        where = os.path.abspath(root)  # a forkserver's workers may have another working dir
        futures = [pool.submit(travel.hash_entries_of_dir, where, n, parts) for n in range(parts)]
    except (OSError, ValueError, NotImplementedError, RuntimeError):
        return None
    return EarlyDigests(pool, futures)


def _digest_batch(jobs: Sequence[tuple[str, int]]) -> list[str | None]:
    return [travel.file_digest(path, size) for path, size in jobs]


def _module_of(key: str | None) -> str:
    return (key or "").rpartition("-")[0]


def decode_entries(
    listing: CacheListing, *, workers: int | None = None, **kwargs: object
) -> Iterator[EntryInfo]:
    """Every entry of a listing, decoded on all cores, in name order (``iter_entries``'s order)."""
    return decode_items(listing, listing.entries, workers=workers, **kwargs)  # type: ignore[arg-type]


Decode = Callable[[Sequence[Job]], list[Decoded]]


def _serial(
    batches: Sequence[Sequence[Job]],
    decode: Decode,
    progress: Callable[[int], None] | None,
) -> Iterator[Decoded]:
    for batch in batches:
        for job in batch:
            yield from decode([job])
            if progress is not None:
                progress(1)


def _pooled(
    batches: Sequence[Sequence[int]],
    job: Callable[[int], Job],
    decode: Decode,
    workers: int,
    progress: Callable[[int], None] | None,
) -> Iterator[Decoded]:
    """The batches decoded by ``workers`` cores: a pool of ``workers - 1`` processes takes them
    from the front while this process, instead of waiting for their results, decodes from the
    back; results come out in the batches' order. One fork fewer than a pool of ``workers``,
    and no core idle: on 2 cores, a few large programs cost a worker's start and half the
    decode, not two starts, the whole decode and the results sent back. If the pool cannot
    start or a worker dies, the rest is decoded here."""
    if workers < 2:
        yield from _serial([[job(n) for n in b] for b in batches], decode, progress)
        return
    try:
        _before_fork()
        pool = ProcessPoolExecutor(  # a forked worker inherits a scan's paused collector
            max_workers=workers - 1, mp_context=mp_context(), initializer=gc.enable
        )
    except (OSError, ValueError, NotImplementedError):
        yield from _serial([[job(n) for n in b] for b in batches], decode, progress)
        return
    own: dict[int, list[Decoded]] = {}  # batches this process decoded, until their turn
    pending: dict[int, Future[list[Decoded]]] = {}
    head = submitted = 0  # the next batch to yield; the next to send to the pool
    tail = len(batches)  # the batches from here on are this process's
    window = 2 * (workers - 1)
    broken = False
    try:
        while head < len(batches):
            while submitted < tail and len(pending) < window:
                jobs = [job(n) for n in batches[submitted]]  # made when sent: never all at once
                pending[submitted] = pool.submit(decode, jobs)
                submitted += 1
            if head in own:
                yield from own.pop(head)
            elif pending[head].done() or submitted == tail:
                result = pending.pop(head).result()
                if progress is not None:
                    progress(len(result))
                yield from result
            else:  # the pool is busy: decode the last batch nobody has taken
                tail -= 1
                own[tail] = decode([job(n) for n in batches[tail]])
                if progress is not None:
                    progress(len(own[tail]))
                continue
            head += 1
    except (BrokenProcessPool, OSError):
        broken = True
    finally:
        if broken:
            _abandon(pool)
        else:
            pool.shutdown(wait=True, cancel_futures=True)
    if broken:
        # a worker died (killed, out of memory): finish here, from the first unfinished batch
        # (the pool's, and one this process had taken but not finished: all before its own)
        left = [n for n in range(head, len(batches)) if n not in own]
        yield from _serial([[job(i) for i in batches[n]] for n in left], decode, progress)
        for n in range(head, len(batches)):
            if n in own:
                yield from own.pop(n)


def _before_fork() -> None:
    """What every worker would otherwise do on its own first, done once here before they are
    forked: protobuf's import and the HLO view's classes (~55 ms of CPU per process)."""
    if mp_context().get_start_method() == "fork":
        from cachedoctor.xla import hlo_facts

        hlo_facts.prepare()


def _abandon(pool: ProcessPoolExecutor) -> None:
    """Stop a broken pool without waiting on it (joining its threads can hang, CPython 3.11)."""
    processes = dict(getattr(pool, "_processes", None) or {})
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes.values():
        with contextlib.suppress(Exception):
            proc.kill()
