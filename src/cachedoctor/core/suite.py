"""A test suite's compiles, test by test: what the pytest plugin counted, each persistent-cache
miss explained in ``why``'s words, the figures of several processes (pytest-xdist's workers)
added up by test.

The counts come from JAX's own monitoring events (the plugin's listeners); a miss's cause from
what the stats recorder kept of its key (``stablekeys/stats.observe_misses``), set against the
cache's recorded history exactly as ``cachedoctor why`` sets a recorded miss (``core/why``).
A count JAX's events do not give is None (unknown), never 0; a miss whose key was not recorded
is ``unknown``, never guessed.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded at the first miss: a warm run's plugin imports none of it
    from cachedoctor.core.usage.model import MissedKey, Record
    from cachedoctor.storage.location import Location

OUTSIDE = "(outside tests)"  # compiles while no test ran: collection, session fixtures' ends
HOOK_OFF = (
    "the stats recorder is off in this process, so what went into the key is not known: run"
    " with CACHEDOCTOR_HOOK=stats (or `cachedoctor enable --stats-only`) to record it"
)
NOT_RECORDED = "the recorder kept no components for this key (a key JAX's code did not give again)"
NO_CACHE = "JAX's persistent cache is not set in this process: misses cannot be explained"


@dataclass(frozen=True)
class Miss:
    """One persistent-cache miss of a test: the module, its key and why, as ``why`` says it."""

    module: str
    key: str | None
    verdict: str  # "changed", "same-key", "first", "unknown" (core/why)
    words: str
    components: tuple[str, ...] = ()  # JAX's key components that differ
    outcome: str | None = None  # what became of the compile (stablekeys/stats OUTCOMES)

    @property
    def cause(self) -> str:
        """The miss in one line: its verdict and words."""
        return self.words if self.verdict == "changed" else f"{self.verdict}: {self.words}"


@dataclass(frozen=True)
class TestCompiles:
    """What one test compiled (setup, call and teardown), from JAX's events. ``requests`` and
    ``hits`` are None when this JAX sends no such event."""

    nodeid: str
    compilations: int = 0  # programs JAX took to its compile step: compiled, or loaded from cache
    compile_secs: float = 0.0  # in that step: XLA's compile, or the cache's load
    trace_secs: float = 0.0  # tracing to a jaxpr
    lower_secs: float = 0.0  # lowering a jaxpr to an MLIR module
    requests: int | None = 0  # compiles that asked the persistent cache
    hits: int | None = 0
    saved_secs: float = 0.0  # compile time JAX says its hits saved
    misses: tuple[Miss, ...] = ()
    failed_on_miss: bool = False  # --cachedoctor-fail-on-miss failed it

    @property
    def cache_misses(self) -> int | None:
        if self.requests is None or self.hits is None:
            return None
        return self.requests - self.hits

    @property
    def uncached(self) -> int | None:
        """Compiles that did not ask the persistent cache (it is off, or JAX skipped it)."""
        return None if self.requests is None else max(0, self.compilations - self.requests)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["cache_misses"] = self.cache_misses
        doc["misses"] = [asdict(m) for m in self.misses]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TestCompiles:
        misses = tuple(
            Miss(**{**m, "components": tuple(m.get("components") or ())})
            for m in doc.get("misses") or ()
        )
        names = {f for f in cls.__dataclass_fields__ if f != "misses"}
        return cls(**{k: v for k, v in doc.items() if k in names}, misses=misses)


def added(a: TestCompiles, b: TestCompiles) -> TestCompiles:
    """Two counts of one place added (a test's phases; the compiles outside tests of each
    process). Unknown stays unknown."""

    def both(x: int | None, y: int | None) -> int | None:
        return None if x is None or y is None else x + y

    return replace(
        a,
        compilations=a.compilations + b.compilations,
        compile_secs=a.compile_secs + b.compile_secs,
        trace_secs=a.trace_secs + b.trace_secs,
        lower_secs=a.lower_secs + b.lower_secs,
        requests=both(a.requests, b.requests),
        hits=both(a.hits, b.hits),
        saved_secs=a.saved_secs + b.saved_secs,
        misses=a.misses + b.misses,
        failed_on_miss=a.failed_on_miss or b.failed_on_miss,
    )


@dataclass(frozen=True)
class CauseGroup:
    """The misses that one cause explains, across the suite."""

    verdict: str
    words: str
    misses: int
    modules: tuple[str, ...]
    tests: tuple[str, ...]


@dataclass(frozen=True)
class SuiteReport:
    """The suite's compiles: per test (in the order they ran), outside tests, and how they
    were counted."""

    tests: tuple[TestCompiles, ...]
    outside: TestCompiles
    jax: str | None
    missing_events: tuple[str, ...]  # JAX events this JAX never sends: their counts unknown
    recorder: str | None  # the stats recorder's mode in the processes (None: off)
    cache_dir: str | None
    processes: int = 1
    fail_on_miss: bool = False

    @property
    def totals(self) -> TestCompiles:
        total = TestCompiles("(total)")
        for t in (*self.tests, self.outside):
            total = added(total, t)
        return total

    def ranked(self) -> list[TestCompiles]:
        """The tests that compiled, the longest compile first."""
        compiled = [t for t in self.tests if t.compilations or t.trace_secs or t.lower_secs]
        return sorted(compiled, key=lambda t: -(t.compile_secs + t.trace_secs + t.lower_secs))

    def causes(self) -> list[CauseGroup]:
        """The misses grouped by cause, the most frequent first: a cause said of each module
        (``first``: no earlier key of jit_f ...) is one cause of "the module", naming them all."""
        groups: dict[tuple[str, str], list[tuple[Miss, str]]] = {}
        for t in (*self.tests, self.outside):
            for m in t.misses:
                words = m.words.replace(m.module, "the module") if m.module else m.words
                groups.setdefault((m.verdict, words), []).append((m, t.nodeid))
        out = [
            CauseGroup(
                verdict,
                words,
                len(found),
                tuple(dict.fromkeys(m.module for m, _ in found)),
                tuple(dict.fromkeys(n for _, n in found)),
            )
            for (verdict, words), found in groups.items()
        ]
        return sorted(out, key=lambda g: (-g.misses, g.verdict, g.words))

    def to_dict(self) -> dict[str, Any]:
        return {
            "jax": self.jax,
            "missing_events": list(self.missing_events),
            "recorder": self.recorder,
            "cache_dir": self.cache_dir,
            "processes": self.processes,
            "fail_on_miss": self.fail_on_miss,
            "totals": self.totals.to_dict(),
            "tests": [t.to_dict() for t in self.tests],
            "outside_tests": self.outside.to_dict(),
            "causes": [asdict(g) for g in self.causes()],
        }


def merged(parts: Iterable[Mapping[str, Any]], fail_on_miss: bool = False) -> SuiteReport:
    """The documents of several processes (``part_document``) as one report: each test once,
    by node id (a test reported twice, by a worker that replaced a crashed one, counts once:
    the later report), the compiles outside tests added up."""
    tests: dict[str, TestCompiles] = {}
    outside = TestCompiles(OUTSIDE)
    found = list(parts)
    for part in found:
        for doc in part.get("tests") or ():
            t = TestCompiles.from_dict(doc)
            tests[t.nodeid] = t
        outside = added(outside, TestCompiles.from_dict(part.get("outside") or {"nodeid": OUTSIDE}))
    first = found[0] if found else {}
    missing = sorted({e for p in found for e in p.get("missing_events") or ()})
    recorders = [p.get("recorder") for p in found if p.get("recorder")]
    return SuiteReport(
        tests=tuple(tests.values()),
        outside=outside,
        jax=first.get("jax"),
        missing_events=tuple(missing),
        recorder=recorders[0] if recorders else None,
        cache_dir=first.get("cache_dir"),
        processes=len(found) or 1,
        fail_on_miss=fail_on_miss,
    )


def part_document(
    tests: Iterable[TestCompiles],
    outside: TestCompiles,
    *,
    jax: str | None,
    missing_events: Iterable[str],
    recorder: str | None,
    cache_dir: str | None,
) -> dict[str, Any]:
    """One process's figures as JSON-ready data (what an xdist worker hands its controller)."""
    return {
        "tests": [t.to_dict() for t in tests],
        "outside": outside.to_dict(),
        "jax": jax,
        "missing_events": sorted(missing_events),
        "recorder": recorder,
        "cache_dir": cache_dir,
    }


@dataclass
class MissExplainer:
    """Each miss of this process set against its cache's recorded history, as ``why`` sets a
    recorded miss: the cache's records and entries read once, at the first miss."""

    where: Location | None
    session_keys: set[str] = field(default_factory=set)  # this process's missed keys
    _history: tuple[list[MissedKey], dict[str, float], set[str], bool] | None = None
    _record: Record | None = None

    @classmethod
    def of_setting(cls, cache_dir: str | None) -> MissExplainer:
        """For the cache JAX's setting names (None: unset)."""
        from cachedoctor.storage.location import Location

        return cls(Location.of_setting(cache_dir))

    def explain(self, doc: Mapping[str, Any] | None, module: str) -> Miss:
        """The miss the recorder described in ``doc`` (None: the recorder is off)."""
        from cachedoctor.core.usage.model import missed_key_of
        from cachedoctor.core.why import explain_miss

        if doc is None:
            return Miss(module, None, "unknown", HOOK_OFF)
        key = doc.get("key")
        outcome = doc.get("outcome")
        if key is None:
            return Miss(module, None, "unknown", NOT_RECORDED, outcome=outcome)
        self.session_keys.add(str(key))
        miss = missed_key_of(str(key), doc)
        if miss is None:
            return Miss(module, str(key), "unknown", NOT_RECORDED, outcome=outcome)
        if self.where is None:
            return Miss(module, miss.key, "unknown", NO_CACHE, outcome=outcome)
        earlier, written_at, recorded, cache_read = self._read()
        before = [m for m in earlier if m.module == miss.module and m.time <= miss.time]
        known = recorded | self.session_keys
        unknown = {k for k, t in written_at.items() if k not in known and t <= miss.time}
        said = explain_miss(
            miss,
            self._this_record(),
            before,
            set(written_at),
            unknown,
            self.where if cache_read else None,
            cache_read,
        )
        changed = tuple(c.component for c in said.changes)
        return Miss(miss.module, miss.key, said.verdict, said.words, changed, outcome)

    def _read(self) -> tuple[list[MissedKey], dict[str, float], set[str], bool]:
        from cachedoctor.core.usage.records_of import records_by_cache
        from cachedoctor.core.why import entry_times
        from cachedoctor.errors import CachedoctorError

        if self._history is None:
            assert self.where is not None
            try:
                groups = records_by_cache(self.where)
                written_at = entry_times(self.where.store())
                cache_read = True
            except (OSError, CachedoctorError):
                groups, written_at, cache_read = [], {}, False
            found = [m for g in groups[:1] for r in g.records for m in r.missed.values()]
            self._history = (found, written_at, {m.key for m in found}, cache_read)
        return self._history

    def _this_record(self) -> Record:
        from cachedoctor.core.usage.model import Record

        if self._record is None:
            now = time.time()
            host = socket.gethostname()
            self._record = Record("(this run)", host, os.getpid(), now, now, "", "", {})
        return self._record
