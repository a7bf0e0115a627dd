"""A stats record's bytes to a ``Record``, each rule its recorder keeps checked.

Kept apart from reading the folder (``records.py``: which files, the records index, the
findings): this is what makes a file a sound record, the one parser that ``stats``, ``lint``,
``prune`` and ``check`` all trust. ``ValueError`` says a file is not a record at all,
``RuleBroken`` which rule its numbers break (docs/stats.md, "Reading").
"""

from __future__ import annotations

import json
import math
import operator
from typing import Any

from cachedoctor.core.usage.model import (
    KEY_VALUES,
    Counters,
    KeyCounts,
    LoadFailure,
    MissedKey,
    Record,
    load_failure_of,
    make_key_counts,
    missed_key_of,
)
from cachedoctor.stablekeys.stats import CONFIG_NAMES, COUNTERS, KEY_COUNTS, OUTCOMES, RECORD_FORMAT

MAX_RECORD_BYTES = 1 << 20  # a record is a few KiB; anything larger is not one of ours


# What every record the recorder writes obeys (docs/stats.md, "Reading"): counts are whole
# numbers, none negative; compile and retrieval times are not negative; every number is finite;
# a module's hits plus misses are at most its requests (JAX sends a hit only after a request,
# and the recorder counts a miss only for a request without one). saved_secs may be negative.
COUNTS = (*(n for n in COUNTERS if not n.endswith("_secs")), "lookups")  # whole; the rest: s
NEVER_NEGATIVE = ("compile_secs", "retrieval_secs")  # saved_secs may be: JAX's own difference


class RuleBroken(ValueError):
    """A record that parses but breaks a rule every recorded record keeps (above)."""


def _number(module: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"module {module!r}: counter {name!r} is not a number")
    if not math.isfinite(value):
        raise RuleBroken(f"module {module!r}: {name} {json.dumps(value)} is not a finite number")
    if name in COUNTS and value != int(value):
        raise RuleBroken(f"module {module!r}: {name} {value} is not a whole number")
    if value < 0 and (name in COUNTS or name in NEVER_NEGATIVE):
        raise RuleBroken(f"module {module!r}: {name} {value} is negative")
    return value


_COUNT_NAMES = tuple(n for n in COUNTERS if n in COUNTS)
_TIME_NAMES = tuple(n for n in COUNTERS if n not in COUNTS)
_TIME_NEVER_NEGATIVE = tuple(n in NEVER_NEGATIVE for n in _TIME_NAMES)
_OLDER_OUTCOMES = tuple(n for n in OUTCOMES if n != "writes")  # absent from older records


def _plain(counts: list[Any], times: list[Any] | None = None) -> bool:
    """Whether the values keep every rule of :func:`_number` as they are (counts ints, not
    negative; times finite, those in NEVER_NEGATIVE not negative), checked a list at once:
    False sends them through ``_number``, which says which rule one breaks."""
    if not set(map(type, counts)) <= {int} or (counts and min(counts) < 0):
        return False
    if times is None:  # a key's counts: no times
        return True
    if not set(map(type, times)) <= {int, float} or not math.isfinite(sum(times)):
        return False  # a sum of finite numbers is finite unless it overflows: then the slow way
    return all(v >= 0 for v, never in zip(times, _TIME_NEVER_NEGATIVE, strict=True) if never)


def _counters(module: str, raw: object) -> Counters:
    if not isinstance(raw, dict):
        raise ValueError(f"module {module!r}: counters are not an object")
    counts = [raw.get(name, 0) for name in _COUNT_NAMES]
    times = [raw.get(name, 0) for name in _TIME_NAMES]
    values: dict[str, Any]
    if _plain(counts, times):
        values = dict(zip(_COUNT_NAMES, counts, strict=True))
        values["unchecked_writes"] = 0
        values.update(zip(_TIME_NAMES, times, strict=True))
    else:
        pairs = zip(_COUNT_NAMES, counts, strict=True)
        values = {name: int(_number(module, name, v)) for name, v in pairs}
        values["unchecked_writes"] = 0
        pairs = zip(_TIME_NAMES, times, strict=True)
        values.update((name, _number(module, name, v)) for name, v in pairs)
    if not any(name in raw for name in _OLDER_OUTCOMES):
        values["unchecked_writes"] = values["writes"]  # an older record: the write event
    c = object.__new__(Counters)  # every field set, in order: Counters.__init__ without its cost
    c.__dict__.update(values)
    for part, value in (("hits", c.hits), ("misses", c.misses)):
        if value > c.requests:
            raise RuleBroken(f"module {module!r}: {part} {value} > requests {c.requests}")
    if c.hits + c.misses > c.requests:
        raise RuleBroken(
            f"module {module!r}: hits + misses {c.hits + c.misses} > requests {c.requests}"
        )
    return c


def _key_counts(module: str, key: object, counts: dict[Any, Any]) -> KeyCounts:
    values = [counts.get(name, 0) for name in KEY_COUNTS]
    if not _plain(values):
        try:  # a count: whole, not negative
            values = [int(_number(module, n, v)) for n, v in zip(KEY_COUNTS, values, strict=True)]
        except RuleBroken as exc:
            raise RuleBroken(f"{exc} (key {key})") from None
        except ValueError as exc:
            raise ValueError(f"{exc} (key {key})") from None
    return make_key_counts(values)


def _keys(module: str, raw: object, c: Counters) -> dict[str, KeyCounts]:
    """A module's ``keys``: each count whole and not negative, a key's hits at most its lookups,
    its hits plus writes at most the module's requests, and the keys' sums at most the module's
    own requests, hits and writes (each is counted in both, the key's only when it fits)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"module {module!r}: keys are not an object")
    out: dict[str, KeyCounts] = {}
    for key, counts in raw.items():
        if not isinstance(counts, dict):
            raise ValueError(f"module {module!r}: key {key!r}: counts are not an object")
        k = _key_counts(module, key, counts)
        if k.hits > k.lookups:
            raise RuleBroken(f"module {module!r}: key {key}: hits {k.hits} > lookups {k.lookups}")
        if k.hits + k.writes > c.requests:
            raise RuleBroken(
                f"module {module!r}: key {key}: hits + writes {k.hits + k.writes} > requests "
                f"{c.requests}"
            )
        out[str(key)] = k
    for name, limit in (("lookups", c.requests), ("hits", c.hits), ("writes", c.writes)):
        summed = sum(getattr(k, name) for k in out.values())
        if summed > limit:
            what = "requests" if name == "lookups" else name
            raise RuleBroken(f"module {module!r}: keys' {name} {summed} > {what} {limit}")
    return out


def _modules(raw: dict[Any, Any]) -> tuple[dict[str, Counters], dict[str, KeyCounts]]:
    modules: dict[str, Counters] = {}
    keys: dict[str, KeyCounts] = {}
    for name, counters in raw.items():
        c = modules[str(name)] = _counters(str(name), counters)
        for key, k in _keys(str(name), counters.get("keys"), c).items():
            prior = keys.get(key)  # a key under two module names: once summed
            if prior is not None:
                k = make_key_counts(map(operator.add, KEY_VALUES(prior), KEY_VALUES(k)))
            keys[key] = k
    return modules, keys


def _config(raw: object) -> dict[str, float]:
    if not isinstance(raw, dict):
        return {}
    return {
        name: value
        for name, value in raw.items()
        if name in CONFIG_NAMES and isinstance(value, int | float) and not isinstance(value, bool)
    }


def parse_record(file: str, data: bytes) -> Record:
    """A record from its bytes; ValueError says why it is not one (``RuleBroken``: which rule
    its numbers break)."""
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"over {MAX_RECORD_BYTES} bytes, larger than any record")
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a {RECORD_FORMAT} record")
    modules = doc.get("modules")
    if not isinstance(modules, dict):
        raise ValueError("no 'modules' object")
    start, end = float(doc["start"]), float(doc["end"])
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuleBroken("start and end are not finite times")
    counters, keys = _modules(modules)
    return Record(
        file=file,
        host=str(doc.get("host", "?")),
        pid=int(doc.get("pid", 0)),
        start=start,
        end=end,
        jax=str(doc.get("jax", "")),
        hook=str(doc.get("hook", "")),
        modules=counters,
        config=_config(doc.get("config")),
        keys=keys,
        missed=_missed(doc.get("missed")),
        cache_dir=_cache_dir(doc),
        load_failures=_load_failures(doc.get("load_failures")),
    )


def _cache_dir(doc: dict[str, Any]) -> str | None:
    """The cache a read-only process's record names (None: the cache whose folder holds it)."""
    named = doc.get("cache_dir")
    if doc.get("read_only") is not True or not isinstance(named, str) or not named:
        return None
    return named


def _missed(raw: object) -> dict[str, MissedKey]:
    if not isinstance(raw, dict):
        return {}
    found = ((str(k), missed_key_of(k, v)) for k, v in raw.items())
    return {k: m for k, m in found if m is not None}


def _load_failures(raw: object) -> dict[str, LoadFailure]:
    if not isinstance(raw, dict):
        return {}
    found = ((str(k), load_failure_of(k, v)) for k, v in raw.items())
    return {k: f for k, f in found if f is not None}
