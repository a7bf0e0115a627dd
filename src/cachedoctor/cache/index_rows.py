"""The scan index's rows: how an ``EntryInfo`` becomes plain values and text, and comes back.

Kept apart from ``index.py`` (when a row is trusted, reading and writing rows) and
``index_file.py`` (where the sqlite file lives, what it says of itself): this is only the shape
of a row. A row holds an entry's own values
(compile time, compression: typed columns), the id of its parts and shared scalars (JSON text,
the same for copies of one executable: stored once, decoded once) and the id of its HLO
summary (JSON text, stored once); each row carries a checksum of its values, each body is
known by the digest of its text. Plain values only (JSON, no pickle): reading an index can
never run code.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
from collections.abc import Callable
from typing import Any

from cachedoctor.cache import decompress
from cachedoctor.cache.model import (
    EntryInfo,
    GpuSummary,
    MosaicKernel,
    Problem,
    Section,
    TpuSummary,
)
from cachedoctor.plaindata import slot_filler
from cachedoctor.xla.hlo import CustomCall, HloSummary, VolatileField


def checksum(
    name: str, compile_time: object, compression: object, parts_id: object, hlo_id: object
) -> str:
    """What catches a damaged row's values (the one fast digest, ``decompress.content_key``).
    Not its identity nor digest: damaged, those only fail to match the file, which is then
    decoded."""
    text = "\0".join((name, repr(compile_time), repr(compression), repr(parts_id), repr(hlo_id)))
    return decompress.content_key(os.fsencode(text))


def body_id(body: str) -> str:
    """The id of a shared body (an entry's parts, an HLO summary): the digest of its text, so
    that a body is stored once and a changed one is never served under its id."""
    return decompress.content_key(body.encode("utf-8", "surrogatepass"))


_FIELD_VALUES: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _field_values(value: Any) -> tuple[Any, ...]:
    """A dataclass as the tuple of its field values, in order (JSON writes a tuple as a list);
    each class is looked at once (``dataclasses.fields`` per value cost half a first scan's
    index write, measured on 5,000 distinct HLO summaries)."""
    kind = type(value)
    values = _FIELD_VALUES.get(kind)
    if values is None:
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            raise TypeError(f"{kind.__name__} is not a dataclass")
        names = [f.name for f in dataclasses.fields(kind)]
        if len(names) == 1:
            values = _FIELD_VALUES[kind] = lambda value: (getattr(value, names[0]),)
        else:
            values = _FIELD_VALUES[kind] = operator.attrgetter(*names)
    return values(value)


# Field values as JSON text: a dataclass is the list of its fields, in order. ASCII only: paths
# may hold lone surrogates (undecodable bytes), which JSON escapes. One encoder for every row
# (json.dumps with options builds one per call), tuples and scalars walked in C.
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, default=_field_values).encode


FIELDS = tuple(f.name for f in dataclasses.fields(EntryInfo))
_HLO_FIELDS = tuple(f.name for f in dataclasses.fields(HloSummary))


def _records(cls: Callable[..., Any], rows: list[list[Any]]) -> tuple[Any, ...]:
    return tuple(cls(*row) for row in rows)


def _tpu_summary(v: list[Any]) -> TpuSummary:
    """A ``TpuSummary`` from its JSON list: its tuples come back as lists."""
    if not isinstance(v, list) or len(v) != len(dataclasses.fields(TpuSummary)):
        raise ValueError("index row of another shape")
    chip, version, variant, messages, program, environment, env_size, kernels, masked = v
    return TpuSummary(
        chip,
        version,
        variant,
        tuple(messages),
        program,
        environment,
        env_size,
        tuple(_kernel(k) for k in kernels),
        masked,
    )


def _kernel(v: list[Any]) -> MosaicKernel:
    instruction, body, size, name, stripped, locations, unreadable = v
    return MosaicKernel(instruction, body, size, name, stripped, tuple(locations), unreadable)


def _strings(rows: list[str]) -> tuple[str, ...]:
    return tuple(rows)


# The fields that are dataclasses or tuples, and how each comes back from its JSON form; every
# other field of an entry is a scalar. Entries keep them apart: copies of a program share them.
_ENTRY_PARTS: dict[str, Callable[[Any], Any]] = {
    "gpu": lambda v: GpuSummary(*v),
    "tpu": _tpu_summary,
    "sections": lambda v: _records(Section, v),
    "volatile": lambda v: _records(VolatileField, v),
    "problems": lambda v: _records(Problem, v),
}
_SUMMARY_FIELDS: dict[str, Callable[[Any], Any]] = {
    "parameters": _strings,
    "custom_calls": lambda v: _records(CustomCall, v),
    "opcodes": lambda v: tuple((op, count) for op, count in v),
    "source_files": _strings,
}
_PARTS = tuple(_ENTRY_PARTS)
# Scalar fields that are each entry's own; every other scalar (module, digests, platform, the
# options read from the entry...) is the same for copies of one executable and is stored with
# the parts, so a row of a copy holds only these and its parts' id. Of these, a row stores the
# compile time and compression; the key, path, size and mtime are its file's, from the listing
# (a row is served only where its size does, and stored only when the decode saw the listed
# size and mtime).
OWN_SCALARS = ("key", "path", "size", "mtime_ns", "compile_time_s", "compression")
_SHARED_SCALARS = tuple(
    f for f in FIELDS if f not in _ENTRY_PARTS and f != "hlo" and f not in OWN_SCALARS
)
PART_VALUES = operator.attrgetter(*_PARTS)
SHARED_VALUES = operator.attrgetter(*_SHARED_SCALARS)
# frozen and slotted: fill the slots directly, several times faster than __init__
_FILLED_ENTRY = slot_filler(EntryInfo, (*OWN_SCALARS, *_PARTS, *_SHARED_SCALARS, "hlo"))
COLUMNS = "name, identity, digest, compile_time, compression, parts, hlo, checksum"
SLOTS = ", ".join("?" * len(COLUMNS.split(", ")))


def _thaw(names: tuple[str, ...], kinds: dict[str, Callable[[Any], Any]], values: Any) -> list[Any]:
    if not isinstance(values, list) or len(values) != len(names):
        raise ValueError("index row of another shape")
    pairs = zip(names, values, strict=True)
    return [kinds[n](v) if v is not None and n in kinds else v for n, v in pairs]


def thaw_hlo(values: Any) -> HloSummary:
    return HloSummary(*_thaw(_HLO_FIELDS, _SUMMARY_FIELDS, values))


def thaw_parts(values: Any, strings: dict[str, str]) -> list[Any]:
    """The parts and shared scalars of a row, their strings shared through ``strings``."""
    if not isinstance(values, list) or len(values) != len(_PARTS) + len(_SHARED_SCALARS):
        raise ValueError("index row of another shape")
    shared = [strings.setdefault(v, v) if isinstance(v, str) else v for v in values[len(_PARTS) :]]
    return [*_thaw(_PARTS, _ENTRY_PARTS, values[: len(_PARTS)]), *shared]


def entry(
    own: tuple[str | None, str, int, int, int | None, str | None],
    parts: list[Any],
    summary: HloSummary | None,
) -> EntryInfo:
    """The entry of a row: its own scalars (``OWN_SCALARS``, in order), its parts and summary."""
    return _FILLED_ENTRY(*own, *parts, summary)
