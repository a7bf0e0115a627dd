"""Riegeli/records reading: signature, block headers every 64 KiB (also inside chunk headers),
simple chunks with none/snappy/zstd, padding, and every kind of damage we can think of."""

from __future__ import annotations

import contextlib
import random

import pytest

from cachedoctor.formats import riegeli
from cachedoctor.formats.errors import CorruptFormat, FormatError, TooLarge, UnsupportedFormat
from tests.support.gpu_vectors import BLOCK, RiegeliWriter, riegeli_file, simple_chunk_data, varint

SPEC_SIGNATURE_HEX = """
83 af 70 d1 0d 88 4a 3f 00 00 00 00 00 00 00 00
40 00 00 00 00 00 00 00 91 ba c2 3c 92 87 e1 a9
00 00 00 00 00 00 00 00 e1 9f 13 c0 e9 b1 c3 72
73 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
"""


def test_signature_matches_the_specification() -> None:
    assert bytes.fromhex(SPEC_SIGNATURE_HEX) == riegeli.SIGNATURE
    assert riegeli.is_riegeli(riegeli.SIGNATURE)
    assert not riegeli.is_riegeli(riegeli.SIGNATURE[:63])
    assert not riegeli.is_riegeli(b"\x0a\x05hello" + bytes(60))


def test_signature_only_file_has_no_records() -> None:
    f = riegeli.read_records(riegeli.SIGNATURE)
    assert f.records == ()
    assert f.hashes_verified is False


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd"])
def test_round_trip_small(compression: str) -> None:
    records = [b"", b"manifest", b"\x00" * 10, bytes(range(256))]
    f = riegeli.read_records(riegeli_file(records, compression))
    assert list(f.records) == records
    assert [c.chunk_type for c in f.chunks] == ["r"]
    assert f.chunks[0].compression == compression


@pytest.mark.parametrize("compression", ["none", "snappy"])
def test_large_record_crosses_several_block_headers(compression: str) -> None:
    rng = random.Random(3)
    big = rng.randbytes(3 * BLOCK + 1234)
    records = [b"head", big, b"tail"]
    data = riegeli_file(records, compression)
    assert len(data) > 3 * BLOCK
    f = riegeli.read_records(data)
    assert list(f.records) == records  # no block header bytes leaked into the record


def test_chunk_header_interrupted_by_a_block_header() -> None:
    for lead in range(1, 40, 3):  # the next chunk header starts `lead` bytes before 64 KiB
        w = RiegeliWriter()
        w.padding_to(BLOCK - lead)
        assert w.chunk_offsets[-1] < BLOCK
        w.records([b"alpha", b"beta"], "none")
        data = w.getvalue()
        start = w.chunk_offsets[-1]
        assert start < BLOCK < start + 40 + 24, (lead, start)
        f = riegeli.read_records(data)
        assert list(f.records) == [b"alpha", b"beta"]
        assert f.chunks[-1].offset == start


def test_chunk_ending_exactly_at_a_block_boundary() -> None:
    w = RiegeliWriter()
    # padding chunk ends at 64 KiB exactly; the next one begins at the boundary
    w.chunk(b"p", bytes(BLOCK - 64 - 40), 0, 0)
    assert len(w.getvalue()) == BLOCK
    w.records([b"x" * 100], "snappy")
    f = riegeli.read_records(w.getvalue())
    assert f.records == (b"x" * 100,)
    assert f.chunks[-1].offset == BLOCK


def test_many_empty_records_need_padding() -> None:
    # 500 empty records occupy fewer data bytes than num_records: the chunk is padded
    w = RiegeliWriter()
    w.records([b""] * 500, "snappy")
    w.records([b"after"], "none")
    f = riegeli.read_records(w.getvalue())
    assert f.records == (b"",) * 500 + (b"after",)
    first = f.chunks[0]
    assert first.offset + 40 + first.data_size < first.offset + 500 == f.chunks[1].offset


def test_writer_layout_agrees_with_chunk_end() -> None:
    rng = random.Random(5)
    w = RiegeliWriter()
    for _ in range(60):
        n = rng.choice([0, 1, 3, 200])
        size = rng.choice([0, 10, 5000, 40000])
        w.records([rng.randbytes(size // max(n, 1)) for _ in range(n)], "none")
    offsets = [*w.chunk_offsets, len(w.getvalue())]
    f = riegeli.read_records(w.getvalue())
    for chunk, nxt in zip(f.chunks, offsets[1:], strict=True):
        assert riegeli.chunk_end(chunk.offset, chunk.data_size, chunk.num_records) == nxt


def test_several_chunks_keep_record_order() -> None:
    records = [f"record {i}".encode() * (i % 7) for i in range(300)]
    f = riegeli.read_records(riegeli_file(records, "snappy", per_chunk=17))
    assert list(f.records) == records
    assert len(f.chunks) == 18


def test_transposed_chunk_is_unsupported() -> None:
    w = RiegeliWriter()
    w.chunk(b"t", b"\x00\x01\x02", 1, 3)
    with pytest.raises(UnsupportedFormat, match="transposed"):
        riegeli.read_records(w.getvalue())


def test_unknown_chunk_type_is_unsupported() -> None:
    w = RiegeliWriter()
    w.chunk(b"Q", b"", 0, 0)
    with pytest.raises(UnsupportedFormat, match="chunk type Q"):
        riegeli.read_records(w.getvalue())


def test_brotli_is_unsupported() -> None:
    w = RiegeliWriter()
    w.chunk(b"r", b"b" + varint(2) + b"\x01\x00" + b"\x05xxxxx", 1, 5)
    with pytest.raises(UnsupportedFormat, match="brotli"):
        riegeli.read_records(w.getvalue())


def test_metadata_and_padding_chunks_are_skipped() -> None:
    w = RiegeliWriter()
    w.chunk(b"m", b"\x00opaque", 0, 7)
    w.chunk(b"p", bytes(100), 0, 0)
    w.records([b"one"], "none")
    f = riegeli.read_records(w.getvalue())
    assert f.records == (b"one",)
    assert [c.chunk_type for c in f.chunks] == ["m", "p", "r"]


def test_bad_signature() -> None:
    data = bytearray(riegeli_file([b"a"]))
    data[3] ^= 1
    with pytest.raises(CorruptFormat, match="signature"):
        riegeli.read_records(bytes(data))


def test_every_truncation_is_a_typed_error() -> None:
    data = riegeli_file([b"hello" * 50, b"world" * 30], "snappy")
    for cut in range(65, len(data)):
        with pytest.raises(CorruptFormat):
            riegeli.read_records(data[:cut])


def test_truncated_inside_a_block_header() -> None:
    data = riegeli_file([b"z" * (BLOCK + 100)], "none")
    with pytest.raises(CorruptFormat):
        riegeli.read_records(data[: BLOCK + 10])


def test_chunk_claiming_a_huge_decoded_size() -> None:
    w = RiegeliWriter()
    w.chunk(b"r", simple_chunk_data([b"abc"]), 1, 1 << 50)
    with pytest.raises(TooLarge):
        riegeli.read_records(w.getvalue())
    w2 = RiegeliWriter()
    w2.records([b"a" * 1000], "snappy")
    with pytest.raises(TooLarge):
        riegeli.read_records(w2.getvalue(), max_bytes=999)


def test_chunk_claiming_more_data_than_the_file_holds() -> None:
    w = RiegeliWriter()
    w.chunk(b"r", simple_chunk_data([b"abc"]), 1, 3, data_size=1 << 40)
    with pytest.raises(CorruptFormat, match="past the end"):
        riegeli.read_records(w.getvalue())


def test_too_many_records() -> None:
    with pytest.raises(TooLarge):
        riegeli.read_records(riegeli_file([b"a"] * 10, "none"), max_records=9)


def test_block_header_in_the_middle_of_a_chunk_is_checked() -> None:
    data = bytearray(riegeli_file([b"q" * (BLOCK + 500)], "none"))
    assert riegeli.read_records(bytes(data)).records[0] == b"q" * (BLOCK + 500)
    data[BLOCK + 8] ^= 0x40  # previous_chunk of the block header inside the chunk
    with pytest.raises(CorruptFormat, match="block header"):
        riegeli.read_records(bytes(data))
    data[BLOCK + 8] ^= 0x40
    data[BLOCK + 16] ^= 0x01  # next_chunk
    with pytest.raises(CorruptFormat, match="block header"):
        riegeli.read_records(bytes(data))


def test_inconsistent_simple_chunk_sizes() -> None:
    w = RiegeliWriter()
    w.chunk(b"r", simple_chunk_data([b"abc", b"de"]), 2, 6)  # records add up to 5
    with pytest.raises(CorruptFormat):
        riegeli.read_records(w.getvalue())
    w = RiegeliWriter()
    w.chunk(b"r", simple_chunk_data([b"abc", b"de"]), 1, 5)  # one size left over
    with pytest.raises(CorruptFormat):
        riegeli.read_records(w.getvalue())


def test_snappy_prefix_disagrees_with_header() -> None:
    w = RiegeliWriter()
    data = simple_chunk_data([b"hello"], "snappy")
    w.chunk(b"r", data, 1, 6)
    with pytest.raises(CorruptFormat):
        riegeli.read_records(w.getvalue())


def test_random_bytes_after_the_signature() -> None:
    rng = random.Random(11)
    errors = 0
    for _ in range(1500):
        data = riegeli.SIGNATURE + rng.randbytes(rng.randrange(1, 120))
        try:
            riegeli.read_records(data, max_bytes=1 << 16)
        except FormatError:
            errors += 1
    assert errors > 1400


def test_mutations_of_a_valid_file_never_escape() -> None:
    rng = random.Random(12)
    base = riegeli_file([b"manifest", b"x" * 300, b"rest" * 40], "snappy", per_chunk=1)
    for _ in range(1500):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(64, len(data))] = rng.randrange(256)
        with contextlib.suppress(FormatError):
            riegeli.read_records(bytes(data), max_bytes=1 << 16)
