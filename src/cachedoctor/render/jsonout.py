"""JSON rendering. Every document carries ``schema_version`` (see docs/json-schema.md)."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator
from pathlib import PurePath
from typing import Any

from cachedoctor import __version__
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.commands.scan import SCHEMA_VERSION, Finding, ScanReport


def to_plain(value: Any) -> Any:
    """Dataclasses, enums and tuples -> JSON-ready dicts, strings and lists."""
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


def entry_dict(entry: EntryInfo) -> dict[str, Any]:
    data: dict[str, Any] = to_plain(entry)
    data["ok"] = entry.ok
    data["format"] = entry.format_label
    return data


def finding_dict(finding: Finding) -> dict[str, Any]:
    data: dict[str, Any] = to_plain(finding)
    data["severity"] = finding.severity.label
    return data


def scan_document(report: ScanReport) -> dict[str, Any]:
    return {**_scan_skeleton(report), "entries": [entry_dict(e) for e in report.entries]}


def iter_scan_json(report: ScanReport) -> Iterator[str]:
    """``dumps(scan_document(report))`` in pieces, one entry at a time: the same text, without
    holding the whole document (its entries array is most of it) in memory."""
    if not report.entries:
        yield dumps(scan_document(report))
        return
    head, tail = dumps(_scan_skeleton(report)).split(f'"entries": "{_ENTRIES_SLOT}"', 1)
    yield head + '"entries": ['
    separator = "\n    "
    for n, entry in enumerate(report.entries):
        text = dumps(entry_dict(entry)).replace("\n", "\n    ")
        yield ("," if n else "") + separator + text
    yield "\n  ]" + tail


_ENTRIES_SLOT = "cachedoctor:entries"  # where the streamed entries array goes


def _scan_skeleton(report: ScanReport) -> dict[str, Any]:
    """The scan document with its entries array left as a placeholder string."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "cachedoctor", "version": __version__},
        "cache_dir": report.cache_dir,
        "scanned_at": report.scanned_at,
        "jax": to_plain(report.jax),
        "summary": {
            **to_plain(report.summary),
            "platforms": dict(report.summary.platforms),
            "formats": dict(report.summary.formats),
            "subcaches": dict(report.summary.subcaches),
        },
        "modules": to_plain(report.modules),
        "entries": _ENTRIES_SLOT,
        "findings": [finding_dict(f) for f in report.findings],
        "subcaches": to_plain(report.subcaches),
        "files": [
            {"name": i.name, "kind": i.kind.value, "size": i.size, "is_symlink": i.is_symlink}
            for i in report.other_files
        ],
    }


def show_document(detail: EntryDetail, hlo_text: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "entry": entry_dict(detail.info),
    }
    if hlo_text is not None:
        doc["hlo_text"] = hlo_text
    return doc


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=False)
