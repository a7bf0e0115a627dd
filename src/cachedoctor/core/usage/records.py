"""The processes' stats records (``cachedoctor-stats/``), read and validated: what each process
asked the cache for and got, as JAX's monitoring events counted it (``stablekeys/stats.py``).
A torn or foreign file is a finding, never an error.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from cachedoctor.core.findings import Finding, FindingKind, Severity
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.stablekeys.stats import (
    CONFIG_NAMES,
    COUNTERS,
    OUTCOMES,
    RECORD_FORMAT,
    RECORD_SUFFIX,
)
from cachedoctor.storage import fsops
from cachedoctor.storage.stores import Store

MAX_RECORD_BYTES = 1 << 20  # a record is a few KiB; anything larger is not one of ours


@dataclass(frozen=True)
class Counters:
    """Sums of the recorded counters (see stablekeys/stats.py for each one's JAX event).

    Each miss has at most one outcome: ``writes`` (the entry existed afterwards), a failed
    write, or one of JAX's refusals. Records written before outcomes were recorded count JAX's
    write event as a write, unchecked: those are ``unchecked_writes`` (part of ``writes``).
    """

    requests: int = 0
    hits: int = 0
    misses: int = 0
    writes: int = 0
    write_failures: int = 0  # JAX's put raised
    writes_lost: int = 0  # JAX's put returned, and no entry existed afterwards
    refused_process: int = 0  # JAX writes only from process 0
    refused_host_callbacks: int = 0
    refused_compile_time: int = 0  # under jax_persistent_cache_min_compile_time_secs
    refused_size: int = 0  # under jax_persistent_cache_min_entry_size_bytes
    unchecked_writes: int = 0  # of ``writes``: JAX's write event in an older record
    compile_secs: float = 0.0  # wall time of the compiles that missed
    saved_secs: float = 0.0  # JAX's compile_time_saved_sec, summed over hits
    retrieval_secs: float = 0.0

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.requests if self.requests else None

    @property
    def checked_writes(self) -> int:
        """Writes whose entry existed afterwards."""
        return self.writes - self.unchecked_writes

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(Counters)}
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": self.hit_rate}


@dataclass(frozen=True)
class Record:
    """One process's record."""

    file: str
    host: str
    pid: int
    start: float
    end: float
    jax: str
    hook: str
    modules: dict[str, Counters]
    # the cache settings in force at the process's exit (stablekeys.stats.CONFIG_NAMES); empty
    # in records from before they were recorded
    config: dict[str, float] = field(default_factory=dict)

    @property
    def day(self) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self.end))


def record_files(store: Store) -> list[str]:
    try:
        items = store.list(STATS_DIRNAME)
    except FileNotFoundError:
        return []
    return [
        i.name
        for i in items
        if not i.is_dir and i.name.endswith(RECORD_SUFFIX) and not fsops.is_own_temp(i.name)
    ]


def _counters(raw: object) -> Counters:
    if not isinstance(raw, dict):
        raise ValueError("module counters are not an object")
    values: dict[str, Any] = {}
    for name in COUNTERS:
        value = raw.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"counter {name!r} is not a number")
        values[name] = value if name.endswith("_secs") else int(value)
    if not any(name in raw for name in OUTCOMES if name != "writes"):
        values["unchecked_writes"] = values["writes"]  # an older record: the write event
    return Counters(**values)


def _config(raw: object) -> dict[str, float]:
    if not isinstance(raw, dict):
        return {}
    return {
        name: value
        for name, value in raw.items()
        if name in CONFIG_NAMES and isinstance(value, int | float) and not isinstance(value, bool)
    }


def parse_record(file: str, data: bytes) -> Record:
    """A record from its bytes; ValueError says why it is not one."""
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"over {MAX_RECORD_BYTES} bytes, larger than any record")
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
        raise ValueError(f"not a {RECORD_FORMAT} record")
    modules = doc.get("modules")
    if not isinstance(modules, dict):
        raise ValueError("no 'modules' object")
    return Record(
        file=file,
        host=str(doc.get("host", "?")),
        pid=int(doc.get("pid", 0)),
        start=float(doc["start"]),
        end=float(doc["end"]),
        jax=str(doc.get("jax", "")),
        hook=str(doc.get("hook", "")),
        modules={str(name): _counters(c) for name, c in modules.items()},
        config=_config(doc.get("config")),
    )


def read_records(store: Store) -> tuple[list[Record], list[Finding]]:
    """Every record in ``cachedoctor-stats/``; each unreadable file is a finding."""
    records, findings = [], []
    for name in record_files(store):
        path = f"{STATS_DIRNAME}/{name}"
        try:
            with store.open_read(path) as fh:
                data = fh.read(MAX_RECORD_BYTES + 1)
            records.append(parse_record(name, data))
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            findings.append(
                Finding(
                    kind=FindingKind.STATS_RECORD,
                    severity=Severity.WARNING,
                    message=f"{path} is not a readable stats record ({reason}); it is left out",
                    evidence="the file does not parse as a stats record",
                    advice=(
                        "a torn file from a killed process or a file that is not cachedoctor's: "
                        "inspect it; `cachedoctor stats --zero --apply` archives it with the "
                        "records and removes it"
                    ),
                    entries=(path,),
                )
            )
    return records, findings
