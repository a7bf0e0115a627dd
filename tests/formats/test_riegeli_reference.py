"""The Riegeli reader on files written by the reference C++ library (google/riegeli, through the
``array-record`` package's writer), not by our own test encoder.

ArrayRecord files are Riegeli/records files: the signature, one simple chunk per group of
``group_size`` records, then a footer chunk (record 0: metadata; then one
``ArrayRecordFooter {1 chunk_offset, 2 decoded_data_size, 3 num_records}`` per data chunk) and a
postscript chunk whose records say ``{1 footer_offset}``. The footer is the writer's own account
of where it put each chunk, so it checks our chunk layout (block headers, ``ChunkEnd``, padding)
independently of our formulas; ``ArrayRecordReader`` is the oracle for the records themselves.
"""

from __future__ import annotations

import platform
import random
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachedoctor.cache import reader
from cachedoctor.cache.model import EntryInfo
from cachedoctor.formats import riegeli, splitproto
from cachedoctor.formats.errors import UnsupportedFormat
from cachedoctor.formats.wire import fields_by_number
from cachedoctor.xla import gpu
from tests.support.gpu_vectors import (
    BUFFERS,
    CC_H100,
    CUBIN,
    DNN,
    PTX,
    THUNKS,
    f_bytes,
    gpu_compile_options,
    gpu_entry_file,
    manifest,
)

if not (sys.platform == "linux" or (sys.platform == "darwin" and platform.machine() == "arm64")):
    pytest.skip(
        "array-record (the reference writer) publishes wheels only for Linux and macOS arm64",
        allow_module_level=True,
    )

from array_record.python.array_record_module import (
    ArrayRecordReader,
    ArrayRecordWriter,
)

BLOCK = riegeli.BLOCK_SIZE
COMPRESSIONS = {"uncompressed": "none", "snappy": "snappy", "zstd:3": "zstd"}


def write(path: Path, records: list[bytes], options: str) -> bytes:
    writer = ArrayRecordWriter(str(path), options)
    for record in records:
        writer.write(record)
    writer.close()
    return path.read_bytes()


def reference_records(path: Path) -> list[bytes]:
    reader = ArrayRecordReader(str(path))
    try:
        return list(reader.read_all()) if reader.num_records() else []
    finally:
        reader.close()


def _int(fields: Mapping[int, Sequence[object]], number: int) -> int:
    value = fields.get(number, [0])[-1]
    assert isinstance(value, int)
    return value


def riegeli_records_file(path: Path, records: list[bytes], options: str) -> bytes:
    """What Riegeli's own RecordWriter writes (no ArrayRecord footer): the file cut before the
    footer chunk, a chunk boundary, where a Riegeli file may end."""
    data = write(path, records, options)
    footer_offset = _int(fields_by_number(riegeli.read_records(data).records[-1]), 1)
    return data[:footer_offset]


def check_against_the_writer(data: bytes, records: list[bytes], compression: str) -> None:
    """Our records and chunk layout agree with what the reference writer says it wrote."""
    f = riegeli.read_records(data)
    simple = [c for c in f.chunks if c.chunk_type == "r"]
    postscript = simple[-1]
    footer_offset = _int(fields_by_number(f.records[-1]), 1)
    footer = next(c for c in simple if c.offset == footer_offset)
    data_chunks = simple[: simple.index(footer)]
    # The footer chunk: one metadata record, then one record per data chunk.
    first_footer_record = sum(c.num_records for c in data_chunks)
    footer_records = f.records[first_footer_record + 1 : first_footer_record + footer.num_records]
    assert len(footer_records) == len(data_chunks)
    for chunk, raw in zip(data_chunks, footer_records, strict=True):
        said = fields_by_number(raw)
        assert (chunk.offset, chunk.decoded_data_size, chunk.num_records) == (
            _int(said, 1),
            _int(said, 2),
            _int(said, 3),
        )
        assert chunk.compression == compression
    assert postscript.offset > footer.offset
    assert list(f.records[:first_footer_record]) == records


@pytest.mark.parametrize("options", list(COMPRESSIONS))
def test_small_records(tmp_path: Path, options: str) -> None:
    records = [b"", b"manifest", b"\x00" * 10, bytes(range(256))]
    data = write(tmp_path / "f", records, f"group_size:3,{options}")
    assert reference_records(tmp_path / "f") == records
    check_against_the_writer(data, records, COMPRESSIONS[options])


@pytest.mark.parametrize("options", list(COMPRESSIONS))
def test_large_records_span_several_blocks(tmp_path: Path, options: str) -> None:
    rng = random.Random(7)
    records = [rng.randbytes(3 * BLOCK + 999), b"ptx " * 300_000, b"", rng.randbytes(5)]
    data = write(tmp_path / "f", records, f"group_size:2,{options}")
    f = riegeli.read_records(data)
    assert any(c.offset // BLOCK < (c.offset + 40 + c.data_size) // BLOCK for c in f.chunks)
    check_against_the_writer(data, records, COMPRESSIONS[options])


@pytest.mark.parametrize("options", list(COMPRESSIONS))
def test_many_records(tmp_path: Path, options: str) -> None:
    rng = random.Random(11)
    records = [rng.randbytes(rng.randrange(40)) + b"x" * rng.randrange(200) for _ in range(5000)]
    data = write(tmp_path / "f", records, f"group_size:37,{options}")
    assert len(data) > 2 * BLOCK  # so chunks meet block headers
    check_against_the_writer(data, records, COMPRESSIONS[options])


@pytest.mark.parametrize("options", ["snappy", "zstd:3"])
def test_chunk_of_more_records_than_bytes_is_padded(tmp_path: Path, options: str) -> None:
    # 5000 empty records compress to a few dozen bytes; a chunk must still span at least as many
    # bytes as it has records, so the writer pads it and the next chunk begins after the padding.
    records = [b""] * 5000 + [b"after"]
    data = write(tmp_path / "f", records, f"group_size:5000,{options}")
    f = riegeli.read_records(data)
    first, second = f.chunks[0], f.chunks[1]
    assert 40 + first.data_size < first.num_records <= second.offset - first.offset
    check_against_the_writer(data, records, COMPRESSIONS[options])


@pytest.mark.parametrize("lead", [0, 1, 8, 23, 24, 25, 39, 40])
def test_chunk_header_cut_by_a_block_header(tmp_path: Path, lead: int) -> None:
    # An uncompressed chunk of one record of length n holds 40 + 1 + 1 + 3 + n bytes (compression
    # byte, sizes-length varint, a 3-byte size varint), so the second chunk starts `lead` bytes
    # before the first block boundary.
    n = BLOCK - lead - 64 - 45
    records = [b"a" * n, b"second", b"third"]
    data = write(tmp_path / "f", records, "group_size:1,uncompressed")
    f = riegeli.read_records(data)
    assert f.chunks[1].offset == BLOCK - lead
    check_against_the_writer(data, records, "none")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 3 * BLOCK), max_size=12),
    group_size=st.integers(1, 5),
    options=st.sampled_from(list(COMPRESSIONS)),
    seed=st.integers(0, 2**32 - 1),
    pad=st.booleans(),
)
def test_any_records_any_layout(
    sizes: list[int], group_size: int, options: str, seed: int, pad: bool
) -> None:
    rng = random.Random(seed)
    # Half random bytes, half repetitive text, so the compressors take both paths.
    records = [rng.randbytes(n // 2) + b"fusion.%d " % n * (n // 20) for n in sizes]
    with tempfile.TemporaryDirectory() as tmp:
        data = write(
            Path(tmp) / "f",
            records,
            f"group_size:{group_size},{options},pad_to_block_boundary:{str(pad).lower()}",
        )
    check_against_the_writer(data, records, COMPRESSIONS[options])


def test_split_proto_whose_first_chunk_is_large(tmp_path: Path) -> None:
    # A manifest and a big override record in one chunk, as Riegeli's chunking may leave them.
    executable = b"\x0a\x03abc" * 400_000
    records = [manifest("xla.ExecutableAndOptionsProto", [1, "merge"]), executable, b""]
    data = write(tmp_path / "f", records, "group_size:2,snappy")
    assert riegeli.read_records(data).chunks[0].decoded_data_size > 1 << 20
    assert splitproto.is_split_proto(data)
    # The footer records of the ArrayRecord file follow: reassemble only the split proto's own.
    sp = splitproto.reassemble(riegeli.read_records(data).records[:3])
    assert bytes(fields_by_number(sp.message)[1][-1]) == executable


def test_brotli_chunks_are_refused_clearly(tmp_path: Path) -> None:
    data = write(tmp_path / "f", [b"abc" * 100], "group_size:1,brotli:6")
    with pytest.raises(UnsupportedFormat, match="brotli compression is not supported"):
        riegeli.read_records(data)
    assert not splitproto.is_split_proto(data)


@pytest.mark.parametrize("options", ["uncompressed", "snappy", "zstd:3"])
def test_transposed_chunks_are_refused_clearly(tmp_path: Path, options: str) -> None:
    # XLA never transposes (its writer options set only snappy); a transposed file is refused at
    # its first chunk, with the offset, rather than misread.
    records = [manifest("xla.ExecutableAndOptionsProto", ["merge"]), b"\x1a\x03abc"]
    data = write(tmp_path / "f", records, f"group_size:2,{options},transpose:true")
    chunk_type = data[64 + 24]
    assert chunk_type == ord("t")
    with pytest.raises(UnsupportedFormat, match=r"transposed .* \(at byte 64\)"):
        riegeli.read_records(data)
    assert not splitproto.is_split_proto(data)


@pytest.mark.slow
@pytest.mark.parametrize("options", ["snappy", "uncompressed", "zstd:3"])
def test_gpu_entry_from_the_reference_writer_through_the_reader(
    tmp_path: Path,
    real_hlo_with_config: bytes,
    options: str,
) -> None:
    """The jax >= 0.10.1 layout (payload and executable both split protos), with every Riegeli
    byte from the reference writer; XLA's own writer uses snappy."""
    rest = f_bytes(1, real_hlo_with_config) + f_bytes(2, BUFFERS) + CC_H100 + b"".join(THUNKS)
    executable = riegeli_records_file(
        tmp_path / "executable",
        [manifest(gpu.GPU_EXECUTABLE, [3, 4, "merge", "merge"]), PTX, CUBIN, b"".join(DNN), rest],
        f"group_size:2,{options}",
    )
    tail = f_bytes(2, gpu_compile_options(tmp_path)) + f_bytes(3, gpu.GPU_CLIENT_NAME)
    payload = riegeli_records_file(
        tmp_path / "payload",
        [manifest(gpu.EXECUTABLE_AND_OPTIONS, [1, "merge"]), executable, tail],
        f"group_size:1,{options}",
    )
    assert splitproto.is_split_proto(payload) and splitproto.is_split_proto(executable)
    info = reader.decode_entry(gpu_entry_file(tmp_path, payload, header=True, name="r"))
    assert isinstance(info, EntryInfo)
    assert info.ok, info.problems
    assert info.platform == "gpu" and info.format_label == "ifrt-v3+split"
    assert info.gpu is not None and info.gpu.executable_split and info.gpu.payload_split
    assert (info.gpu.layout, info.gpu.thunks) == ("gpu_executable_thunks", len(THUNKS))
    assert (info.gpu.ptx_size, info.gpu.cubin_size, info.gpu.compute_capability) == (
        len(PTX),
        len(CUBIN),
        "9.0",
    )
    assert info.hlo is not None and info.hlo.name == "jit_g"
