"""What JAX's LRU eviction costs each write, by the entry count: ``lru-write-cost``.

With ``jax_compilation_cache_max_size`` set, every ``LRUCache.put`` first runs the eviction pass
under the ``.lockfile`` (``jax/_src/lru_cache.py``, 0.4.38 to 0.12.0.1): it globs every
``-cache`` name, stats it and reads its ``-atime`` file, evicting or not. A write's cost grows
with the entries held; a hit (``get``) pays only the lock and one ``-atime`` write. The cost is
a model (``catalog.LRU_PASS_US_PER_ENTRY``, measured by benchmarks/bench_lru_write.py), quoted as
one: the listing says how many entries the pass visits, not how fast this machine visits them.
"""

from __future__ import annotations

from cachedoctor.cache.listdir import CacheListing
from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding, Severity
from cachedoctor.core.scan.report import LruEvidence, lru_evidence

INFO_FROM_US, WARNING_FROM_US = catalog.LRU_WRITE_COST_FROM_US


def lru_write_cost_findings(listing: CacheListing) -> list[Finding]:
    """``lru-write-cost`` when JAX's LRU is in use and its pass, by the model, costs each write
    ``INFO_FROM_US`` or more."""
    lru = lru_evidence(listing)
    n = len(listing.entries)  # JAX globs every -cache name, symbolic links too
    low_us, high_us = catalog.LRU_PASS_US_PER_ENTRY
    low, high = n * low_us, n * high_us  # µs per write, by the model
    if not lru.in_use or low < INFO_FROM_US:
        return []
    sizes = [i.size for i in listing.entries if not i.is_symlink]
    mean = sum(sizes) // len(sizes) if sizes else 0
    target = INFO_FROM_US // low_us
    warn = low >= WARNING_FROM_US and lru.lockfile
    return [
        catalog.LRU_WRITE_COST.finding(
            f"{n} entries under JAX's LRU eviction: each write JAX makes to this cache first "
            f"stats them all, about {_duration(low)}–{_duration(high)} per write "
            "by the measured model (not measured here)",
            severity=Severity.WARNING if warn else None,
            held=f"{n}",
            lru=_evidence(lru, n),
            size=_size_argument(target * mean),
            target=f"{target}",
            mean=_size_argument(mean),
            target_cost=_duration(INFO_FROM_US),
        )
    ]


def _evidence(lru: LruEvidence, n: int) -> str:
    atimes = f"-atime files beside {len(lru.with_atime)} of {n} entries"
    if lru.lockfile:
        return f"JAX's .lockfile (eviction ran here){', ' + atimes if lru.with_atime else ''}"
    return f"{atimes}, no .lockfile (JAX up to 0.5.0 writes them without a size limit too)"


def _duration(us: int) -> str:
    return f"{us / 1e6:.1f} s" if us >= 1_000_000 else f"{us / 1000:.0f} ms"


def _size_argument(n: int) -> str:
    """A size as ``prune --max-size`` reads it, rounded down: ``1.2GiB``, ``270MiB``, ``48KiB``."""
    if n >= 1 << 30:
        return f"{int(n / (1 << 30) * 10) / 10:g}GiB"
    if n >= 1 << 20:
        return f"{n >> 20}MiB"
    return f"{max(n >> 10, 1)}KiB"
