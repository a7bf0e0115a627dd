"""The entry decompressor against zstandard's and zlib's own decoders (independent oracles).

What the reference decoders produce from the same bytes is what ``Decompressor`` must deliver,
byte for byte and hash for hash; what they refuse (a frame cut short, damaged data) it must
refuse with a problem of the right kind, never a traceback and never a silent short read.
"""

from __future__ import annotations

import hashlib
import io
import random
import zlib

import pytest
import zstandard

from cachedoctor.cache.decompress import DecodeFailure, Decompressor, detect_compression

CAP = 1 << 22


def _compress(kind: str, data: bytes) -> bytes:
    if kind == "zstd":  # JAX's own writer: a frame that declares its content size
        return zstandard.ZstdCompressor().compress(data)
    if kind == "zstd-unsized":
        return zstandard.ZstdCompressor(write_content_size=False).compress(data)
    return zlib.compress(data)


def _decompressor(blob: bytes, kind: str, cap: int = CAP, hash_from: int = 4) -> Decompressor:
    return Decompressor(io.BytesIO(blob), "zlib" if kind == "zlib" else "zstd", cap, hash_from)


def _read_all(dec: Decompressor, step: int) -> bytes:
    parts = []
    while chunk := dec.read(step):
        assert step < 0 or len(chunk) <= step  # bounded output per read, even for a zip bomb
        parts.append(chunk)
    return b"".join(parts)


def _payload(rng: random.Random, size: int) -> bytes:
    # half compressible text, half noise: both codecs take several blocks for the larger sizes
    text = bytes(rng.choices(b"abc\n", k=size // 2))
    return text + rng.randbytes(size - len(text))


@pytest.mark.parametrize("kind", ["zstd", "zstd-unsized", "zlib"])
@pytest.mark.parametrize(("size", "step"), [(0, -1), (3, 1), (5, 2), (300, 7), (3 << 19, -1)])
def test_output_and_hash_match_the_reference_decoder(kind: str, size: int, step: int) -> None:
    data = _payload(random.Random(size), size)
    blob = _compress(kind, data)
    if kind == "zlib":
        assert zlib.decompress(blob) == data
    else:
        assert zstandard.ZstdDecompressor().decompressobj().decompress(blob) == data
    dec = _decompressor(blob, kind)
    assert _read_all(dec, step) == data
    assert dec.produced == len(data)
    # the digest covers the payload after the 4-byte compile-time prefix, however it was read
    assert dec.hasher.hexdigest() == hashlib.sha256(data[4:]).hexdigest()
    assert dec.declared_size == (len(data) if kind == "zstd" else None)
    dec.check_complete()


@pytest.mark.parametrize("kind", ["zstd", "zlib"])
def test_every_cut_the_reference_refuses_is_refused(kind: str) -> None:
    """A file cut short: the reference decoder says the data is incomplete, and so do we."""
    data = _payload(random.Random(1), 5000)
    blob = _compress(kind, data)
    cuts = sorted({*random.Random(2).sample(range(1, len(blob)), 60), len(blob) - 1})
    for cut in cuts:
        if kind == "zlib":
            reference = zlib.decompressobj()
            reference.decompress(blob[:cut])
            assert not reference.eof
        else:
            with pytest.raises(zstandard.ZstdError):
                zstandard.ZstdDecompressor().decompress(blob[:cut])
        with pytest.raises(DecodeFailure) as info:
            dec = _decompressor(blob[:cut], kind)
            dec.drain()
            dec.check_complete()
        assert info.value.problem.kind in ("truncated", "decompress")
    whole = _decompressor(blob, kind)
    whole.drain()
    whole.check_complete()


def test_a_cut_at_a_block_boundary_is_caught_by_the_declared_size() -> None:
    """zstandard's stream reader returns what the complete blocks hold and no error: only the
    frame's declared content size shows that the last block is missing."""
    data = _payload(random.Random(3), 300_000)
    blob = _compress("zstd", data)
    cut = len(blob) - 3  # inside the last block's header: the earlier blocks decode cleanly
    for_sure = zstandard.ZstdDecompressor().decompressobj()
    delivered = for_sure.decompress(blob[:cut])
    assert not for_sure.eof and 0 < len(delivered) < len(data)
    dec = _decompressor(blob[:cut], "zstd")
    dec.drain()
    with pytest.raises(DecodeFailure) as info:
        dec.check_complete()
    problem = info.value.problem
    assert problem.kind == "truncated" and str(info.value) == problem.message
    assert problem.message == (
        f"zstd frame declares {len(data)} bytes but holds {dec.produced}"
        " (file cut short, or a forged size)"
    )


def test_a_frame_without_declared_size_is_not_called_truncated() -> None:
    data = _payload(random.Random(4), 1000)
    dec = _decompressor(_compress("zstd-unsized", data), "zstd")
    dec.drain()
    assert dec.declared_size is None and dec.produced == len(data)
    dec.check_complete()


@pytest.mark.parametrize("kind", ["zstd", "zstd-unsized", "zlib"])
def test_the_cap_is_inclusive(kind: str) -> None:
    data = _payload(random.Random(5), 4096)
    blob = _compress(kind, data)
    dec = _decompressor(blob, kind, cap=len(data))
    assert _read_all(dec, 1000) == data
    with pytest.raises(DecodeFailure) as info:
        _read_all(_decompressor(blob, kind, cap=len(data) - 1), 1000)
    problem = info.value.problem
    assert problem.kind == "too-large"
    if kind == "zstd":  # refused from the frame header, before any output
        assert problem.message == (
            f"zstd frame declares {len(data)} bytes, over the {len(data) - 1}-byte cap; not decoded"
        )
    else:
        assert problem.message == (
            f"decompresses to more than {len(data) - 1} bytes (the cap); not decoded"
        )


def _reference_refuses(kind: str, blob: bytes) -> bool:
    try:
        if kind == "zlib":
            zlib.decompress(blob)
        else:
            zstandard.ZstdDecompressor().decompress(blob)
    except (zstandard.ZstdError, zlib.error):
        return True
    return False


@pytest.mark.parametrize("kind", ["zstd", "zlib"])
def test_damaged_data_is_a_decompress_problem(kind: str) -> None:
    """Overwrite a few bytes in turn; each damage the reference decoder refuses, we refuse."""
    rng = random.Random(6)
    data = bytes(rng.choices(b"abc\n", k=20000))
    blob = _compress(kind, data)
    refused = 0
    for at in range(18, len(blob) - 8, max(1, len(blob) // 40)):  # after the frame header
        damaged = blob[:at] + b"\xff" * 8 + blob[at + 8 :]
        if not _reference_refuses(kind, damaged):
            continue
        refused += 1
        with pytest.raises(DecodeFailure) as info:
            dec = _decompressor(damaged, kind)
            dec.drain()
            dec.check_complete()
        problem = info.value.problem
        assert problem.kind in ("decompress", "truncated")
        if problem.kind == "decompress":
            assert problem.message.startswith(f"{kind} data is damaged: ")
    assert refused >= 5


def test_a_bad_zstd_frame_header() -> None:
    head = zstandard.ZstdCompressor().compress(b"x" * 100)[:4] + b"\xff" * 14
    with pytest.raises(zstandard.ZstdError) as reference:
        zstandard.get_frame_parameters(head)
    with pytest.raises(DecodeFailure) as info:
        _decompressor(head, "zstd")
    assert info.value.problem.kind == "decompress"
    assert info.value.problem.message == f"bad zstd frame header: {reference.value}"


def test_detect_compression_agrees_with_the_decoders() -> None:
    """Every two-byte head that zlib accepts as a stream header is called zlib; every
    compressed stream the codecs write is recognised; other bytes are not."""
    for level in range(-1, 10):
        assert detect_compression(zlib.compress(b"x", level)[:4]) == "zlib"
    assert detect_compression(zstandard.ZstdCompressor().compress(b"x")[:4]) == "zstd"
    for first in range(256):
        for second in range(256):
            head = bytes([first, second])
            try:
                zlib.decompressobj().decompress(head)
            except zlib.error:
                continue
            assert detect_compression(head) == "zlib", head.hex()
    assert detect_compression(b"") is None and detect_compression(b"\x78") is None
    assert detect_compression(b"\x78\x9d") is None  # (0x789d % 31) != 0: not a zlib header
    assert detect_compression(b"\x28\xb5\x2f") is None  # three of the four zstd magic bytes
    assert detect_compression(b"\x08\x00\x00\x00") is None  # the 4-byte compile-time prefix


def test_a_zstd_entry_without_zstandard_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX itself runs without zstandard (it then writes zlib): a zstd entry is then a finding."""
    from cachedoctor.cache import decompress

    monkeypatch.setattr(decompress, "zstandard", None)
    with pytest.raises(DecodeFailure) as info:
        _decompressor(_compress("zstd", b"x" * 10), "zstd")
    assert (info.value.problem.kind, info.value.problem.message) == (
        "unsupported",
        "a zstd entry, but the zstandard package is not installed",
    )
    dec = _decompressor(_compress("zlib", b"x" * 10), "zlib")
    assert _read_all(dec, -1) == b"x" * 10
