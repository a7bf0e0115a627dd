"""The wire-format walker against protobuf's own encoder and parser (an independent oracle).

A message type with every wire type is built at run time from a descriptor; protobuf serializes
random values of it, ``formats.wire`` must read back exactly those values (whole-buffer and
streaming, across read-ahead boundaries), and what ``wire.encode_field`` writes protobuf must
parse back. Truncated bytes are an error for both.
"""

from __future__ import annotations

import io
import random
import struct
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from cachedoctor.formats import wire

F = descriptor_pb2.FieldDescriptorProto
# (name, number, type, repeated); the numbers span one- to five-byte tags
FIELDS = [
    ("u64", 1, F.TYPE_UINT64, False),
    ("i64", 2, F.TYPE_INT64, False),
    ("fx64", 3, F.TYPE_FIXED64, False),
    ("fx32", 4, F.TYPE_FIXED32, False),
    ("text", 5, F.TYPE_STRING, False),
    ("blob", 16, F.TYPE_BYTES, False),
    ("packed", 17, F.TYPE_UINT32, True),
    ("v128", 128, F.TYPE_UINT64, False),  # tag bytes 0x80 0x08: a first byte of exactly 0x80
    ("dbl", 2047, F.TYPE_DOUBLE, False),
    ("child", 2048, F.TYPE_MESSAGE, False),
    ("far", 536870911, F.TYPE_UINT32, False),  # the largest field number
]


def _message_class() -> Any:
    proto = descriptor_pb2.FileDescriptorProto(name="wire_oracle.proto", package="oracle")
    proto.syntax = "proto3"
    msg = proto.message_type.add(name="AllTypes")
    for name, number, ftype, repeated in FIELDS:
        field = msg.field.add(name=name, number=number, type=ftype)
        field.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
        if ftype == F.TYPE_MESSAGE:
            field.type_name = ".oracle.AllTypes"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("oracle.AllTypes"))


AllTypes = _message_class()


def _random_message(rng: random.Random, depth: int = 0) -> Any:
    m = AllTypes()
    m.u64 = rng.choice([1, 127, 128, 300, 2**32, 2**64 - 1, rng.getrandbits(rng.randint(1, 64))])
    m.i64 = rng.choice([-1, -(2**63), 2**63 - 1, rng.randint(-(2**40), 2**40)])
    m.fx64 = rng.getrandbits(64)
    m.fx32 = rng.getrandbits(32)
    m.text = "".join(rng.choice("aé中\n") for _ in range(rng.randint(1, 200)))
    m.blob = rng.randbytes(rng.choice([1, 127, 128, 20000]))
    m.packed.extend(rng.getrandbits(32) for _ in range(rng.randint(1, 50)))
    m.v128 = rng.choice([1, 300, rng.getrandbits(40)])
    m.dbl = rng.uniform(-1e300, 1e300)
    m.far = rng.getrandbits(32) or 1
    if depth < 2:
        m.child.CopyFrom(_random_message(rng, depth + 1))
    return m


def _check(m: Any, fields: dict[int, list[wire.FieldValue]]) -> None:
    """The walker's fields are the message's values, by field number."""
    assert wire.as_int(wire.first(fields, 1)) == m.u64
    i64 = wire.as_int(wire.first(fields, 2))
    assert i64 is not None and wire.as_sint(i64) == m.i64
    assert wire.first(fields, 3) == m.fx64 and wire.first(fields, 4) == m.fx32
    assert wire.as_str(wire.first(fields, 5)) == m.text
    assert bytes(fields[16][0]) == m.blob
    assert wire.packed_varints(fields[17][0]) == list(m.packed)
    assert wire.first(fields, 128) == m.v128
    dbl = wire.as_int(wire.first(fields, 2047))
    assert dbl is not None and struct.unpack("<d", dbl.to_bytes(8, "little"))[0] == m.dbl
    assert wire.first(fields, 536870911) == m.far
    if m.HasField("child"):
        child = wire.first(fields, 2048)
        assert isinstance(child, memoryview)
        _check(m.child, wire.fields_by_number(child))
    else:
        assert 2048 not in fields


# The two whole-buffer walkers: the generator and the list builder with its own fast paths.
WALKERS = {"iter_fields": lambda *a: list(wire.iter_fields(*a)), "field_list": wire.field_list}


def _by_number(fields: list[tuple[int, int, wire.FieldValue]]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for number, wire_type, value in fields:
        # LEN values are views into the buffer, never copies
        assert isinstance(value, memoryview) == (wire_type == wire.LEN)
        out.setdefault(number, []).append(value)
    return out


@pytest.mark.parametrize("walker", WALKERS)
@pytest.mark.parametrize("seed", range(20))
def test_walker_reads_what_protobuf_wrote(seed: int, walker: str) -> None:
    walk = WALKERS[walker]
    m = _random_message(random.Random(seed))
    data = m.SerializeToString()
    _check(m, _by_number(walk(data)))
    _check(m, wire.fields_by_number(data))
    wire.validate(data)
    numbers = [n for n, _, _ in walk(data)]
    assert numbers == sorted(numbers)  # protobuf writes fields in number order
    # a window of a larger buffer: only the window is walked, whatever bytes surround it
    for pad in (b"\xff", b"\x01"):
        framed = pad * 7 + data + pad * 5
        _check(m, _by_number(walk(framed, 7, 7 + len(data))))
        _check(m, _by_number(walk(memoryview(framed)[7 : 7 + len(data)])))


def _stream_fields(stream: wire.ByteStream, length: int | None = None) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for number, _wt, value in wire.iter_stream_fields(stream, length):
        kept: object = value
        if isinstance(value, wire.StreamField):
            if number == 2048:
                kept = _stream_fields(stream, value.length)
            else:
                kept = memoryview(value.read(1 << 20))
        out.setdefault(number, []).append(kept)
    return out


class _Dribble(io.RawIOBase):
    """A stream that returns at most ``step`` bytes per read (a slow decompressor)."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._pos, self._step = data, 0, step

    def read(self, n: int = -1) -> bytes:
        n = self._step if n < 0 else min(n, self._step)
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out


@pytest.mark.parametrize("step", [1, 3, 1 << 20])
def test_streaming_walker_reads_what_protobuf_wrote(
    step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire.ByteStream, "READAHEAD", 5)  # tags and varints cross the buffer
    monkeypatch.setattr(wire.ByteStream, "CHUNK", 64)  # long fields come in many reads
    m = _random_message(random.Random(step))
    data = m.SerializeToString()
    stream = wire.ByteStream(_Dribble(data, step))
    fields = _stream_fields(stream)
    assert stream.position == len(data) and stream.at_end()

    def plain(values: dict[int, list[Any]]) -> dict[int, list[Any]]:
        return {n: [plain(v) if isinstance(v, dict) else v for v in vs] for n, vs in values.items()}

    flat = {n: vs for n, vs in plain(fields).items() if n != 2048}
    _check_flat = wire.fields_by_number(data)
    assert {n: vs for n, vs in _check_flat.items() if n != 2048} == flat


@pytest.mark.parametrize("seed", range(5))
def test_skipped_stream_fields_leave_the_stream_at_the_next_field(seed: int) -> None:
    m = _random_message(random.Random(seed))
    data = m.SerializeToString()
    stream = wire.ByteStream(io.BytesIO(data))
    numbers = []
    for number, _wt, value in wire.iter_stream_fields(stream):
        numbers.append(number)
        if isinstance(value, wire.StreamField) and number == 16:
            value.skip()  # skipped by hand; every other LEN field is left for the walker to skip
    assert numbers == [n for n, _, _ in wire.iter_fields(data)]


@pytest.mark.parametrize("seed", range(10))
def test_protobuf_parses_what_encode_field_wrote(seed: int) -> None:
    rng = random.Random(seed)
    u64, fx64, fx32 = rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(32)
    blob = rng.randbytes(rng.choice([0, 1, 127, 128, 70000]))
    far = rng.getrandbits(32)
    data = b"".join(
        [
            wire.encode_field(1, wire.VARINT, u64),
            wire.encode_field(3, wire.I64, fx64),
            wire.encode_field(4, wire.I32, fx32),
            wire.encode_field(16, wire.LEN, blob),
            wire.encode_field(536870911, wire.VARINT, far),
        ]
    )
    m = AllTypes.FromString(data)
    assert (m.u64, m.fx64, m.fx32, m.blob, m.far) == (u64, fx64, fx32, blob, far)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 16383, 16384, 2**35, 2**63, 2**64 - 1])
def test_varints_match_protobuf(value: int) -> None:
    m = AllTypes(u64=value)
    expected = m.SerializeToString()[1:] if value else b"\x00"  # protobuf omits a zero
    assert wire.encode_varint(value) == expected
    assert wire.read_varint(expected, 0, len(expected)) == (value, len(expected))
    assert wire.read_varint(b"\x00" + expected + b"\x00", 1, len(expected) + 2) == (
        value,
        len(expected) + 1,
    )


@pytest.mark.parametrize("walker", WALKERS)
@pytest.mark.parametrize("seed", range(4))
def test_truncation_is_an_error_for_both(seed: int, walker: str) -> None:
    """Cut protobuf's bytes inside a field: protobuf refuses them and so does the walker,
    with a WireError that names an offset inside the data; also when the cut is the end of a
    window and the bytes after it would complete the field."""
    walk = WALKERS[walker]
    data = _random_message(random.Random(seed)).SerializeToString()
    rng = random.Random(seed)
    cuts = 0
    for cut in sorted(rng.sample(range(1, len(data)), 200)):
        try:
            AllTypes.FromString(data[:cut])
        except DecodeError:
            cuts += 1
            for buf, end in ((data[:cut], None), (data[:cut] + b"\x01" * 16, cut)):
                with pytest.raises(wire.WireError) as info:
                    walk(buf, 0, end)
                assert 0 <= info.value.offset < cut
                assert f"at byte {info.value.offset}" in str(info.value)
    assert cuts > 50


@pytest.mark.parametrize("walker", WALKERS)
def test_every_cut_at_a_two_byte_tag_or_length(walker: str) -> None:
    """Fields 16 to 2047 have two-byte tags and 128 to 16383-byte values two-byte lengths:
    protobuf and the walker agree on every prefix of such a message."""
    walk = WALKERS[walker]
    data = AllTypes(blob=b"b" * 200, v128=300, dbl=1.5, packed=[1]).SerializeToString()
    for cut in range(len(data) + 1):
        try:
            expected = AllTypes.FromString(data[:cut])
        except DecodeError:
            with pytest.raises(wire.WireError):
                walk(data[:cut])
        else:
            fields = _by_number(walk(data[:cut]))
            assert bytes(fields.get(16, [b""])[0]) == expected.blob
            assert wire.first(fields, 128) == (expected.v128 or None)


MALFORMED = [
    (b"\x00\x01", "field number 0 at byte 0", 0),
    (b"\x08\x01\x0b", "unsupported wire type 3 at byte 2", 2),
    (b"\x0e", "unsupported wire type 6 at byte 0", 0),
    (b"\x08" + b"\xff" * 11, "varint longer than 10 bytes at byte 1", 1),
    (b"\x08\x80", "varint runs past the end at byte 1", 1),
    (b"\x12\x05ab", "field 2 claims 5 bytes but 2 remain at byte 0", 0),
    (b"\x08\x01\x82\x01\x83\x01ab", "field 16 claims 131 bytes but 2 remain at byte 2", 2),
    (b"\x09" + bytes(7), "fixed64 runs past the end at byte 0", 0),
    (b"\x0d" + bytes(3), "fixed32 runs past the end at byte 0", 0),
]


@pytest.mark.parametrize("walker", WALKERS)
@pytest.mark.parametrize(("data", "message", "offset"), MALFORMED)
def test_malformed_inputs_name_their_offset(
    walker: str, data: bytes, message: str, offset: int
) -> None:
    with pytest.raises(wire.WireError) as info:
        WALKERS[walker](data)
    assert (str(info.value), info.value.offset) == (message, offset)
    with pytest.raises(DecodeError):
        AllTypes.FromString(data)


def test_field_helpers() -> None:
    assert wire.fields_by_number(b"") == {}
    assert wire.first({}, 1) is None and wire.as_str(None) is None and wire.as_str(5) is None
    assert wire.first({1: [1, 2]}, 1) == 2  # the last occurrence wins
    assert wire.as_int(memoryview(b"x")) is None
    assert wire.packed_varints(7) == [7]
    # strings are decoded for display: bytes that are not UTF-8 do not stop the walk
    assert wire.as_str(memoryview("é".encode() + b"\xff")) == "é\ufffd"


def _stream_error(data: bytes, length: int | None = None, cap: int = 1 << 20) -> wire.WireError:
    """The WireError that streaming ``data`` raises (every LEN field read with ``cap``)."""
    with pytest.raises(wire.WireError) as info:
        for _n, _wt, value in wire.iter_stream_fields(wire.ByteStream(io.BytesIO(data)), length):
            if isinstance(value, wire.StreamField):
                value.read(cap)
    return info.value


STREAM_MALFORMED = [
    (b"\x12\x05ab", None, "field 2 claims 5 bytes but the data ends 2 bytes into it at byte 2"),
    (b"\x08\x01\x12\x09abc", 7, "field 2 claims 9 bytes, past its parent's end at byte 2"),
    (b"\x08\x01\x08", 4, "a message claims 4 bytes but the data ends 3 bytes into it at byte 0"),
    (b"\x08\x01\x09" + bytes(8), 4, "nested field overran its parent at byte 11"),
    (b"\x08\x01\x00", None, "field number 0 at byte 2"),
    (b"\x08\x01\x0f", None, "unsupported wire type 7 at byte 2"),
    (b"\x08\x01\x08" + b"\xff" * 11, None, "varint longer than 10 bytes at byte 3"),
]


@pytest.mark.parametrize(("data", "length", "message"), STREAM_MALFORMED)
def test_streaming_errors_name_their_offset(data: bytes, length: int | None, message: str) -> None:
    assert str(_stream_error(data, length)) == message


def test_streaming_limits() -> None:
    with pytest.raises(wire.StreamEnd):
        list(wire.iter_stream_fields(wire.ByteStream(io.BytesIO(b"\x12"))))
    error = _stream_error(b"\x08\x01\x12\x05abcde", cap=4)
    assert (str(error), error.offset) == ("field 2 is 5 bytes, over the 4-byte limit at byte 4", 4)
    # a field exactly as long as the limit is read
    _n, _wt, field = next(wire.iter_stream_fields(wire.ByteStream(io.BytesIO(b"\x12\x05abcde"))))
    assert isinstance(field, wire.StreamField) and field.read(5) == b"abcde"


def test_nested_stream_field_ending_with_its_parent() -> None:
    """A LEN field that ends exactly where its parent ends is the normal case, not an overrun."""
    data = AllTypes(child=AllTypes(u64=1, blob=b"xyz")).SerializeToString()
    stream = wire.ByteStream(io.BytesIO(data))
    fields = wire.iter_stream_fields(stream)
    number, _wt, child = next(fields)
    assert number == 2048 and isinstance(child, wire.StreamField)
    inner = [(n, v if isinstance(v, int) else v.read(10)) for n, _wt, v in child.sub()]
    assert inner == [(1, 1), (16, b"xyz")]
    assert next(fields, None) is None and stream.at_end()


@pytest.mark.parametrize("name", [name for name, *_ in FIELDS])
def test_a_field_at_the_very_end_of_the_buffer(name: str) -> None:
    """Each field alone: its value ends exactly where the bytes end."""
    full = _random_message(random.Random(7))
    m = AllTypes()
    if name == "packed":
        m.packed.extend(full.packed)
    elif name == "child":
        m.child.CopyFrom(full.child)
    else:
        setattr(m, name, getattr(full, name))
    data = m.SerializeToString()
    ((number, _wt, value),) = list(wire.iter_fields(data))
    assert wire.field_list(data) == [(number, _wt, value)]
    (streamed,) = list(wire.iter_stream_fields(wire.ByteStream(io.BytesIO(data))))
    assert streamed[0] == number
    if isinstance(value, int):
        assert streamed[2] == value
    assert AllTypes.FromString(data) == m


def test_an_eleven_byte_varint_is_refused_like_protobuf() -> None:
    data = b"\x08" + b"\xff" * 9 + b"\x01"  # ten bytes: the longest varint
    assert wire.fields_by_number(data) == {1: [2**64 - 1]}
    assert AllTypes.FromString(data).u64 == 2**64 - 1
    too_long = b"\x08" + b"\xff" * 10 + b"\x01"
    with pytest.raises(DecodeError):
        AllTypes.FromString(too_long)
    with pytest.raises(wire.WireError, match="varint longer than 10 bytes at byte 1"):
        wire.validate(too_long)
    with pytest.raises(wire.WireError, match="varint longer than 10 bytes"):
        list(wire.iter_stream_fields(wire.ByteStream(io.BytesIO(too_long))))
