"""``to_dict()`` for the reports the Python API returns: plain JSON-ready data from dataclasses.

The reports are frozen dataclasses holding enums, paths, tuples and bytes; :func:`plain` turns
them into dicts, lists, strings and numbers (bytes as hex), so a notebook can ``json.dumps`` any
report. The CLI's ``--json`` documents stay the versioned schema (docs/json-schema.md).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Sequence
from typing import Any


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data (dataclass fields in order, enums by value)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, Sequence) and not isinstance(value, str):  # any other sequence
        return [plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class ToDict:
    """Mixin: ``report.to_dict()`` is :func:`plain` of the report."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = plain(self)
        return data
