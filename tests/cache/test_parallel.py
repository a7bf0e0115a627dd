"""Parallel decoding gives exactly the serial result, in the same order, even if a worker dies."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from cachedoctor.cache import listdir, parallel, reader
from cachedoctor.core.scan.run import _cyclic_gc_paused, scan_directory
from cachedoctor.render.jsonout import dumps, scan_document
from cachedoctor.storage.location import Location
from tests.support.caches import entries_of


@pytest.fixture
def cache(seed_cache: Path, copy_of: Callable[[Path], Path]) -> Path:
    """The seed cache plus a truncated entry and an entry that is not compressed at all."""
    d = copy_of(seed_cache)
    entries = sorted(p for p in d.iterdir() if p.name.endswith("-cache"))
    data = entries[0].read_bytes()
    (d / f"jit_cut-{'a' * 64}-cache").write_bytes(data[: len(data) // 3])
    (d / f"jit_raw-{'b' * 64}-cache").write_bytes(b"not an entry")
    return d


_REAL_DECODE_BATCH = parallel._decode_batch
_REAL_SERIAL = parallel._serial


def _dying(
    jobs: Sequence[parallel.Job], max_decompressed: int, digested: bool
) -> list[parallel.Decoded]:
    """Decode in this process; die at once in a pool worker (module level: workers unpickle it).

    A pool worker knows its parent under every start method; a forkserver worker re-imports this
    module, so a pid recorded at import time would not tell it apart from the test process.
    """
    if multiprocessing.parent_process() is not None:
        os._exit(9)
    return _REAL_DECODE_BATCH(jobs, max_decompressed, digested)


@pytest.fixture
def tiny_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry per batch and no minimum, so a handful of entries really uses the pool."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ENTRIES", 0)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(parallel, "BATCH_ENTRIES", 1)


@pytest.mark.slow
def test_parallel_decode_equals_serial(cache: Path, tiny_batches: None) -> None:
    listing = listdir.list_cache(cache)
    serial = list(reader.iter_entries(listing))
    pooled = list(parallel.decode_entries(listing, workers=2))
    assert pooled == serial
    assert len(serial) == len(listing.entries) and any(e.problems for e in serial)


@pytest.mark.slow
def test_parallel_scan_report_equals_serial(cache: Path, tiny_batches: None) -> None:
    a = scan_directory(Location.parse(cache), now=2e9, use_index=False, workers=1)
    b = scan_directory(Location.parse(cache), now=2e9, use_index=False, workers=2)
    assert dumps(scan_document(a)) == dumps(scan_document(b))


@pytest.mark.slow
def test_progress_counts_every_entry(cache: Path, tiny_batches: None) -> None:
    listing = listdir.list_cache(cache)
    counts: list[int] = []
    list(parallel.decode_entries(listing, workers=2, progress=counts.append))
    assert sum(counts) == len(listing.entries)


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_dead_worker_is_replaced_by_serial_decoding(
    cache: Path, tiny_batches: None, monkeypatch: pytest.MonkeyPatch, start_method: str
) -> None:
    """A worker killed mid-scan (OOM killer) must not lose entries or hang the scan.

    forkserver is the start method once JAX is imported, spawn the one off Linux. Both start
    workers that re-import this module. fork is left out because the test session has imported
    JAX, and forking its threads can deadlock the child.
    """
    monkeypatch.setattr(parallel, "mp_context", lambda: multiprocessing.get_context(start_method))
    monkeypatch.setattr(parallel, "_decode_batch", _dying)
    fallback_batches: list[int] = []

    def serial(batches: Sequence[Sequence[parallel.Job]], *args: object) -> Iterator[object]:
        fallback_batches.append(len(batches))
        return _REAL_SERIAL(batches, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(parallel, "_serial", serial)
    listing = listdir.list_cache(cache)
    got = list(parallel.decode_entries(listing, workers=2))
    # the pool's batches failed over to this process (which decodes from the back meanwhile)
    assert len(fallback_batches) == 1 and 2 <= fallback_batches[0] <= len(listing.entries)
    assert got == list(reader.iter_entries(listing))


def test_default_workers_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.WORKERS_ENV, "3")
    assert parallel.default_workers() == 3
    monkeypatch.setenv(parallel.WORKERS_ENV, "zero")
    assert parallel.default_workers() == len(os.sched_getaffinity(0))


def _collector_state(
    jobs: Sequence[parallel.Job], max_decompressed: int, digested: bool
) -> list[parallel.Decoded]:
    """Decode, and say in each entry's module whether this process collects cyclic garbage."""
    import dataclasses
    import gc

    state = f"gc-{gc.isenabled()}-in-{'worker' if multiprocessing.parent_process() else 'main'}"
    return [
        (dataclasses.replace(e, module=state), d)
        for e, d in _REAL_DECODE_BATCH(jobs, max_decompressed, digested)
    ]


def _slow_in_workers(
    jobs: Sequence[parallel.Job], max_decompressed: int, digested: bool
) -> list[parallel.Decoded]:
    """Decode, slowly in a worker, and say in each entry's module which process decoded it."""
    import dataclasses
    import time

    worker = multiprocessing.parent_process() is not None
    if worker:
        time.sleep(0.3)
    return [
        (dataclasses.replace(e, module="worker" if worker else "main"), d)
        for e, d in _REAL_DECODE_BATCH(jobs, max_decompressed, digested)
    ]


@pytest.mark.slow
def test_this_process_decodes_beside_its_workers(
    cache: Path, tiny_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With N cores a pool of N - 1 workers takes batches from the front while this process
    decodes from the back instead of waiting: the same entries, in the same order."""
    pools: list[int] = []
    real_pool = ProcessPoolExecutor

    def counted(max_workers: int, **kwargs: object) -> ProcessPoolExecutor:
        pools.append(max_workers)
        return real_pool(max_workers=max_workers, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", counted)
    monkeypatch.setattr(parallel, "_decode_batch", _slow_in_workers)
    listing = listdir.list_cache(cache)
    got = list(parallel.decode_entries(listing, workers=2))
    serial = list(reader.iter_entries(listing))
    assert pools == [1]
    assert {e.module for e in got} == {"main", "worker"}
    assert len(got) == len(serial)
    assert [
        dataclasses.replace(e, module=s.module) for e, s in zip(got, serial, strict=True)
    ] == serial


_FAILED_HERE: list[int] = []


def _slow_in_workers_failing_here_once(
    jobs: Sequence[parallel.Job], max_decompressed: int, digested: bool
) -> list[parallel.Decoded]:
    """Decode, slowly in a worker; in this process, fail the first batch with an OSError."""
    import time

    if multiprocessing.parent_process() is not None:
        time.sleep(0.3)
    elif not _FAILED_HERE:
        _FAILED_HERE.append(1)
        raise OSError("the batch this process took failed")
    return _REAL_DECODE_BATCH(jobs, max_decompressed, digested)


@pytest.mark.slow
def test_a_batch_this_process_took_and_failed_is_decoded_again(
    cache: Path, tiny_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the batch this process took from the back fails, the rest is finished here with
    that batch among it: no entry lost, the order kept."""
    _FAILED_HERE.clear()
    monkeypatch.setattr(parallel, "_decode_batch", _slow_in_workers_failing_here_once)
    listing = listdir.list_cache(cache)
    got = list(parallel.decode_entries(listing, workers=2))
    assert _FAILED_HERE == [1]
    assert got == list(reader.iter_entries(listing))


@pytest.mark.slow
def test_a_scan_pauses_the_collector_but_its_workers_collect(
    cache: Path, tiny_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan's own process makes tens of thousands of acyclic objects (no collection
    while it runs); a worker decodes protobufs for minutes and keeps collecting."""
    import gc

    monkeypatch.setattr(parallel, "_decode_batch", _collector_state)
    report = scan_directory(Location.parse(cache), now=2e9, use_index=False, workers=2)
    states = {e.module for e in entries_of(report)}  # this process decodes some batches too
    assert "gc-True-in-worker" in states and states <= {"gc-True-in-worker", "gc-False-in-main"}
    assert gc.isenabled()
    with _cyclic_gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with _cyclic_gc_paused():
            pass
        assert not gc.isenabled()  # the caller's choice stays
    finally:
        gc.enable()


def test_likely_copies_are_decoded_with_every_tier_at_once() -> None:
    """A first-tier scan decodes an entry with every tier at once when another entry has its
    module and size (a likely copy: its tiers will be needed); the rest with the first only."""

    def item(module: str, size: int, n: int) -> listdir.DirItem:
        key = f"{module}-{n:064x}"
        return listdir.DirItem(
            key + "-cache", listdir.FileKind.ENTRY, key, size, 0, 0o100600, 0, False, False
        )

    items = [
        item("jit_f", 100, 1),
        item("jit_g", 100, 2),
        item("jit_f", 100, 3),
        item("jit_f", 101, 4),
        item("jit_h", 7, 5),
    ]
    assert parallel.first_tier_only(items) == [False, True, False, True, True]


def test_batches_go_largest_first_with_copies_together() -> None:
    """Workers take batches from the front and this process from the back (``_pooled``): the
    largest go first, so what a worker still holds when they meet is small; an entry's likely
    copies (module and size) share its batch, so one memo decodes their module once."""

    def item(module: str, size: int, n: int) -> listdir.DirItem:
        key = f"{module}-{n:064x}"
        return listdir.DirItem(
            key + "-cache", listdir.FileKind.ENTRY, key, size, 0, 0o100600, 0, False, False
        )

    sizes = [5, 900, 40, 900, 7, 300, 40, 2_000]
    items = [item("jit_g" if n == 3 else "jit_f", size, n) for n, size in enumerate(sizes)]
    order, batches = parallel.grouped_batches(items, 4)
    assert sorted(order) == list(range(len(items)))
    assert [n for batch in batches for n in batch] == order
    first = [items[n].size for n in order]
    assert first == sorted(first, reverse=True)  # the largest first
    assert any({2, 6} <= set(batch) for batch in batches)  # jit_f's two 40-byte entries


@pytest.mark.slow
def test_a_few_entries_that_decompress_large_go_to_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer entries and bytes than the minimums still go to the pool when their zstd frames
    declare enough (large programs compress 50 x): MIN_PARALLEL_DECLARED x N / (N - 1) bytes
    or more on N cores; a zlib file or a damaged frame declares nothing."""
    import zlib

    import zstandard

    from cachedoctor.cache import decompress

    frame = zstandard.ZstdCompressor().compress(b"\0" * (2 << 20))
    contents = [frame] * 3 + [zlib.compress(b"\0" * (4 << 20)), decompress.ZSTD_MAGIC + b"\xff"]
    for n, data in enumerate(contents):
        (tmp_path / f"jit_f-{n:064x}-cache").write_bytes(data)
    listing = listdir.list_cache(tmp_path)
    paths = [str(listing.path(i)) for i in listing.entries]
    assert decompress.declared_total(paths) == 3 * (2 << 20)
    pools: list[int] = []
    real_pooled = parallel._pooled

    def spy(batches: Sequence[Sequence[int]], *args: object) -> Iterator[object]:
        pools.append(len(batches))
        return real_pooled(batches, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(parallel, "_pooled", spy)
    # on 2 cores the pool pays from twice MIN_PARALLEL_DECLARED (parallel.min_declared)
    for declared, expected in ((3 * (1 << 20) + 1, []), (3 * (1 << 20), [5])):
        monkeypatch.setattr(parallel, "MIN_PARALLEL_DECLARED", declared)
        pools.clear()
        got = list(parallel.decode_entries(listing, workers=2))
        assert pools == expected and len(got) == 5
        assert [e.decompressed_size for e in got[:3]] == [2 << 20] * 3
    # with more cores a pool's start is shared by more of the decode: it pays sooner
    monkeypatch.setattr(parallel, "MIN_PARALLEL_DECLARED", (4 << 20) + 3)
    for workers, expected in ((2, []), (3, []), (4, [5])):  # over 8 and 6 MiB; 5.3 MiB
        pools.clear()
        list(parallel.decode_entries(listing, workers=workers))
        assert pools == expected, workers


def _listed(d: Path) -> dict[str, listdir.DirItem]:
    return {i.name: i for i in listdir.list_cache(d).entries}


def test_early_digests_serve_only_files_listed_as_they_were_hashed(tmp_path: Path) -> None:
    """A restored copy is hashed before it is listed (``start_hashing_dir``); a digest made so
    is used only where the listing's ``lstat`` shows the identity the file had while it was
    hashed: a file rewritten in between is hashed again, after the listing."""
    from cachedoctor.cache import travel

    names = [f"jit_f-{n:064x}-cache" for n in range(3)]
    for n, name in enumerate(names):
        (tmp_path / name).write_bytes(bytes([n]) * 1000)
    early = parallel.start_hashing_dir(str(tmp_path), workers=3)
    assert early is not None
    changed = tmp_path / names[1]
    waiter = early.of  # hashed already (the pool's result is awaited below)
    done = early._futures[0].result(), early._futures[1].result()
    assert sorted(k for d in done for k in d) == names  # two workers, each its share
    changed.write_bytes(b"\x07" * 1000)  # same size, new bytes: a new mtime/ctime
    items = _listed(tmp_path)
    got = waiter([items[n] for n in names], lambda i: str(tmp_path / i.name))()
    expected = [travel.file_digest(str(tmp_path / n), 1000) for n in names]
    assert got == expected
    assert got[1] != next(d for d in done if names[1] in d)[names[1]][4]  # not the early one


def test_no_early_hashing_on_one_core(tmp_path: Path) -> None:
    assert parallel.start_hashing_dir(str(tmp_path), workers=1) is None
