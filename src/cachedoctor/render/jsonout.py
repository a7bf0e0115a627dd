"""JSON rendering. Every document carries ``schema_version`` (see docs/json-schema.md)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from cachedoctor._version import __version__
from cachedoctor.cache.listdir import DirItem
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.core.findings import Finding
from cachedoctor.core.scan.report import SCHEMA_VERSION, JsonScan, PartWriters, ScanReport
from cachedoctor.plaindata import as_text

if TYPE_CHECKING:
    from cachedoctor.core.show import KernelView


def to_plain(value: Any) -> Any:
    """Dataclasses, enums and tuples -> JSON-ready dicts, strings and lists (a ``Location``:
    its spelling, ``plaindata.as_text``)."""
    if as_text(value):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name.lower() if isinstance(value, enum.IntEnum) else value.value
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, PurePath):
        return str(value)
    return value


# How a scan decoded an entry (cache/tiers.py), not what it holds: not in the JSON documents.
ENTRY_FIELDS_NOT_SHOWN = ("program_signature", "hlo_deferred", "debug_fields")


def entry_dict(entry: EntryInfo) -> dict[str, Any]:
    data: dict[str, Any] = to_plain(entry)
    for name in ENTRY_FIELDS_NOT_SHOWN:
        del data[name]
    data["ok"] = entry.ok
    data["format"] = entry.format_label
    return data


def finding_dict(finding: Finding) -> dict[str, Any]:
    data: dict[str, Any] = to_plain(finding)
    data["severity"] = finding.severity.label
    return data


def scan_document(report: ScanReport) -> dict[str, Any]:
    return {key: _whole(value) for key, value in _scan_fields(report)}


def iter_scan_json(scan: ScanReport | JsonScan) -> Iterator[str]:
    """``dumps(scan_document(report))`` in pieces, one top-level field, and one element of the
    long arrays (entries, findings, files), at a time: the same text, without holding the whole
    document or any of its long arrays in memory (50k entries hold 50k -atime files). The
    parts a ``JsonScan`` holds the text of (kept with the scan memo, made by ``SCAN_PARTS``)
    are that text."""
    for piece in iter_scan_pieces(scan):
        yield piece if isinstance(piece, str) else piece.decode("ascii")


def iter_scan_pieces(scan: ScanReport | JsonScan) -> Iterator[str | bytes]:
    """``iter_scan_json`` with the kept text as the ASCII bytes it is stored as."""
    report, kept = (scan.report, scan.kept) if isinstance(scan, JsonScan) else (scan, None)
    names = () if kept is None else kept.names
    yield "{"
    for n, (key, value) in enumerate(_scan_fields(report, kept is None)):
        yield ("," if n else "") + "\n  " + json.dumps(key) + ": "
        if kept is not None and key in names:
            yield from kept.ascii(key)
        elif isinstance(value, _Stream):
            yield from _iter_array(value)
        else:
            yield _indented(dumps(value), 1)
    yield "\n}"


@dataclass(frozen=True)
class _Stream:
    """A long array of the scan document: its elements, each made when it is written."""

    items: Sequence[Any]
    make: Callable[[Any], Any]


def _whole(value: Any) -> Any:
    return [value.make(v) for v in value.items] if isinstance(value, _Stream) else value


def _iter_array(array: _Stream) -> Iterator[str]:
    if not array.items:
        yield "[]"
        return
    yield "["
    for n, item in enumerate(array.items):
        yield ("," if n else "") + "\n    " + _indented(dumps(array.make(item)), 2)
    yield "\n  ]"


def _indented(text: str, depth: int) -> str:
    """A value dumped alone, indented as it is inside the document (JSON strings hold no raw
    newline, so every newline is a line break of the layout)."""
    return text.replace("\n", "\n" + "  " * depth)


def _scan_fields(report: ScanReport, loaded: bool = True) -> list[tuple[str, Any]]:
    """The scan document's fields in order, its long arrays as ``_Stream``s (of nothing, when
    not ``loaded``: their text comes from elsewhere)."""
    entries, other_files = report.loaded_entries() if loaded else ((), ())
    return [
        ("schema_version", SCHEMA_VERSION),
        ("tool", {"name": "cachedoctor", "version": __version__}),
        ("cache_dir", report.cache_dir),
        ("scanned_at", report.scanned_at),
        ("jax", to_plain(report.jax)),
        (
            "summary",
            {
                **to_plain(report.summary),
                "platforms": dict(report.summary.platforms),
                "formats": dict(report.summary.formats),
                "subcaches": dict(report.summary.subcaches),
            },
        ),
        ("modules", _Stream(report.modules, to_plain)),  # the same text as the whole list
        ("entries", _Stream(entries, entry_dict)),
        ("findings", _Stream(report.findings, finding_dict)),
        ("subcaches", to_plain(report.subcaches)),
        ("files", _Stream(other_files, _file_dict)),
    ]


def _part(name: str, report: ScanReport) -> Iterator[str]:
    """The text of the long array ``name`` of the report's document, as ``iter_scan_json``
    writes it."""
    stream = dict(_scan_fields(report))[name]
    assert isinstance(stream, _Stream)
    return _iter_array(stream)


# The long parts of the scan document whose text ``scan_json`` keeps beside the scan memo, and
# ``iter_scan_json`` then writes as it is. Each is one of the document's streamed arrays.
SCAN_PARTS: PartWriters = {
    name: functools.partial(_part, name) for name in ("modules", "entries", "findings", "files")
}


def _file_dict(item: DirItem) -> dict[str, Any]:
    return {
        "name": item.name,
        "kind": item.kind.value,
        "size": item.size,
        "is_symlink": item.is_symlink,
    }


def show_document(
    detail: EntryDetail,
    hlo_text: str | None = None,
    kernels: Sequence[KernelView] = (),
    original_hlo_text: str | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "entry": entry_dict(detail.info),
    }
    if kernels:
        doc["kernels"] = [to_plain(k) for k in kernels]
    if hlo_text is not None:
        doc["hlo_text"] = hlo_text
    if original_hlo_text is not None:
        doc["original_hlo_text"] = original_hlo_text
    return doc


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=False)
