"""Pure-Python decompressor for raw snappy blocks, with a hard bound on the output size.

Riegeli compresses split-proto chunks with snappy, and we must read them without a new
dependency. Format: https://github.com/google/snappy/blob/main/format_description.txt —
a varint (at most 32 bits) with the uncompressed length, then elements whose tag byte's low two
bits say: 00 literal, 01 copy with a 1-byte offset, 10 copy with a 2-byte offset, 11 copy with a
4-byte offset. Copies may overlap their own output (run-length style).
"""

from __future__ import annotations

from cachedoctor.formats.errors import CorruptFormat, TooLarge

Buffer = bytes | bytearray | memoryview

DEFAULT_MAX_OUTPUT = 1 << 30


def uncompressed_length(data: Buffer) -> tuple[int, int]:
    """The length declared in the preamble and the offset where the elements start."""
    result = 0
    for i in range(5):
        if i >= len(data):
            raise CorruptFormat("snappy preamble runs past the end", i)
        byte = data[i]
        result |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if result > 0xFFFFFFFF:
                raise CorruptFormat("snappy length does not fit in 32 bits", 0)
            return result, i + 1
    raise CorruptFormat("snappy preamble longer than 5 bytes", 0)


def decompress(data: Buffer, max_output: int = DEFAULT_MAX_OUTPUT) -> bytes:
    """Decompress one raw snappy block; the declared length is checked before allocating."""
    src = data if isinstance(data, memoryview) else memoryview(data)
    length, pos = uncompressed_length(src)
    if length > max_output:
        raise TooLarge(f"snappy block declares {length} bytes, over the {max_output}-byte limit")
    out = bytearray()
    end = len(src)
    while pos < end:
        tag_at = pos
        tag = src[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            n = tag >> 2
            if n >= 60:
                extra = n - 59
                if pos + extra > end:
                    raise CorruptFormat("snappy literal length runs past the end", tag_at)
                n = int.from_bytes(src[pos : pos + extra], "little")
                pos += extra
            n += 1
            if pos + n > end:
                raise CorruptFormat("snappy literal runs past the end", tag_at)
            if len(out) + n > length:
                raise CorruptFormat("snappy output longer than declared", tag_at)
            out += src[pos : pos + n]
            pos += n
            continue
        if kind == 1:
            if pos + 1 > end:
                raise CorruptFormat("snappy copy runs past the end", tag_at)
            n = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | src[pos]
            pos += 1
        else:
            width = 2 if kind == 2 else 4
            if pos + width > end:
                raise CorruptFormat("snappy copy runs past the end", tag_at)
            n = 1 + (tag >> 2)
            offset = int.from_bytes(src[pos : pos + width], "little")
            pos += width
        if offset == 0 or offset > len(out):
            raise CorruptFormat(f"snappy copy offset {offset} outside the output", tag_at)
        if len(out) + n > length:
            raise CorruptFormat("snappy output longer than declared", tag_at)
        start = len(out) - offset
        if n <= offset:
            out += out[start : start + n]
        else:  # overlapping copy: the last `offset` bytes repeat
            pattern = bytes(out[start:])
            reps, rest = divmod(n, offset)
            out += pattern * reps + pattern[:rest]
    if len(out) != length:
        raise CorruptFormat(f"snappy output is {len(out)} bytes, preamble said {length}", end)
    return bytes(out)
