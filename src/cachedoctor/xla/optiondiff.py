"""A field-by-field differ for two encodings of one XLA option message, with values rendered.

Given two wire encodings of ``CompileOptionsProto``, ``HloModuleConfigProto`` or the
``pjrt_ifrt`` header, :func:`diff_messages` walks both at once and yields a :class:`FieldDiff`
per differing field path (sub-messages recursively, map fields key by key), naming each step
with a :class:`~cachedoctor.xla.optionschema.Schema` and rendering values as a user reads them
(enum names, bools, strings; bytes as a size and digest). It is separate from
:mod:`cachedoctor.xla.optionschema` because that module is about *where names come from*
(jaxlib's embedded descriptors and the static table) while this one only *uses* a schema: the
differ reads no shared library and the schema knows nothing of diffs.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from cachedoctor.formats import wire
from cachedoctor.xla.optionschema import (
    T_BOOL,
    T_DOUBLE,
    T_ENUM,
    T_FLOAT,
    T_INT32,
    T_INT64,
    T_MESSAGE,
    T_SINT32,
    T_SINT64,
    T_STRING,
    T_UINT32,
    T_UINT64,
    FieldInfo,
    MessageInfo,
    Schema,
    schema,
)


@dataclass(frozen=True)
class FieldDiff:
    """One difference between two messages: a dotted path and both values, rendered."""

    path: str  # e.g. "executable_build_options.debug_options.xla_dump_to"
    numbers: tuple[int, ...]  # the same path in field numbers, e.g. (3, 3, 109)
    a: str | None  # None: not set in A
    b: str | None
    named: bool = True  # every step of the path has a known name


@dataclass
class _Occurrence:
    wire_type: int
    value: wire.FieldValue


_PRINTABLE = re.compile(rb"^[\x20-\x7e\t\n\r]*$")
_MAX_RENDER = 240


def render_value(value: wire.FieldValue, wt: int, info: FieldInfo | None, sch: Schema) -> str:
    """A field value as a user reads it: enum names, bools, strings, numbers; bytes as a size."""
    ftype = info.type if info else 0
    if isinstance(value, int):
        if ftype == T_BOOL:
            return "true" if value else "false"
        if ftype == T_ENUM:
            label = sch.enum_name(info.type_name if info else None, wire.as_sint(value))
            return label if label is not None else str(wire.as_sint(value))
        if ftype in (T_SINT32, T_SINT64):
            return str((value >> 1) ^ -(value & 1))
        if ftype == T_DOUBLE and wt == wire.I64:
            return repr(struct.unpack("<d", value.to_bytes(8, "little"))[0])
        if ftype == T_FLOAT and wt == wire.I32:
            return repr(struct.unpack("<f", value.to_bytes(4, "little"))[0])
        if ftype in (T_INT32, T_INT64, 0):
            return str(wire.as_sint(value))
        return str(value)
    raw = bytes(value)
    if ftype == 0 and len(raw) <= 16 and not (len(raw) >= 4 and _PRINTABLE.match(raw)):
        return "0x" + raw.hex()  # an unknown short field: bytes as they are
    if ftype == T_STRING or (ftype == 0 and raw and _PRINTABLE.match(raw)):
        text = raw.decode("utf-8", "replace")
        shown = text if len(text) <= _MAX_RENDER else text[:_MAX_RENDER] + "…"
        return repr(shown) if ftype == 0 else shown
    if ftype in (T_INT32, T_INT64, T_UINT32, T_UINT64, T_BOOL, T_ENUM, T_SINT32, T_SINT64):
        try:  # a packed repeated scalar
            items = [render_value(v, wire.VARINT, info, sch) for v in wire.packed_varints(value)]
            return "[" + ", ".join(items) + "]"
        except wire.WireError:
            pass
    import hashlib

    return f"<{len(raw)} bytes sha256:{hashlib.sha256(raw).hexdigest()[:12]}>"


def _group(buf: wire.Buffer) -> dict[int, list[_Occurrence]]:
    out: dict[int, list[_Occurrence]] = {}
    for number, wt, value in wire.iter_fields(buf):
        out.setdefault(number, []).append(_Occurrence(wt, value))
    return out


def _map_key(entry: wire.FieldValue, key_info: FieldInfo | None, sch: Schema) -> str | None:
    if isinstance(entry, int):
        return None
    try:
        f = wire.fields_by_number(entry)
    except wire.WireError:
        return None
    key = wire.first(f, 1)
    if key is None:
        return ""
    return render_value(key, wire.LEN if not isinstance(key, int) else wire.VARINT, key_info, sch)


def diff_messages(
    a: wire.Buffer | None,
    b: wire.Buffer | None,
    message: str | None,
    sch: Schema | None = None,
    *,
    prefix: str = "",
    numbers: tuple[int, ...] = (),
    named: bool = True,
    max_depth: int = 12,
) -> list[FieldDiff]:
    """Field-by-field differences between two encodings of ``message``, by path.

    Known sub-messages are compared recursively, map fields key by key, repeated fields as a
    whole; unknown fields are compared as raw values. Raises WireError on malformed input.
    """
    sch = sch or schema()
    ga = _group(a) if a is not None else {}
    gb = _group(b) if b is not None else {}
    out: list[FieldDiff] = []
    for number in sorted(set(ga) | set(gb)):
        va, vb = ga.get(number, []), gb.get(number, [])
        if _raw(va) == _raw(vb):
            continue
        info = sch.field(message, number)
        name = info.name if info else f"field {number}"
        path = f"{prefix}{name}"
        here = (*numbers, number)
        here_named = named and info is not None
        sub = info.type_name if info and info.type == T_MESSAGE else None
        sub_info = sch.messages.get(sub) if sub else None
        if sub_info is not None and sub_info.map_entry and max_depth > 0:
            out += _diff_map(va, vb, sub_info, sch, path, here, here_named, max_depth)
        elif (
            sub is not None
            and max_depth > 0
            and len(va) <= 1
            and len(vb) <= 1
            and not (info and info.repeated)
            and not any(isinstance(o.value, int) for o in va + vb)
        ):
            out += diff_messages(
                _bytes_of(va),
                _bytes_of(vb),
                sub,
                sch,
                prefix=path + ".",
                numbers=here,
                named=here_named,
                max_depth=max_depth - 1,
            )
        elif (
            sub is not None
            and max_depth > 0
            and len(va) == len(vb)
            and not any(isinstance(o.value, int) for o in va + vb)
        ):  # repeated messages of the same count: element by element
            for i, (xa, xb) in enumerate(zip(va, vb, strict=True)):
                out += diff_messages(
                    _bytes_of([xa]),
                    _bytes_of([xb]),
                    sub,
                    sch,
                    prefix=f"{path}[{i}].",
                    numbers=here,
                    named=here_named,
                    max_depth=max_depth - 1,
                )
        else:
            out.append(
                FieldDiff(
                    path, here, _render_all(va, info, sch), _render_all(vb, info, sch), here_named
                )
            )
    return out


def _bytes_of(occ: list[_Occurrence]) -> memoryview | None:
    value = occ[0].value if occ else None
    return value if isinstance(value, memoryview) else None


def _raw(occ: list[_Occurrence]) -> list[tuple[int, int | bytes]]:
    return [(o.wire_type, o.value if isinstance(o.value, int) else bytes(o.value)) for o in occ]


def _render_all(occ: list[_Occurrence], info: FieldInfo | None, sch: Schema) -> str | None:
    if not occ:
        return None
    values = [render_value(o.value, o.wire_type, info, sch) for o in occ]
    if len(values) == 1 and not (info and info.repeated):
        return values[0]
    if (
        info
        and info.repeated
        and all(
            not isinstance(o.value, int) and v.startswith("[")
            for o, v in zip(occ, values, strict=True)
        )
    ):  # packed repeated scalars: one flat list
        values = [v[1:-1] for v in values]
    return "[" + ", ".join(values) + "]"


def _diff_map(
    va: list[_Occurrence],
    vb: list[_Occurrence],
    entry: MessageInfo,
    sch: Schema,
    path: str,
    numbers: tuple[int, ...],
    named: bool,
    max_depth: int,
) -> list[FieldDiff]:
    key_info = entry.fields.get(1)
    value_info = entry.fields.get(2)

    def by_key(occ: list[_Occurrence]) -> dict[str, wire.FieldValue | None]:
        out: dict[str, wire.FieldValue | None] = {}
        for o in occ:
            k = _map_key(o.value, key_info, sch)
            if k is None:
                continue
            f = wire.fields_by_number(o.value) if not isinstance(o.value, int) else {}
            out[k] = wire.first(f, 2)
        return out

    ma, mb = by_key(va), by_key(vb)
    out: list[FieldDiff] = []
    for k in sorted(set(ma) | set(mb)):
        xa, xb = ma.get(k), mb.get(k)
        ra = bytes(xa) if xa is not None and not isinstance(xa, int) else xa
        rb = bytes(xb) if xb is not None and not isinstance(xb, int) else xb
        if ra == rb and (k in ma) == (k in mb):
            continue
        kpath = f"{path}[{k}]"
        if value_info is not None and value_info.type == T_MESSAGE and k in ma and k in mb:
            out += diff_messages(
                xa if not isinstance(xa, int) else None,
                xb if not isinstance(xb, int) else None,
                value_info.type_name,
                sch,
                prefix=kpath + ".",
                numbers=numbers,
                named=named,
                max_depth=max_depth - 1,
            )
            continue
        wt = wire.VARINT
        render_a = (
            None
            if k not in ma
            else render_value(xa, wt if isinstance(xa, int) else wire.LEN, value_info, sch)
            if xa is not None
            else "(default)"
        )
        render_b = (
            None
            if k not in mb
            else render_value(xb, wt if isinstance(xb, int) else wire.LEN, value_info, sch)
            if xb is not None
            else "(default)"
        )
        out.append(FieldDiff(kpath, numbers, render_a, render_b, named))
    return out
