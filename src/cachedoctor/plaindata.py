"""``to_dict()`` for the reports the Python API returns: plain JSON-ready data from dataclasses.

The reports are frozen dataclasses holding enums, paths, tuples and bytes; :func:`plain` turns
them into dicts, lists, strings and numbers (bytes as hex), so a notebook can ``json.dumps`` any
report. The CLI's ``--json`` documents stay the versioned schema (docs/json-schema.md).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import types
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def as_text(value: Any) -> bool:
    """Whether :func:`plain` writes ``value`` as its ``str()``: a class that says so with
    ``plain_as_text = True`` (a ``Location``: its spelling). Asked of the class, so that the
    hook's cheap ``storage/location.py`` need not import this module."""
    return getattr(type(value), "plain_as_text", False) is True


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data (dataclass fields in order, enums by value)."""
    if as_text(value):
        return str(value)
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


def slot_filler(cls: type[T], names: Sequence[str]) -> Callable[..., T]:
    """A function that makes a ``cls`` from the values of its fields ``names``, in that order,
    by setting its slots directly, for the frozen, slotted dataclasses a scan makes by the ten
    thousand (``DirItem``, ``EntryInfo``): ``__init__`` (``object.__setattr__`` per field) and
    a loop over the slots' setters each cost ~1.7 times as much (20,000 ``DirItem``: 28 against
    16.5 ms). Its code is generated once, as ``dataclasses`` generates ``__init__``; no
    default, no ``__post_init__``, and fields left out of ``names`` stay unset."""
    setters = {}
    for n, name in enumerate(names):
        slot = cls.__dict__.get(name)
        if not name.isidentifier() or not isinstance(slot, types.MemberDescriptorType):
            raise TypeError(f"{cls.__name__}.{name} is not a slot")
        setters[f"_set{n}"] = slot.__set__
    values = [f"v{n}" for n in range(len(names))]
    lines = [f"def fill({', '.join(values)}):", "    item = _new(_cls)"]
    lines += [f"    _set{n}(item, v{n})" for n in range(len(names))]
    lines.append("    return item")
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls, **setters}
    exec("\n".join(lines), scope)
    fill: Callable[..., T] = scope["fill"]
    return fill
