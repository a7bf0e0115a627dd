"""Defensive protobuf wire-format parsing, with no generated code and no protobuf dependency.

The cache holds XLA protos whose schemas change between releases, so we walk the wire format
directly: unknown fields are kept as raw values, and malformed input raises ``WireError`` naming
the offset, never an IndexError or a runaway allocation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

VARINT = 0
I64 = 1
LEN = 2
SGROUP = 3
EGROUP = 4
I32 = 5

MAX_VARINT_BYTES = 10

Buffer = bytes | bytearray | memoryview
FieldValue = int | memoryview


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(f"{message} at byte {offset}")
        self.offset = offset


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; returns (value, new position)."""
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise WireError("varint runs past the end", start)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if pos - start >= MAX_VARINT_BYTES:
            raise WireError("varint longer than 10 bytes", start)


def iter_fields(
    buf: Buffer, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, int, FieldValue]]:
    """Yield ``(field_number, wire_type, value)`` for each field of one message.

    ``value`` is an int for VARINT/I64/I32 and a memoryview for LEN fields. Groups (deprecated,
    unused by XLA) are rejected.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    pos = start
    end = len(view) if end is None else end
    while pos < end:
        tag_at = pos
        tag = view[pos]
        if tag < 0x80:  # one-byte varints are the common case: no call
            pos += 1
        else:
            tag, pos = read_varint(view, pos, end)
        field_number, wire_type = tag >> 3, tag & 7
        if field_number == 0:
            raise WireError("field number 0", tag_at)
        if wire_type == VARINT:
            if pos < end and view[pos] < 0x80:
                yield field_number, wire_type, view[pos]
                pos += 1
            else:
                value, pos = read_varint(view, pos, end)
                yield field_number, wire_type, value
        elif wire_type == LEN:
            if pos < end and view[pos] < 0x80:
                length = view[pos]
                pos += 1
            else:
                length, pos = read_varint(view, pos, end)
            if length > end - pos:
                raise WireError(
                    f"field {field_number} claims {length} bytes but {end - pos} remain", tag_at
                )
            yield field_number, wire_type, view[pos : pos + length]
            pos += length
        elif wire_type == I64:
            if pos + 8 > end:
                raise WireError("fixed64 runs past the end", tag_at)
            yield field_number, wire_type, int.from_bytes(view[pos : pos + 8], "little")
            pos += 8
        elif wire_type == I32:
            if pos + 4 > end:
                raise WireError("fixed32 runs past the end", tag_at)
            yield field_number, wire_type, int.from_bytes(view[pos : pos + 4], "little")
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire_type}", tag_at)


def field_list(
    buf: Buffer, start: int = 0, end: int | None = None
) -> list[tuple[int, int, FieldValue]]:
    """All ``(field_number, wire_type, value)`` of one message, as ``iter_fields`` yields them.

    One tight loop without a generator: the HLO walk reads millions of fields, and building
    the list in place costs about half as much as consuming ``iter_fields``.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    pos = start
    end = len(view) if end is None else end
    out: list[tuple[int, int, FieldValue]] = []
    append = out.append
    while pos < end:
        tag_at = pos
        tag = view[pos]
        if tag < 0x80:
            pos += 1
        elif pos + 1 < end and view[pos + 1] < 0x80:  # field numbers 16-2047
            tag = (tag & 0x7F) | (view[pos + 1] << 7)
            pos += 2
        else:
            tag, pos = read_varint(view, pos, end)
        field_number, wire_type = tag >> 3, tag & 7
        if field_number == 0:
            raise WireError("field number 0", tag_at)
        if wire_type == LEN:
            if pos + 1 < end and view[pos + 1] < 0x80 <= view[pos]:  # two-byte length
                length = (view[pos] & 0x7F) | (view[pos + 1] << 7)
                pos += 2
            elif pos < end and view[pos] < 0x80:
                length = view[pos]
                pos += 1
            else:
                length, pos = read_varint(view, pos, end)
            if length > end - pos:
                raise WireError(
                    f"field {field_number} claims {length} bytes but {end - pos} remain", tag_at
                )
            append((field_number, LEN, view[pos : pos + length]))
            pos += length
        elif wire_type == VARINT:
            if pos < end and view[pos] < 0x80:
                append((field_number, VARINT, view[pos]))
                pos += 1
            elif pos + 1 < end and view[pos + 1] < 0x80:  # two-byte varint (ids, sizes)
                append((field_number, VARINT, (view[pos] & 0x7F) | (view[pos + 1] << 7)))
                pos += 2
            else:
                value, pos = read_varint(view, pos, end)
                append((field_number, VARINT, value))
        elif wire_type == I64:
            if pos + 8 > end:
                raise WireError("fixed64 runs past the end", tag_at)
            append((field_number, I64, int.from_bytes(view[pos : pos + 8], "little")))
            pos += 8
        elif wire_type == I32:
            if pos + 4 > end:
                raise WireError("fixed32 runs past the end", tag_at)
            append((field_number, I32, int.from_bytes(view[pos : pos + 4], "little")))
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire_type}", tag_at)
    return out


def validate(buf: Buffer) -> None:
    """Raise WireError unless ``buf`` parses as one message (top level only)."""
    for _ in iter_fields(buf):
        pass


def fields_by_number(buf: Buffer) -> dict[int, list[FieldValue]]:
    """All fields of a message grouped by number (repeated fields keep their order)."""
    out: dict[int, list[FieldValue]] = {}
    for number, _wt, value in field_list(buf):
        if number in out:
            out[number].append(value)
        else:
            out[number] = [value]
    return out


def first(fields: dict[int, list[FieldValue]], number: int) -> FieldValue | None:
    values = fields.get(number)
    return values[-1] if values else None  # proto3: the last occurrence wins


def as_str(value: FieldValue | None) -> str | None:
    if value is None or isinstance(value, int):
        return None
    return bytes(value).decode("utf-8", "replace")


def as_int(value: FieldValue | None) -> int | None:
    return value if isinstance(value, int) else None


def as_sint(value: int) -> int:
    """Interpret a varint as a two's-complement int64 (proto int64 fields)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def packed_varints(value: FieldValue) -> list[int]:
    """Decode a packed repeated varint field (or a single unpacked varint)."""
    if isinstance(value, int):
        return [value]
    out = []
    pos, end = 0, len(value)
    while pos < end:
        v, pos = read_varint(value, pos, end)
        out.append(v)
    return out


def encode_varint(value: int) -> bytes:
    """A non-negative int as a protobuf varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def encode_field(number: int, wire_type: int, value: FieldValue | bytes) -> bytes:
    """One field (tag and value) in wire format; the inverse of what ``iter_fields`` yields."""
    tag = encode_varint(number << 3 | wire_type)
    if wire_type == VARINT:
        assert isinstance(value, int)
        return tag + encode_varint(value)
    if wire_type == I64:
        assert isinstance(value, int)
        return tag + value.to_bytes(8, "little")
    if wire_type == I32:
        assert isinstance(value, int)
        return tag + value.to_bytes(4, "little")
    assert not isinstance(value, int)
    return tag + encode_varint(len(value)) + bytes(value)


# --- streaming ------------------------------------------------------------------------------


class StreamEnd(Exception):
    """The stream ended before a field was complete."""


@dataclass
class StreamField:
    """A LEN field met while streaming: read it whole (bounded) or skip it without keeping it."""

    number: int
    length: int
    offset: int  # offset of the field's payload in the stream
    _stream: ByteStream

    def read(self, cap: int) -> bytes:
        if self.length > cap:
            raise WireError(
                f"field {self.number} is {self.length} bytes, over the {cap}-byte limit",
                self.offset,
            )
        try:
            return self._stream.read_exact(self.length)
        except StreamEnd as exc:
            raise self._runaway() from exc

    def skip(self) -> None:
        try:
            self._stream.skip(self.length)
        except StreamEnd as exc:
            raise self._runaway() from exc

    def skip_rest(self) -> None:
        """Skip whatever the caller left unread of this field."""
        remaining = self.offset + self.length - self._stream.position
        try:
            self._stream.skip(remaining)
        except StreamEnd as exc:
            raise self._runaway() from exc

    def _runaway(self) -> WireError:
        return WireError(
            f"field {self.number} claims {self.length} bytes but the data ends "
            f"{self._stream.position - self.offset} bytes into it",
            self.offset,
        )

    def sub(self) -> Iterator[tuple[int, int, int | StreamField]]:
        """Walk this field's payload as a nested message, streaming."""
        return iter_stream_fields(self._stream, self.length)


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class ByteStream:
    """A counted reader over a file-like object, with exact reads and cheap skips.

    Small reads (tags, varints) are served from a read-ahead buffer: one call into the
    decompressor per ``READAHEAD`` bytes instead of one per byte.
    """

    CHUNK = 1 << 20
    READAHEAD = 1 << 16

    def __init__(self, raw: Readable) -> None:
        self._raw = raw
        self.position = 0
        self._buf = b""
        self._off = 0

    def read_exact(self, n: int) -> bytes:
        off = self._off
        end = off + n
        if end <= len(self._buf):
            self._off = end
            self.position += n
            return self._buf[off:end]
        parts = [self._buf[off:]] if off < len(self._buf) else []
        need = n - (len(self._buf) - off)
        self._buf, self._off = b"", 0
        while need > 0:
            chunk = self._raw.read(
                self.READAHEAD if need < self.READAHEAD else min(need, self.CHUNK)
            )
            if not chunk:  # what was read is consumed: the position is where the data ends
                self.position += n - need
                raise StreamEnd(f"stream ended {need} bytes short at byte {self.position}")
            if len(chunk) > need:  # keep the read-ahead
                self._buf = chunk
                self._off = need
                chunk = chunk[:need]
            parts.append(chunk)
            need -= len(chunk)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.position += len(data)
        return data

    def read_some(self, n: int) -> bytes:
        """Up to ``n`` bytes; fewer only at end of stream."""
        off = self._off
        take = self._buf[off : off + n]
        self._off = off + len(take)
        parts = [take] if take else []
        n -= len(take)
        while n > 0:
            chunk = self._raw.read(min(n, self.CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            n -= len(chunk)
        data = b"".join(parts)
        self.position += len(data)
        return data

    def skip(self, n: int) -> None:
        while n > 0:
            step = min(n, self.CHUNK)
            self.read_exact(step)
            n -= step

    def peek_byte(self) -> int | None:
        if self._off >= len(self._buf):
            self._buf, self._off = self._raw.read(self.READAHEAD), 0
            if not self._buf:
                return None
        return self._buf[self._off]

    def peek(self, n: int) -> bytes:
        """Up to ``n`` bytes ahead, without consuming them; fewer only at end of stream."""
        have = len(self._buf) - self._off
        if have < n:
            parts = [self._buf[self._off :]]
            while have < n:
                chunk = self._raw.read(max(n - have, self.READAHEAD))
                if not chunk:
                    break
                parts.append(chunk)
                have += len(chunk)
            self._buf, self._off = b"".join(parts), 0
        return self._buf[self._off : self._off + n]

    def read_varint(self) -> int:
        off = self._off
        if off < len(self._buf) and self._buf[off] < 0x80:  # the common one-byte case
            self._off = off + 1
            self.position += 1
            return self._buf[off]
        result = 0
        shift = 0
        start = self.position
        for _ in range(MAX_VARINT_BYTES):
            byte = self.read_exact(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
        raise WireError("varint longer than 10 bytes", start)

    def at_end(self) -> bool:
        return self.peek_byte() is None


def iter_stream_fields(
    stream: ByteStream, length: int | None = None
) -> Iterator[tuple[int, int, int | StreamField]]:
    """Like ``iter_fields`` over a stream; LEN fields come as ``StreamField`` to read or skip.

    The caller must read, skip or walk each StreamField before asking for the next field; one
    left untouched is skipped automatically. Within a message of known ``length``, running out
    of data is a WireError (the length was a lie); at top level it is StreamEnd (truncation).
    """
    start = stream.position
    try:
        yield from _iter_stream_fields(stream, length)
    except StreamEnd as exc:
        if length is None:
            raise
        raise WireError(
            f"a message claims {length} bytes but the data ends {stream.position - start}"
            " bytes into it",
            start,
        ) from exc


def _iter_stream_fields(
    stream: ByteStream, length: int | None
) -> Iterator[tuple[int, int, int | StreamField]]:
    end = None if length is None else stream.position + length
    while True:
        if end is not None:
            if stream.position == end:
                return
            if stream.position > end:
                raise WireError("nested field overran its parent", stream.position)
        elif stream.at_end():
            return
        tag_at = stream.position
        tag = stream.read_varint()
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0", tag_at)
        if wire_type == VARINT:
            yield number, wire_type, stream.read_varint()
        elif wire_type == LEN:
            n = stream.read_varint()
            if end is not None and stream.position + n > end:
                raise WireError(f"field {number} claims {n} bytes, past its parent's end", tag_at)
            field = StreamField(number, n, stream.position, stream)
            yield number, wire_type, field
            if stream.position - field.offset < n:
                field.skip_rest()
        elif wire_type == I64:
            yield number, wire_type, int.from_bytes(stream.read_exact(8), "little")
        elif wire_type == I32:
            yield number, wire_type, int.from_bytes(stream.read_exact(4), "little")
        else:
            raise WireError(f"unsupported wire type {wire_type}", tag_at)
