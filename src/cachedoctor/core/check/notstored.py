"""The modules JAX compiled during ``check``'s runs and would not store, with JAX's reason.

Two witnesses, the first preferred:

1. the stats records that the hook writes from each of CMD's processes at exit
   (``stablekeys/stats.py``: what became of each miss, as JAX's ``compiler._cache_write``
   decided it, and the settings it ran with). They do not depend on CMD's output, which a test
   runner may swallow: pytest's logging plugin captures JAX's log lines of passing tests;
2. JAX's own "Not writing persistent cache entry" lines in CMD's output
   (``runner.logged_refusals``, with ``JAX_EXPLAIN_CACHE_MISSES``): the only witness with
   ``--no-observe``, or where CMD's Python cannot load cachedoctor. When both speak of a module,
   its JAX line is quoted beside the records' reason.

A compile JAX refused in a process other than 0 is not "not stored" here: process 0 writes it,
and ``per_process`` says when the other processes' keys differ.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import replace

from cachedoctor.core.check.report import NotStored
from cachedoctor.core.check.runner import LoggedRefusal
from cachedoctor.core.usage.model import Record
from cachedoctor.core.usage.reasons import (
    ModuleEvidence,
    Reason,
    ReasonKind,
    advice,
    explain,
    settings_of,
    summed,
)
from cachedoctor.core.usage.validate import MAX_RECORD_BYTES, parse_record
from cachedoctor.layout import STATS_DIRNAME
from cachedoctor.stablekeys.stats import RECORD_SUFFIX

FROM_RECORDS = "stats records"
FROM_LOG = "JAX's log"


def record_names(cache: str) -> set[str]:
    """The stats records in the (local) cache now, by file name."""
    try:
        names = os.listdir(os.path.join(cache, STATS_DIRNAME))
    except OSError:
        return set()
    return {n for n in names if n.endswith(RECORD_SUFFIX) and not n.startswith(".")}


def read_records(cache: str, names: Iterable[str]) -> list[Record]:
    """The records of these names; a file that is no sound record is left out (``scan`` and
    ``stats`` report it)."""
    out = []
    for name in sorted(names):
        try:
            with open(os.path.join(cache, STATS_DIRNAME, name), "rb") as fh:
                out.append(parse_record(name, fh.read(MAX_RECORD_BYTES + 1)))
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            continue
    return out


def refused(records: Sequence[Record], logged: Sequence[LoggedRefusal]) -> tuple[NotStored, ...]:
    """Each module JAX would not store in these runs, by name: from the records where they
    tell, else from JAX's lines."""
    lines: dict[str, LoggedRefusal] = {}
    for line in logged:
        lines.setdefault(line.module, line)
    found: dict[str, NotStored] = {}
    settings = settings_of(records)
    for module in sorted({m for r in records for m in r.modules}):
        counters, processes = summed(records, module)
        if counters is None:
            continue
        unwritten = (
            counters.refused_host_callbacks
            + counters.refused_compile_time
            + counters.refused_size
            + counters.refused_read_only
            + counters.write_failures
            + counters.writes_lost
        )
        if not unwritten:
            continue
        # the reason of the misses JAX did not write (one module name can hold several
        # programs, some written); process > 0's refusals are not this module's story
        unwritten_only = replace(counters, writes=0, refused_process=0)
        reason = explain(ModuleEvidence(module, unwritten_only, processes, settings))
        said = lines.get(module)
        found[module] = NotStored(
            module=module,
            kind=reason.kind.value,
            summary=reason.summary,
            evidence=reason.evidence,
            advice=advice(reason, module),
            source=FROM_RECORDS,
            jax_log=said.line if said else None,
        )
    for module, line in lines.items():
        if module not in found:
            found[module] = _from_log(line)
    return tuple(found[m] for m in sorted(found))


def _from_log(line: LoggedRefusal) -> NotStored:
    """A module only JAX's line speaks of: its reason in JAX's words."""
    summary = f"JAX: {line.why}"
    reason = Reason(ReasonKind(line.kind), summary, line.line)
    return NotStored(
        module=line.module,
        kind=line.kind,
        summary=summary,
        evidence=f"{FROM_LOG}: {line.line}",
        advice=advice(reason, line.module),
        source=FROM_LOG,
        jax_log=line.line,
    )
