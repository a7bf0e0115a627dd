"""``lru-write-cost`` (core/scan/rules/lrucost.py): JAX's LRU eviction is in use and the entry
count makes every write's eviction pass cost, by the measured model, 0.1 s or more (a warning
from 1 s with JAX's .lockfile there); never without LRU evidence or with fewer entries."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor import units
from cachedoctor.cache.listdir import CacheListing, DirItem, FileKind
from cachedoctor.core import catalog
from cachedoctor.core.findings import FindingKind, Severity
from cachedoctor.core.scan.rules.lrucost import lru_write_cost_findings
from tests.support.cli import invoke

LOW_US, HIGH_US = catalog.LRU_PASS_US_PER_ENTRY
INFO_FROM_US, WARNING_FROM_US = catalog.LRU_WRITE_COST_FROM_US
AT_INFO = INFO_FROM_US // LOW_US  # 5,000 entries: 0.1 s per write at 20 µs
AT_WARNING = WARNING_FROM_US // LOW_US  # 50,000 entries: 1 s
ENTRY_BYTES = 50 * 1024


def _item(name: str, kind: FileKind, key: str | None, size: int) -> DirItem:
    return DirItem(name, kind, key, size, 0, 0o100644, 0, False, False)


def _listing(entries: int, *, lockfile: bool, atimes: bool, orphans: int = 0) -> CacheListing:
    """A listing made in memory, as ``listdir`` classifies a folder: ``entries`` entries of
    50 KiB, an -atime file beside each (``atimes``), JAX's .lockfile, -atime files of no entry."""
    items = []
    for i in range(entries):
        key = f"jit_f{i}-{i:064x}"
        items.append(_item(f"{key}-cache", FileKind.ENTRY, key, ENTRY_BYTES))
        if atimes:
            items.append(_item(f"{key}-atime", FileKind.ATIME, key, 8))
    for i in range(orphans):
        key = f"jit_gone{i}-{i:064x}"
        items.append(_item(f"{key}-atime", FileKind.ATIME, key, 8))
    if lockfile:
        items.append(_item(".lockfile", FileKind.LOCKFILE, None, 0))
    return CacheListing("/data/jaxcache", tuple(items), 0o40755, 0)


def test_the_threshold_is_the_models_cost_per_write() -> None:
    """From 5,000 entries (0.1 s at 20 µs each) under JAX's LRU, not one entry fewer; a warning
    from 50,000 (1 s) only with the .lockfile, the evidence that eviction ran in this folder."""
    assert lru_write_cost_findings(_listing(AT_INFO - 1, lockfile=True, atimes=True)) == []
    (found,) = lru_write_cost_findings(_listing(AT_INFO, lockfile=True, atimes=True))
    assert (found.kind, found.severity) == (FindingKind.LRU_WRITE_COST, Severity.INFO)
    assert found.message.startswith(f"{AT_INFO} entries under JAX's LRU eviction")
    assert f"about {AT_INFO * LOW_US // 1000} ms–{AT_INFO * HIGH_US // 1000} ms" in found.message
    assert "measured model (not measured here)" in found.message
    assert f"{LOW_US}–{HIGH_US} µs per entry held by benchmarks/bench_lru_write.py" in (
        found.evidence
    )

    (big,) = lru_write_cost_findings(_listing(AT_WARNING, lockfile=True, atimes=True))
    assert big.severity is Severity.WARNING
    assert "about 1.0 s–2.0 s per write" in big.message
    (unlocked,) = lru_write_cost_findings(_listing(AT_WARNING, lockfile=False, atimes=True))
    assert unlocked.severity is Severity.INFO  # -atime files alone: a copy, or JAX <= 0.5.0
    assert "no .lockfile (JAX up to 0.5.0 writes them without a size limit too)" in (
        unlocked.evidence
    )
    (near,) = lru_write_cost_findings(_listing(AT_WARNING - 1, lockfile=True, atimes=True))
    assert near.severity is Severity.INFO


def test_no_finding_without_evidence_of_jax_lru() -> None:
    """Many entries, but no .lockfile and no -atime file beside an entry: JAX's writes pay no
    eviction pass. -atime files of no entry are no evidence (as for ``missing-atime``)."""
    assert lru_write_cost_findings(_listing(AT_WARNING, lockfile=False, atimes=False)) == []
    listing = _listing(AT_WARNING, lockfile=False, atimes=False, orphans=3)
    assert lru_write_cost_findings(listing) == []
    (locked,) = lru_write_cost_findings(_listing(AT_INFO, lockfile=True, atimes=False))
    assert f"{AT_INFO} -cache names, JAX's .lockfile (eviction ran here); the model" in (
        locked.evidence
    )


def test_the_advice_names_a_size_prune_reads() -> None:
    """The advice's ``--max-size`` holds about 5,000 entries of the cache's mean size, written
    as ``prune --max-size`` reads it."""
    (found,) = lru_write_cost_findings(_listing(AT_WARNING, lockfile=True, atimes=True))
    size = found.advice.split("--max-size ", 1)[1].split()[0]
    assert found.advice.startswith(f"run `cachedoctor prune --max-size {size} --apply`")
    assert "scheduled job (cron, a CI schedule)" in found.advice
    budget = units.parse_size(size)
    assert AT_INFO * ENTRY_BYTES * 0.99 <= budget <= AT_INFO * ENTRY_BYTES
    assert f"about {AT_INFO} entries of this cache's mean size (50KiB)" in found.advice


def _fill(cache: Path, upto: int) -> None:
    """Copies of one real entry under made-up keys, each with its -atime file, until the cache
    holds ``upto`` entries."""
    real = sorted(cache.glob("*-cache"))[0]
    stamp = (cache / (real.name.removesuffix("-cache") + "-atime")).read_bytes()
    have = len(list(cache.glob("*-cache")))
    for i in range(have, upto):
        key = f"jit_filler{i}-{i:064x}"
        shutil.copyfile(real, cache / f"{key}-cache")
        (cache / f"{key}-atime").write_bytes(stamp)


def _cost_findings(cache: Path) -> list[dict[str, str]]:
    code, out, err = invoke("scan", "--json", str(cache))
    assert code == 0, err
    return [f for f in json.loads(out)["findings"] if f["kind"] == "lru-write-cost"]


@pytest.mark.slow
def test_a_real_lru_cache_with_many_entries(
    evict_cache: Path, copy_of: Callable[[Path], Path]
) -> None:
    """JAX wrote the cache with eviction on (its entries, -atime files and .lockfile); the bulk
    up to 5,000 entries is copies of one of its entries under made-up keys, because compiling
    5,000 programs takes JAX far longer than a test may: the rule reads only the listing (how
    many -cache names, and the LRU evidence), which the copies fill as JAX's own writes would."""
    cache = copy_of(evict_cache)
    assert (cache / ".lockfile").exists() and list(cache.glob("*-atime"))
    assert _cost_findings(cache) == []  # three entries: nothing to say
    _fill(cache, AT_INFO - 1)
    assert _cost_findings(cache) == []
    _fill(cache, AT_INFO)
    (found,) = _cost_findings(cache)
    assert found["severity"] == "info"
    assert found["message"].startswith(f"{AT_INFO} entries under JAX's LRU eviction")
    assert f"-atime files beside {AT_INFO} of {AT_INFO} entries" in found["evidence"]

    code, out, _ = invoke("lint", str(cache))
    assert code == 0 and "lru-write-cost" in out, out  # info: lint fails on errors by default

    (cache / ".lockfile").unlink()
    for atime in cache.glob("*-atime"):
        atime.unlink()
    assert _cost_findings(cache) == []  # no sign of JAX's LRU: writes pay no pass
