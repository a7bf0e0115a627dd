"""A small reader for Riegeli/records files, enough for XLA's split protos.

There is no riegeli package on PyPI, and GPU cache entries from jax 0.9.1 on are Riegeli files
(docs/format-gpu.md). Layout, from google/riegeli ``doc/riegeli_records_file_format.md``:

* a 24-byte block header at every multiple of 64 KiB (``header_hash``, ``previous_chunk``,
  ``next_chunk``), which may interrupt a chunk anywhere, even its header;
* chunks: a 40-byte little-endian header (``header_hash``, ``data_size``, ``data_hash``,
  ``chunk_type`` + 7-byte ``num_records``, ``decoded_data_size``), ``data_size`` bytes of data
  not counting block headers, then padding up to the position given by ``ChunkEnd``;
* the file starts with a fixed 64-byte signature (a block header and an empty ``'s'`` chunk).

We read simple chunks (``'r'``) compressed with nothing, snappy or zstd. Transposed chunks
(``'t'``) and brotli raise ``UnsupportedFormat``. Hashes are HighwayHash, which we do not have,
so **no hash is verified**; block headers are checked against the chunk layout instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from cachedoctor.formats import snappy
from cachedoctor.formats.errors import CorruptFormat, TooLarge, UnsupportedFormat

Buffer = bytes | bytearray | memoryview

BLOCK_SIZE = 1 << 16
BLOCK_HEADER_SIZE = 24
USABLE_BLOCK_SIZE = BLOCK_SIZE - BLOCK_HEADER_SIZE
CHUNK_HEADER_SIZE = 40

SIGNATURE = bytes.fromhex(
    "83af70d10d884a3f"
    "0000000000000000"
    "4000000000000000"
    "91bac23c9287e1a9"
    "0000000000000000"
    "e19f13c0e9b1c372"
    "7300000000000000"
    "0000000000000000"
)

CHUNK_SIGNATURE = 0x73  # 's'
CHUNK_METADATA = 0x6D  # 'm'
CHUNK_PADDING = 0x70  # 'p'
CHUNK_SIMPLE = 0x72  # 'r'
CHUNK_TRANSPOSED = 0x74  # 't'

COMPRESSION_NONE = 0
COMPRESSION_BROTLI = 0x62  # 'b'
COMPRESSION_ZSTD = 0x7A  # 'z'
COMPRESSION_SNAPPY = 0x73  # 's'

DEFAULT_MAX_BYTES = 1 << 30  # decoded records, all chunks together
DEFAULT_MAX_RECORDS = 1 << 20


@dataclass(frozen=True)
class ChunkInfo:
    """One chunk as found in the file (for ``show`` and for error messages)."""

    offset: int
    chunk_type: str  # one character: 's', 'm', 'p', 'r', 't', or '\\xNN' if unknown
    num_records: int
    data_size: int
    decoded_data_size: int
    compression: str | None  # 'none', 'snappy', 'zstd' for simple chunks


@dataclass(frozen=True)
class RiegeliFile:
    """All records of a file, in order. ``hashes_verified`` is always False (no HighwayHash)."""

    records: tuple[bytes, ...]
    chunks: tuple[ChunkInfo, ...]
    hashes_verified: bool = False


def is_riegeli(data: Buffer) -> bool:
    """True if ``data`` starts with the fixed Riegeli/records file signature."""
    return len(data) >= len(SIGNATURE) and bytes(data[: len(SIGNATURE)]) == SIGNATURE


# --- positions (the formulas of the format's "implementation notes") ----------------------


def _remaining_in_block(pos: int) -> int:
    return (-pos) % BLOCK_SIZE


def _round_up_to_possible_chunk_boundary(pos: int) -> int:
    return pos + max(0, _remaining_in_block(pos) - (USABLE_BLOCK_SIZE - 1))


def _add_with_overhead(chunk_begin: int, length: int) -> int:
    blocks = (length + (chunk_begin + USABLE_BLOCK_SIZE - 1) % BLOCK_SIZE) // USABLE_BLOCK_SIZE
    return chunk_begin + length + blocks * BLOCK_HEADER_SIZE


def chunk_end(chunk_begin: int, data_size: int, num_records: int) -> int:
    """Where the next chunk begins (header, data, block headers and padding included)."""
    return max(
        _add_with_overhead(chunk_begin, CHUNK_HEADER_SIZE + data_size),
        _round_up_to_possible_chunk_boundary(chunk_begin + num_records),
    )


class _ChunkBytes:
    """Reads the logical bytes of one chunk, stepping over (and checking) block headers."""

    def __init__(self, data: memoryview, chunk_begin: int) -> None:
        self.data = data
        self.chunk_begin = chunk_begin
        self.pos = chunk_begin
        self.expected_end: int | None = None  # known once the chunk header is read

    def read(self, n: int) -> memoryview | bytes:
        parts: list[memoryview] = []
        while n > 0:
            if self.pos % BLOCK_SIZE == 0:
                self._block_header()
            take = min(n, BLOCK_SIZE - self.pos % BLOCK_SIZE, len(self.data) - self.pos)
            if take <= 0:
                raise CorruptFormat("file ends inside a chunk", self.pos)
            parts.append(self.data[self.pos : self.pos + take])
            self.pos += take
            n -= take
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def _block_header(self) -> None:
        at = self.pos
        if at + BLOCK_HEADER_SIZE > len(self.data):
            raise CorruptFormat("file ends inside a block header", at)
        previous_chunk = int.from_bytes(self.data[at + 8 : at + 16], "little")
        next_chunk = int.from_bytes(self.data[at + 16 : at + 24], "little")
        if previous_chunk != at - self.chunk_begin:
            raise CorruptFormat(
                f"block header says the chunk began {previous_chunk} bytes earlier, "
                f"expected {at - self.chunk_begin}",
                at,
            )
        if self.expected_end is not None and next_chunk != self.expected_end - at:
            raise CorruptFormat(
                f"block header says the chunk ends {next_chunk} bytes later, "
                f"expected {self.expected_end - at}",
                at,
            )
        self.pos += BLOCK_HEADER_SIZE


def _chunk_type_name(byte: int) -> str:
    return chr(byte) if 0x20 < byte < 0x7F else f"\\x{byte:02x}"


def _varint(buf: Buffer, pos: int, end: int, what: str) -> tuple[int, int]:
    result = 0
    for shift in range(0, 70, 7):
        if pos >= end:
            raise CorruptFormat(f"{what}: varint runs past the end", pos)
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
    raise CorruptFormat(f"{what}: varint longer than 10 bytes", pos)


def _decompress(
    compression: int, buf: memoryview, expected: int | None, limit: int, what: str, at: int
) -> bytes | memoryview:
    """One compressed buffer of a simple chunk: a varint size prefix unless uncompressed."""
    if compression == COMPRESSION_NONE:
        return buf
    size, start = _varint(buf, 0, len(buf), what)
    if expected is not None and size != expected:
        raise CorruptFormat(f"{what}: prefix says {size} bytes, chunk header says {expected}", at)
    if size > limit:
        raise CorruptFormat(f"{what}: prefix claims {size} bytes, at most {limit} possible", at)
    body = buf[start:]
    if compression == COMPRESSION_SNAPPY:
        out = snappy.decompress(body, max_output=size)
    elif compression == COMPRESSION_ZSTD:
        import zstandard

        try:
            out = zstandard.ZstdDecompressor().decompress(bytes(body), max_output_size=size)
        except zstandard.ZstdError as exc:
            raise CorruptFormat(f"{what}: zstd: {exc}", at) from None
    elif compression == COMPRESSION_BROTLI:
        raise UnsupportedFormat(f"{what}: brotli compression is not supported", at)
    else:
        raise UnsupportedFormat(f"{what}: unknown compression type 0x{compression:02x}", at)
    if len(out) != size:
        raise CorruptFormat(f"{what}: decompressed to {len(out)} bytes, expected {size}", at)
    return out


def _simple_chunk(
    data: memoryview, num_records: int, decoded_size: int, at: int
) -> tuple[list[bytes], str]:
    if not data:
        raise CorruptFormat("simple chunk has no compression byte", at)
    compression = data[0]
    sizes_len, pos = _varint(data, 1, len(data), "simple chunk sizes length")
    if sizes_len > len(data) - pos:
        raise CorruptFormat(f"simple chunk sizes buffer claims {sizes_len} bytes", at)
    sizes_raw = _decompress(
        compression, data[pos : pos + sizes_len], None, 10 * num_records, "record sizes", at
    )
    values = _decompress(
        compression, data[pos + sizes_len :], decoded_size, decoded_size, "record values", at
    )
    if len(values) != decoded_size:
        raise CorruptFormat(
            f"simple chunk values are {len(values)} bytes, header says {decoded_size}", at
        )
    records: list[bytes] = []
    spos, send, vpos = 0, len(sizes_raw), 0
    for _ in range(num_records):
        size, spos = _varint(sizes_raw, spos, send, "record size")
        if size > decoded_size - vpos:
            raise CorruptFormat("record sizes add up to more than the decoded size", at)
        records.append(bytes(values[vpos : vpos + size]))
        vpos += size
    if spos != send:
        raise CorruptFormat("record sizes buffer has trailing bytes", at)
    if vpos != decoded_size:
        raise CorruptFormat("record sizes add up to less than the decoded size", at)
    names = {COMPRESSION_NONE: "none", COMPRESSION_SNAPPY: "snappy", COMPRESSION_ZSTD: "zstd"}
    return records, names[compression]


def iter_chunks(
    data: Buffer,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_records: int = DEFAULT_MAX_RECORDS,
) -> Iterator[tuple[ChunkInfo, list[bytes]]]:
    """Decode chunk after chunk, so a caller can stop early (e.g. after the first record).

    Raises ``CorruptFormat`` for a bad signature, truncation or inconsistent sizes,
    ``UnsupportedFormat`` for transposed chunks or brotli, and ``TooLarge`` when the chunks
    claim more than ``max_bytes`` of records or more than ``max_records`` records.
    """
    view = data if isinstance(data, memoryview) else memoryview(data)
    if not is_riegeli(view):
        raise CorruptFormat("not a Riegeli/records file (signature mismatch)", 0)
    count = 0
    total = 0
    pos = len(SIGNATURE)
    while pos < len(view):
        if _remaining_in_block(pos) >= USABLE_BLOCK_SIZE:
            raise CorruptFormat("chunk begins inside or right after a block header", pos)
        reader = _ChunkBytes(view, pos)
        header = reader.read(CHUNK_HEADER_SIZE)
        data_size = int.from_bytes(header[8:16], "little")
        type_and_count = int.from_bytes(header[24:32], "little")
        chunk_type, num_records = type_and_count & 0xFF, type_and_count >> 8
        decoded_size = int.from_bytes(header[32:40], "little")
        end = chunk_end(pos, data_size, num_records)
        if end > len(view):
            raise CorruptFormat(
                f"chunk of {data_size} bytes runs past the end of the file ({len(view)} bytes)",
                pos,
            )
        reader.expected_end = end
        name = _chunk_type_name(chunk_type)
        compression: str | None = None
        chunk_records: list[bytes] = []
        if chunk_type == CHUNK_SIMPLE:
            if num_records > max_records - count:
                raise TooLarge(f"chunk claims {num_records} records, over the limit", pos)
            if decoded_size > max_bytes - total:
                raise TooLarge(
                    f"chunk claims {decoded_size} decoded bytes, over the {max_bytes}-byte limit",
                    pos,
                )
            body = reader.read(data_size)
            chunk_records, compression = _simple_chunk(
                memoryview(body), num_records, decoded_size, pos
            )
            count += num_records
            total += decoded_size
        elif chunk_type == CHUNK_TRANSPOSED:
            raise UnsupportedFormat("transposed Riegeli chunks ('t') are not supported", pos)
        elif chunk_type in (CHUNK_SIGNATURE, CHUNK_PADDING, CHUNK_METADATA):
            if chunk_type != CHUNK_METADATA and num_records:
                raise CorruptFormat(f"chunk '{name}' claims {num_records} records", pos)
            # Metadata describes the records; padding and repeated signatures carry nothing.
        else:
            raise UnsupportedFormat(f"unknown Riegeli chunk type {name}", pos)
        yield ChunkInfo(pos, name, num_records, data_size, decoded_size, compression), chunk_records
        pos = end


def read_records(
    data: Buffer,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_records: int = DEFAULT_MAX_RECORDS,
) -> RiegeliFile:
    """Decode every record of a Riegeli/records file held in memory (errors as ``iter_chunks``)."""
    records: list[bytes] = []
    chunks: list[ChunkInfo] = []
    for info, chunk_records in iter_chunks(data, max_bytes=max_bytes, max_records=max_records):
        chunks.append(info)
        records.extend(chunk_records)
    return RiegeliFile(tuple(records), tuple(chunks))


def read_first_record(data: Buffer, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes | None:
    """The first record, decoding only the chunks up to it; None if the file has none."""
    for _info, chunk_records in iter_chunks(data, max_bytes=max_bytes):
        if chunk_records:
            return chunk_records[0]
    return None
