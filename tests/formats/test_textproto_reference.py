"""The schema-less text-format parser and the autotune interpretation, checked against protobuf's
own ``text_format`` printer with XLA's real ``AutotuneResults`` schema.

The schema is the one the installed jaxlib was built with (``tests/support/jaxlib_schema.py``).
Hypothesis fills messages of that schema at random; protobuf prints them in each of its text
styles, and what we parse must be what was printed.
"""

from __future__ import annotations

import functools
import math
import struct
from typing import Any

import pytest
from google.protobuf import message_factory, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachedoctor.formats import textproto
from cachedoctor.xla import subcaches
from tests.support.jaxlib_schema import message_class

ROOT_FILE = "xla/autotune_results.proto"
MAX_DEPTH = 5

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


@functools.cache
def message_classes() -> tuple[type[Message], type[Message]]:
    """``xla.AutotuneResults`` and ``xla.AutotuneResult`` from jaxlib's embedded schema."""
    return (
        message_class(ROOT_FILE, "xla.AutotuneResults"),
        message_class(ROOT_FILE, "xla.AutotuneResult"),
    )


# --- random messages of the schema -----------------------------------------------------------


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in _INT_RANGES:
        low, high = _INT_RANGES[t]
        return st.integers(low, high)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if t == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if t == FieldDescriptor.TYPE_STRING:
        return st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=30)
    if t == FieldDescriptor.TYPE_ENUM:
        known = st.sampled_from([v.number for v in field.enum_type.values])
        if field.enum_type.is_closed:
            return known
        return st.one_of(known, st.integers(-(2**31), 2**31 - 1))  # open enum: any number
    raise AssertionError(f"no strategy for {field.full_name} (type {t})")


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def fill(data: st.DataObject, msg: Message, depth: int) -> None:
    for field in msg.DESCRIPTOR.fields:
        if field.message_type is not None and depth >= MAX_DEPTH:
            continue
        if not data.draw(st.booleans()):
            continue
        container = getattr(msg, field.name)
        if _is_map(field):
            key_field, value_field = field.message_type.fields
            for key in data.draw(st.lists(_scalar(key_field), max_size=3)):
                if value_field.message_type is not None:
                    fill(data, container[key], depth + 1)
                else:
                    container[key] = data.draw(_scalar(value_field))
        elif field.is_repeated:
            for _ in range(data.draw(st.integers(1, 2))):
                if field.message_type is not None:
                    fill(data, container.add(), depth + 1)
                else:
                    container.append(data.draw(_scalar(field)))
        elif field.message_type is not None:
            container.SetInParent()
            fill(data, container, depth + 1)
        else:
            setattr(msg, field.name, data.draw(_scalar(field)))


# --- what the parser must return for a message -----------------------------------------------


def _expected_scalar(field: FieldDescriptor, value: Any) -> textproto.TextValue:
    t = field.type
    if t == FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(value)
    if t == FieldDescriptor.TYPE_STRING:
        return str(value).encode("utf-8")
    if t == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else int(value)
    assert isinstance(value, int | bytes)
    return value


def expected_text_message(msg: Message) -> textproto.TextMessage:
    """The untyped form ``textproto.parse`` gives for the text of ``msg`` (map entries sorted
    by key, as protobuf prints them)."""
    out: textproto.TextMessage = {}
    for field, value in msg.ListFields():
        if _is_map(field):
            entry_class = message_factory.GetMessageClass(field.message_type)
            values: list[Any] = []
            for key in sorted(value):
                entry = entry_class(key=key)
                if field.message_type.fields_by_name["value"].message_type is not None:
                    entry.value.CopyFrom(value[key])
                else:
                    entry.value = value[key]
                values.append(entry)
        else:
            values = list(value) if field.is_repeated else [value]
        out[field.name] = [
            expected_text_message(v)
            if field.message_type is not None
            else (_expected_scalar(field, v))
            for v in values
        ]
    return out


def as_float32(parsed: textproto.TextMessage, descriptor: Descriptor) -> textproto.TextMessage:
    """``parsed`` with float fields rounded to float32, as the printed message held them."""
    out: textproto.TextMessage = {}
    for name, values in parsed.items():
        field = descriptor.fields_by_name.get(name)
        fixed: list[textproto.TextValue] = []
        for v in values:
            if isinstance(v, dict) and field is not None and field.message_type is not None:
                fixed.append(as_float32(v, field.message_type))
            elif isinstance(v, float) and field is not None and field.type == field.TYPE_FLOAT:
                fixed.append(struct.unpack("<f", struct.pack("<f", v))[0])
            else:
                fixed.append(v)
        out[name] = fixed
    return out


PRINT_STYLES = st.fixed_dictionaries(
    {
        "as_utf8": st.booleans(),
        "as_one_line": st.booleans(),
        "use_short_repeated_primitives": st.booleans(),
        "pointy_brackets": st.booleans(),
        "force_colon": st.booleans(),
        "indent": st.integers(0, 4),
    }
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("root", ["AutotuneResults", "AutotuneResult"])
@SETTINGS
@given(data=st.data(), style=PRINT_STYLES)
def test_parser_reads_what_protobuf_prints(root: str, data: st.DataObject, style: Any) -> None:
    results_class, result_class = message_classes()
    msg = (results_class if root == "AutotuneResults" else result_class)()
    fill(data, msg, 0)
    text = text_format.MessageToString(msg, **style)
    parsed = textproto.parse(text)
    assert as_float32(parsed, msg.DESCRIPTOR) == expected_text_message(msg), text


def _expected_kind(result: Message) -> str:
    if result.HasField("failure"):
        return "failure"
    key = result.WhichOneof("key")
    return subcaches._KIND_OF_KEY[key] if key else "none"


@SETTINGS
@given(data=st.data(), style=PRINT_STYLES)
def test_autotune_interpretation_matches_the_message(data: st.DataObject, style: Any) -> None:
    results_class, result_class = message_classes()
    msg = results_class() if data.draw(st.booleans()) else result_class()
    fill(data, msg, 0)
    info = subcaches.parse_autotune_text(text_format.MessageToString(msg, **style))
    if isinstance(msg, results_class):
        entry = msg.results[0] if msg.results else results_class.Entry()
        assert info.result_count == max(1, len(msg.results))
        assert (info.model or "", info.hlo or "", info.version or 0) == (
            entry.device,
            entry.hlo,
            entry.version,
        )
        result = entry.result
    else:
        assert (info.model, info.hlo, info.version, info.result_count) == (None, None, None, 1)
        result = msg
    assert info.kind == _expected_kind(result)
    run_time = result.run_time
    expected_ns = run_time.seconds * 10**9 + run_time.nanos if result.HasField("run_time") else None
    assert info.run_time_ns == expected_ns
    assert (info.scratch_bytes or 0) == result.scratch_bytes
    if result.HasField("failure"):
        failure = result.failure
        kind = result.DESCRIPTOR.fields_by_name["failure"].message_type.fields_by_name["kind"]
        known = kind.enum_type.values_by_number.get(failure.kind)
        reason = known.name if known is not None else str(failure.kind)
        assert info.failure == (f"{reason}: {failure.msg}" if failure.msg else reason)
    else:
        assert info.failure is None
