"""Field names for the XLA messages a cache entry stores (the differ is :mod:`.optiondiff`).

Entries hold ``CompileOptionsProto`` (with ``ExecutableBuildOptionsProto`` and ``DebugOptions``),
``HloModuleConfigProto`` and the ``pjrt_ifrt`` header as bare wire bytes. To say *which* option
differs we need names for field numbers. Two sources, in this order:

1. the installed jaxlib: its shared library embeds the serialized ``FileDescriptorProto`` of
   ``xla/xla.proto`` and friends (protobuf's generated C++ keeps them for reflection). We find
   them by name, parse them with :mod:`formats.wire`, and get every field the installed XLA
   knows, with types and enum value names. Done lazily, once per process, without importing jax.
   Where the package ships the table of that very library (``schemas/``, by its ``RECORD``
   digest) or one was kept from an earlier read (:mod:`.schema_memo`), the library is not read.
2. a static table (:data:`STATIC_FIELDS`), derived the same way from the descriptors of jaxlib
   0.4.38, 0.6.2, 0.8.3, 0.10.2 and 0.12.0.1: numbers are stable across these (docs/format.md),
   so an entry from any of them gets names even where no jaxlib is installed.

Field numbers never change meaning inside one message (XLA reserves removed numbers), which is
what makes naming an old entry's fields with a newer schema sound.
"""

from __future__ import annotations

import functools
import importlib.util
import mmap
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachedoctor.formats import wire
from cachedoctor.xla import schema_memo

# Message names used by callers.
EXECUTABLE_AND_OPTIONS = "xla.ExecutableAndOptionsProto"
COMPILE_OPTIONS = "xla.CompileOptionsProto"
BUILD_OPTIONS = "xla.ExecutableBuildOptionsProto"
DEBUG_OPTIONS = "xla.DebugOptions"
MODULE_CONFIG = "xla.HloModuleConfigProto"
IFRT_METADATA = "xla.ifrt.SerializedXlaExecutableMetadata"

# FieldDescriptorProto.Type values (google/protobuf/descriptor.proto).
T_DOUBLE, T_FLOAT, T_INT64, T_UINT64, T_INT32, T_FIXED64, T_FIXED32, T_BOOL = 1, 2, 3, 4, 5, 6, 7, 8
T_STRING, T_GROUP, T_MESSAGE, T_BYTES, T_UINT32, T_ENUM = 9, 10, 11, 12, 13, 14
T_SFIXED32, T_SFIXED64, T_SINT32, T_SINT64 = 15, 16, 17, 18

# Descriptor files whose messages we name; both spellings of the moved compile_options.proto.
DESCRIPTOR_FILES = (
    "xla/xla.proto",
    "xla/pjrt/proto/compile_options.proto",
    "xla/pjrt/compile_options.proto",
    "xla/python/pjrt_ifrt/executable_metadata.proto",
    "xla/python/ifrt/shape.proto",
    "xla/python/ifrt/dtype.proto",
    "xla/python/ifrt/layout.proto",
    "xla/xla_data.proto",
)
# Only these messages (and what they reach) are kept: the rest of xla.proto is not in entries.
ROOT_MESSAGES = (EXECUTABLE_AND_OPTIONS, COMPILE_OPTIONS, MODULE_CONFIG, IFRT_METADATA)


@dataclass(frozen=True)
class FieldInfo:
    """One field of a message: its name, wire meaning and, for messages and enums, type name."""

    number: int
    name: str
    type: int = 0  # a T_* value; 0 when unknown
    type_name: str | None = None  # e.g. "xla.DebugOptions" for T_MESSAGE / T_ENUM
    repeated: bool = False


@dataclass(frozen=True)
class MessageInfo:
    name: str
    fields: Mapping[int, FieldInfo]
    map_entry: bool = False


@dataclass(frozen=True)
class Schema:
    """Names for the messages we diff; ``source`` says where they came from."""

    messages: Mapping[str, MessageInfo]
    enums: Mapping[str, Mapping[int, str]]
    source: str

    def field(self, message: str | None, number: int) -> FieldInfo | None:
        if message is None:
            return None
        info = self.messages.get(message)
        return info.fields.get(number) if info else None

    def enum_name(self, enum: str | None, value: int) -> str | None:
        if enum is None:
            return None
        return self.enums.get(enum, {}).get(value)

    def field_number(self, message: str, name: str) -> int | None:
        info = self.messages.get(message)
        if info is None:
            return None
        for number, f in info.fields.items():
            if f.name == name:
                return number
        return None


# --- reading descriptors embedded in jaxlib --------------------------------------------------


def _str(value: wire.FieldValue | None) -> str:
    return wire.as_str(value) or ""


def _parse_field(buf: wire.Buffer, package: str) -> FieldInfo | None:
    f = wire.fields_by_number(buf)
    number = wire.as_int(wire.first(f, 3))
    name = _str(wire.first(f, 1))
    if not number or not name:
        return None
    ftype = wire.as_int(wire.first(f, 5)) or 0
    type_name = _str(wire.first(f, 6)).lstrip(".") or None
    return FieldInfo(
        number=number,
        name=name,
        type=ftype,
        type_name=type_name,
        repeated=wire.as_int(wire.first(f, 4)) == 3,
    )


def _parse_enum(buf: wire.Buffer, prefix: str, enums: dict[str, dict[int, str]]) -> None:
    f = wire.fields_by_number(buf)
    name = f"{prefix}.{_str(wire.first(f, 1))}"
    values: dict[int, str] = {}
    for v in f.get(2, []):
        if isinstance(v, int):
            continue
        vf = wire.fields_by_number(v)
        number = wire.as_int(wire.first(vf, 2))
        if number is not None:
            values.setdefault(wire.as_sint(number), _str(wire.first(vf, 1)))
    enums[name] = values


def _parse_message(
    buf: wire.Buffer,
    prefix: str,
    package: str,
    messages: dict[str, MessageInfo],
    enums: dict[str, dict[int, str]],
) -> None:
    f = wire.fields_by_number(buf)
    name = f"{prefix}.{_str(wire.first(f, 1))}"
    fields: dict[int, FieldInfo] = {}
    for v in f.get(2, []):
        if not isinstance(v, int):
            info = _parse_field(v, package)
            if info is not None:
                fields[info.number] = info
    options = wire.first(f, 7)
    map_entry = False
    if options is not None and not isinstance(options, int):
        map_entry = bool(wire.as_int(wire.first(wire.fields_by_number(options), 7)))
    messages[name] = MessageInfo(name, fields, map_entry)
    for v in f.get(3, []):
        if not isinstance(v, int):
            _parse_message(v, name, package, messages, enums)
    for v in f.get(4, []):
        if not isinstance(v, int):
            _parse_enum(v, name, enums)


# FileDescriptorProto field number -> wire type, to find where an embedded descriptor ends.
_FILE_FIELDS = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 9: 2, 10: 0, 11: 0, 12: 2, 14: 0}


def _descriptor_extent(data: wire.Buffer, start: int, limit: int) -> int:
    """End offset of the FileDescriptorProto starting at ``start`` (stops at the first byte that
    cannot continue it: padding, the next descriptor's name field, or foreign data)."""
    pos = start
    seen_name = False
    while pos < limit:
        try:
            tag, after = wire.read_varint(data, pos, limit)
            number, wt = tag >> 3, tag & 7
            if _FILE_FIELDS.get(number) != wt:
                break
            if number == 1:
                if seen_name:
                    break
                seen_name = True
            if wt == wire.VARINT:
                _, after = wire.read_varint(data, after, limit)
            else:
                length, after = wire.read_varint(data, after, limit)
                if after + length > limit:
                    break
                if number in (4, 5):  # a message/enum must itself parse
                    wire.validate(memoryview(data)[after : after + length])
                after += length
        except wire.WireError:
            break
        pos = after
    return pos


def parse_file_descriptor(
    data: wire.Buffer,
    messages: dict[str, MessageInfo],
    enums: dict[str, dict[int, str]],
) -> str:
    """Add the messages and enums of one serialized FileDescriptorProto; returns its file name."""
    f = wire.fields_by_number(data)
    package = _str(wire.first(f, 2))
    for v in f.get(4, []):
        if not isinstance(v, int):
            _parse_message(v, package, package, messages, enums)
    for v in f.get(5, []):
        if not isinstance(v, int):
            _parse_enum(v, package, enums)
    return _str(wire.first(f, 1))


def jaxlib_libraries() -> list[Path]:
    """jaxlib's shared libraries, largest first (the descriptors live in the big one)."""
    try:
        spec = importlib.util.find_spec("jaxlib")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    found: list[Path] = []
    for location in spec.submodule_search_locations:
        try:
            found += [p for p in Path(location).glob("*.so") if p.is_file()]
        except OSError:
            continue
    return sorted(found, key=lambda p: p.stat().st_size, reverse=True)


_MAX_DESCRIPTOR = 4 << 20


def read_descriptors(
    library: str | os.PathLike[str], files: tuple[str, ...] = DESCRIPTOR_FILES
) -> tuple[dict[str, MessageInfo], dict[str, dict[int, str]], list[str]]:
    """Messages and enums of the named descriptor files embedded in one shared library."""
    messages: dict[str, MessageInfo] = {}
    enums: dict[str, dict[int, str]] = {}
    found: list[str] = []
    with open(library, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for name in files:
            for candidate in descriptor_candidates(mm, name):
                try:
                    parse_file_descriptor(candidate, messages, enums)
                    found.append(name)
                    break
                except wire.WireError:
                    continue
    return messages, enums, found


def descriptor_candidates(library: mmap.mmap | bytes, name: str) -> Iterator[bytes]:
    """Each stretch of a shared library's bytes that may be the serialized FileDescriptorProto
    of ``name``, cut where it stops parsing; the caller takes the first that parses fully."""
    encoded = name.encode()
    # A FileDescriptorProto starts with field 1 (name), then field 2 (package).
    needle = b"\n" + bytes([len(encoded)]) + encoded + b"\x12"
    at = library.find(needle)
    while at != -1:
        window = library[at : min(len(library), at + _MAX_DESCRIPTOR)]
        yield window[: _descriptor_extent(window, 0, len(window))]
        at = library.find(needle, at + 1)


def _reachable(
    messages: Mapping[str, MessageInfo], roots: tuple[str, ...]
) -> tuple[set[str], set[str]]:
    seen: set[str] = set()
    seen_enums: set[str] = set()
    todo = [r for r in roots if r in messages]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for f in messages[name].fields.values():
            if f.type == T_MESSAGE and f.type_name is not None and f.type_name in messages:
                todo.append(f.type_name)
            elif f.type == T_ENUM and f.type_name:
                seen_enums.add(f.type_name)
    return seen, seen_enums


def _version_of(library: Path) -> str:
    for parent in library.parents:
        dist = next(iter(parent.glob("jaxlib-*.dist-info")), None)
        if dist is not None:
            return dist.name.removeprefix("jaxlib-").removesuffix(".dist-info")
    return "?"


def installed_schema() -> Schema | None:
    """The schema of the installed jaxlib, or None when its descriptors cannot be found."""
    return _installed_schema_cached()


@functools.cache
def _installed_schema_cached() -> Schema | None:
    if os.environ.get("CACHEDOCTOR_NO_JAXLIB_SCHEMA"):
        return None
    for library in jaxlib_libraries()[:3]:
        kept = _schema_of(schema_memo.shipped(library)) or _schema_of(schema_memo.load(library))
        if kept is not None:
            return kept
        try:
            messages, enums, found = read_descriptors(library)
        except (OSError, ValueError):
            continue
        if "xla/xla.proto" in found and any("compile_options" in f for f in found):
            keep, keep_enums = _reachable(messages, ROOT_MESSAGES)
            read = Schema(
                messages={k: v for k, v in messages.items() if k in keep},
                enums={k: v for k, v in enums.items() if k in keep_enums},
                source=f"jaxlib {_version_of(library)} ({library.name})",
            )
            schema_memo.save(library, _doc_of(read))
            return read
    return None


def _doc_of(schema: Schema) -> dict[str, Any]:
    """``schema`` as JSON's types, for :mod:`.schema_memo` to keep."""
    return {
        "source": schema.source,
        "messages": {
            m.name: [
                m.map_entry,
                [[f.number, f.name, f.type, f.type_name, f.repeated] for f in m.fields.values()],
            ]
            for m in schema.messages.values()
        },
        "enums": {e: sorted(values.items()) for e, values in schema.enums.items()},
    }


def _schema_of(doc: dict[str, Any] | None) -> Schema | None:
    """The schema a kept document holds; None when there is none or it does not read whole."""
    if doc is None:
        return None
    try:
        return _read_doc(doc)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _read_doc(doc: dict[str, Any]) -> Schema:
    messages = {}
    for message, (map_entry, fields) in doc["messages"].items():
        infos = {
            int(n): FieldInfo(int(n), str(fname), int(ftype), tname, bool(rep))
            for n, fname, ftype, tname, rep in fields
        }
        messages[str(message)] = MessageInfo(str(message), infos, bool(map_entry))
    enums = {str(e): {int(v): str(n) for v, n in values} for e, values in doc["enums"].items()}
    return Schema(messages, enums, str(doc["source"]))


def undefined_debug_fields(debug_fields: str | None) -> tuple[frozenset[int], str] | None:
    """The DebugOptions field numbers an entry's compile options set (``debug_fields``, as
    ``compile_options.number_ranges`` wrote them) that the installed jaxlib does not define, and
    that jaxlib's name; None when either is unknown. Not empty: another jaxlib wrote the entry
    (JAX stores every default of its own jaxlib; XLA never reuses a removed number)."""
    from cachedoctor.xla.compile_options import parse_ranges

    schema = installed_schema()
    if debug_fields is None or schema is None:
        return None
    info = schema.messages.get(DEBUG_OPTIONS)
    if info is None or not info.fields:
        return None
    return parse_ranges(debug_fields) - frozenset(info.fields), schema.source


# --- the static table --------------------------------------------------------------------------


def _static_schema() -> Schema:
    from cachedoctor.xla._optionnames import ENUMS, MESSAGES

    messages = {
        name: MessageInfo(
            name,
            {
                number: FieldInfo(number, fname, ftype, tname, bool(rep))
                for number, (fname, ftype, tname, rep) in fields.items()
            },
            map_entry=name.endswith("Entry"),
        )
        for name, fields in MESSAGES.items()
    }
    return Schema(messages, {k: dict(v) for k, v in ENUMS.items()}, "static table")


def merge(primary: Schema, fallback: Schema) -> Schema:
    """``primary``'s names, plus fallback fields it lacks (e.g. fields removed since)."""
    messages: dict[str, MessageInfo] = {}
    for name in set(primary.messages) | set(fallback.messages):
        p, f = primary.messages.get(name), fallback.messages.get(name)
        if p is None or f is None:
            chosen = p or f
            assert chosen is not None
            messages[name] = chosen
            continue
        fields = dict(f.fields)
        fields.update(p.fields)
        messages[name] = MessageInfo(name, fields, p.map_entry)
    enums: dict[str, Mapping[int, str]] = {}
    for name in set(primary.enums) | set(fallback.enums):
        merged = dict(fallback.enums.get(name, {}))
        merged.update(primary.enums.get(name, {}))
        enums[name] = merged
    return Schema(messages, enums, f"{primary.source} + {fallback.source}")


@functools.cache
def schema() -> Schema:
    """Names from the installed jaxlib when it has them, completed by the static table."""
    static = _static_schema()
    installed = installed_schema()
    return merge(installed, static) if installed is not None else static


def field_names(message: str) -> Iterator[tuple[int, str]]:
    """(number, name) pairs of a message, sorted by number (for docs and tests)."""
    info = schema().messages.get(message)
    if info is None:
        return iter(())
    return iter(sorted((n, f.name) for n, f in info.fields.items()))


# --- regenerating the static table ------------------------------------------------------------


def generate_static_table(libraries: list[str]) -> str:
    """Source of ``_optionnames.py`` from several jaxlib libraries (oldest first; newer names win).

    Run as ``python -m cachedoctor.xla.optionschema LIB.so... > _optionnames.py`` with each jaxlib's
    largest library, then ``ruff format`` the result.
    """
    messages: dict[str, dict[int, tuple[str, int, str | None, int]]] = {}
    enums: dict[str, dict[int, str]] = {}
    sources = []
    for library in libraries:
        found_messages, found_enums, _files = read_descriptors(library)
        keep, keep_enums = _reachable(found_messages, ROOT_MESSAGES)
        sources.append(f"jaxlib {_version_of(Path(library))}")
        for name in keep:
            table = messages.setdefault(name, {})
            for number, f in found_messages[name].fields.items():
                table[number] = (f.name, f.type, f.type_name, int(f.repeated))
        for name in keep_enums:
            enums.setdefault(name, {}).update(found_enums.get(name, {}))
    lines = [
        '"""Generated by ``python -m cachedoctor.xla.optionschema`` from the descriptors'
        " embedded in",
        "jaxlib (see optionschema.py); do not edit by hand. Sources (newer names win):",
        "  " + ", ".join(sources) + ".",
        '"""',
        "",
        "# message -> {number: (name, descriptor type, type name, repeated)}",
        "MESSAGES: dict[str, dict[int, tuple[str, int, str | None, int]]] = {",
    ]
    for name in sorted(messages):
        lines.append(f"    {name!r}: {{")
        for number, value in sorted(messages[name].items()):
            lines.append(f"        {number}: {value!r},")
        lines.append("    },")
    lines += ["}", "", "ENUMS: dict[str, dict[int, str]] = {"]
    for name in sorted(enums):
        lines.append(f"    {name!r}: {{")
        for number, label in sorted(enums[name].items()):
            lines.append(f"        {number}: {label!r},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - a maintenance tool
    import sys

    sys.stdout.write(generate_static_table(sys.argv[1:]))
