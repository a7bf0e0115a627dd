"""Raw snappy blocks: hand-computed vectors from the format description, round trips through the
test encoder, and damaged input that must raise a typed error."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from cachedoctor.formats import snappy
from cachedoctor.formats.errors import CorruptFormat, FormatError, TooLarge
from tests.support.caches import SUPPORT_DIR
from tests.support.gpu_vectors import snappy_compress

# Vectors worked out by hand from google/snappy format_description.txt (sections 1 and 2).
HAND_VECTORS = [
    (b"\x00", b""),  # preamble 0, no elements
    (b"\x05\x10Hello", b"Hello"),  # literal, tag (5-1)<<2
    # literal "abcd", then copy with 1-byte offset: len 8 -> bits (8-4)<<2, offset 4
    (b"\x0c\x0cabcd\x11\x04", b"abcdabcdabcd"),
    # overlapping copy (offset 1, len 9) repeats a single byte
    (b"\x0a\x00a\x15\x01", b"a" * 10),
    # copy with 2-byte offset: tag 2 | (len-1)<<2, offset little-endian
    (b"\x06\x08xyz\x0a\x03\x00", b"xyzxyz"),
    # copy with 4-byte offset
    (b"\x06\x08xyz\x0b\x03\x00\x00\x00", b"xyzxyz"),
    # literal with a 1-byte extended length (tag 60<<2, then len-1 = 99)
    (b"\x64\xf0\x63" + bytes(range(100)), bytes(range(100))),
    # 1-byte-offset copy using the high offset bits: offset 0x105 = 261 (bits 5-7 hold 1)
    (
        b"\x8d\x02" + b"\xf0\xff" + bytes(range(256)) + b"\x10" + b"ABCDE" + b"\x31\x05",
        bytes(range(256)) + b"ABCDE" + bytes(range(8)),
    ),
]


@pytest.mark.parametrize(("compressed", "expected"), HAND_VECTORS)
def test_hand_vectors(compressed: bytes, expected: bytes) -> None:
    assert snappy.decompress(compressed) == expected


def test_high_offset_bits_vector_is_what_we_meant() -> None:
    # Output = 256 bytes, "ABCDE", then copy of 8 bytes from 261 back = bytes 0..7.
    data = HAND_VECTORS[-1][0]
    assert snappy.uncompressed_length(data) == (269, 2)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"x",
        b"hello hello hello hello",
        bytes(range(256)) * 40,
        b"\x00" * 100_000,
        random.Random(1).randbytes(5000),
        b"".join(random.Random(2).choice([b"ab", b"abc", b"zzzz", b"q"]) for _ in range(4000)),
    ],
)
@pytest.mark.parametrize("wide", [False, True])
def test_round_trip(payload: bytes, wide: bool) -> None:
    assert snappy.decompress(snappy_compress(payload, wide_copies=wide)) == payload


def test_every_truncation_is_a_typed_error() -> None:
    data = snappy_compress(b"The quick brown fox jumps over the lazy dog. " * 20)
    for cut in range(len(data)):
        with pytest.raises(CorruptFormat):
            snappy.decompress(data[:cut])


def test_declared_size_over_the_limit_is_refused_before_allocating() -> None:
    huge = b"\xff\xff\xff\xff\x0f" + b"\x00a"  # claims 4 GiB - 1
    with pytest.raises(TooLarge):
        snappy.decompress(huge, max_output=1 << 20)
    with pytest.raises(TooLarge):
        snappy.decompress(snappy_compress(b"a" * 100), max_output=99)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x04\x00a\x01\x00", "offset 0"),
        (b"\x08\x00a\x05\x02", "offset past the output"),
        (b"\x02\x08abc", "literal longer than declared"),
        (b"\x05\x00a", "shorter than declared"),
        (b"\x80\x80\x80\x80\x80\x01", "preamble too long"),
        (b"\x80\x80\x80\x80\x10", "length over 32 bits"),
        (b"\x05\xf4\x01", "extended literal length cut"),
        (b"\x04\x00a\x02", "copy offset cut"),
    ],
)
def test_damaged_blocks(data: bytes, why: str) -> None:
    with pytest.raises(CorruptFormat):
        snappy.decompress(data)


def test_random_bytes_never_escape_as_other_exceptions() -> None:
    rng = random.Random(8)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        data = rng.randbytes(rng.randrange(0, 40))
        try:
            snappy.decompress(data, max_output=1 << 16)
            outcomes["ok"] += 1
        except FormatError:
            outcomes["error"] += 1
    assert outcomes["error"] > 0


def test_mutated_valid_streams_never_escape() -> None:
    rng = random.Random(9)
    base = bytearray(snappy_compress(b"abcabcabcXYZXYZ" * 50 + bytes(range(200))))
    for _ in range(2000):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            out = snappy.decompress(bytes(data), max_output=1 << 16)
        except FormatError:
            continue
        assert len(out) == snappy.uncompressed_length(bytes(data))[0]


# Blocks made by an independent encoder (cramjam 2.14.0's snappy.compress_raw, i.e. the Rust
# snap crate), stored in fixtures/snappy_vectors.json; the inputs are rebuilt here.
def _vector_inputs() -> dict[str, bytes]:
    ptx = b"".join(
        b"\tld.global.f32 %%f%d, [%%rd%d+%d];\n" % (i, i % 7, 4 * i) for i in range(3000)
    )
    pieces = [b"abcd", b"\x00" * 9, bytes([7]) * 70, b"xyz"]
    rng = random.Random(2)
    return {
        "empty": b"",
        "pangram_x40": b"The quick brown fox jumps over the lazy dog. " * 40,
        "range256_x64": bytes(range(256)) * 64,
        "zeros_100k": bytes(100_000),
        "ptx_like": ptx,
        "random_4k_seed1": random.Random(1).randbytes(4096),
        "mixed_70k_seed2": b"".join(rng.choice(pieces) for _ in range(12000)),
    }


def test_blocks_from_an_independent_encoder() -> None:
    doc = json.loads((SUPPORT_DIR / "fixtures" / "snappy_vectors.json").read_text())
    inputs = _vector_inputs()
    assert {v["name"] for v in doc["vectors"]} == set(inputs)
    for vector in doc["vectors"]:
        raw = inputs[vector["name"]]
        assert hashlib.sha256(raw).hexdigest() == vector["raw_sha256"]
        assert snappy.decompress(bytes.fromhex(vector["compressed_hex"])) == raw, vector["name"]
