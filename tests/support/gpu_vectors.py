"""Test-only encoders that build GPU cache vectors from the documented layouts.

No real GPU entry can be produced here, so these write what XLA would write: protobuf wire
fields, a snappy encoder (literals and all three copy forms), and a Riegeli/records writer that
puts a 24-byte block header at every 64 KiB (also inside chunk headers) and pads chunks as the
format specification says. They are written from the specifications, independently of the
decoders under test, so a mistake in one is unlikely to be mirrored in the other.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from pathlib import Path

import zstandard

from cachedoctor.xla import gpu


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def f_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value & 0xFFFFFFFFFFFFFFFF)


def f_bytes(number: int, value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(raw)) + raw


def msg(*fields: bytes) -> bytes:
    return b"".join(fields)


# --- snappy ----------------------------------------------------------------------------------


def _literal(chunk: bytes) -> bytes:
    n = len(chunk) - 1
    if n < 60:
        return bytes([n << 2]) + chunk
    for extra in (1, 2, 3, 4):
        if n < 1 << (8 * extra):
            return bytes([(59 + extra) << 2]) + n.to_bytes(extra, "little") + chunk
    raise ValueError("literal too long")


def _copy(offset: int, length: int, force_wide: bool = False) -> bytes:
    out = b""
    while length > 0:
        n = min(length, 64)
        if length - n and length - n < 4:  # keep every piece >= 4 so the 1-byte form can serve
            n = length - 4
        if not force_wide and 4 <= n <= 11 and offset < 2048:
            out += bytes([1 | (n - 4) << 2 | (offset >> 8) << 5, offset & 0xFF])
        elif not force_wide and offset < 65536:
            out += bytes([2 | (n - 1) << 2]) + offset.to_bytes(2, "little")
        else:
            out += bytes([3 | (n - 1) << 2]) + offset.to_bytes(4, "little")
        length -= n
    return out


def snappy_compress(data: bytes, *, wide_copies: bool = False) -> bytes:
    """Greedy LZ77 over 4-byte hashes; correct, not fast or tight."""
    out = bytearray(varint(len(data)))
    table: dict[bytes, int] = {}
    i = lit_start = 0
    while i + 4 <= len(data):
        key = data[i : i + 4]
        cand = table.get(key)
        table[key] = i
        if cand is not None and i - cand < (1 << 31):
            n = 4
            while i + n < len(data) and data[cand + n] == data[i + n]:
                n += 1
            if lit_start < i:
                out += _literal_run(data[lit_start:i])
            out += _copy(i - cand, n, force_wide=wide_copies)
            i += n
            lit_start = i
        else:
            i += 1
    if lit_start < len(data):
        out += _literal_run(data[lit_start:])
    return bytes(out)


def _literal_run(chunk: bytes) -> bytes:
    return b"".join(_literal(chunk[k : k + 70000]) for k in range(0, len(chunk), 70000))


# --- Riegeli/records -------------------------------------------------------------------------

BLOCK = 1 << 16
BLOCK_HEADER = 24
SIGNATURE = bytes.fromhex(  # copied from the format specification, "File signature"
    "83af70d10d884a3f00000000000000004000000000000000"
    "91bac23c9287e1a9"
    "0000000000000000e19f13c0e9b1c3727300000000000000"
    "0000000000000000"
)


def simple_chunk_data(records: Sequence[bytes], compression: str = "none") -> bytes:
    sizes = b"".join(varint(len(r)) for r in records)
    values = b"".join(records)
    if compression == "none":
        return b"\x00" + varint(len(sizes)) + sizes + values
    if compression == "snappy":
        cs = varint(len(sizes)) + snappy_compress(sizes)
        cv = varint(len(values)) + snappy_compress(values)
        return b"s" + varint(len(cs)) + cs + cv
    if compression == "zstd":
        import zstandard

        z = zstandard.ZstdCompressor()
        cs = varint(len(sizes)) + z.compress(sizes)
        cv = varint(len(values)) + z.compress(values)
        return b"z" + varint(len(cs)) + cs + cv
    raise ValueError(compression)


class RiegeliWriter:
    """Writes chunks the way riegeli's DefaultChunkWriter lays them out."""

    def __init__(self) -> None:
        self.out = bytearray(SIGNATURE)
        self.chunk_offsets: list[int] = []

    def _layout_end(self, begin: int, length: int, min_end: int) -> int:
        """Walk the bytes as the writer would, to know the chunk's end before writing it."""
        pos, left = begin, length
        while left:
            if pos % BLOCK == 0:
                pos += BLOCK_HEADER
            step = min(left, BLOCK - pos % BLOCK)
            pos += step
            left -= step
        while pos < min_end:  # padding so the chunk spans at least num_records bytes
            if pos % BLOCK == 0:
                pos += BLOCK_HEADER
            pos += min(min_end - pos, BLOCK - pos % BLOCK)
        if pos % BLOCK == BLOCK_HEADER:  # a chunk may not end right after a block header
            pos += 1
        return pos

    def _emit(self, payload: bytes, begin: int, end: int) -> None:
        k = 0
        while k < len(payload) or len(self.out) < end:
            pos = len(self.out)
            if pos % BLOCK == 0:
                self.out += bytes(8) + (pos - begin).to_bytes(8, "little")
                self.out += (end - pos).to_bytes(8, "little")
                continue
            room = BLOCK - pos % BLOCK
            if k < len(payload):
                step = min(room, len(payload) - k)
                self.out += payload[k : k + step]
                k += step
            else:
                self.out += bytes(min(room, end - pos))

    def chunk(
        self,
        chunk_type: bytes,
        data: bytes,
        num_records: int,
        decoded_size: int,
        *,
        data_size: int | None = None,
    ) -> None:
        begin = len(self.out)
        header = (
            bytes(8)  # header_hash: not checked by the reader (HighwayHash)
            + (len(data) if data_size is None else data_size).to_bytes(8, "little")
            + bytes(8)  # data_hash
            + ((num_records << 8) | chunk_type[0]).to_bytes(8, "little")
            + decoded_size.to_bytes(8, "little")
        )
        end = self._layout_end(begin, len(header) + len(data), begin + num_records)
        self.chunk_offsets.append(begin)
        self._emit(header + data, begin, end)

    def records(self, records: Sequence[bytes], compression: str = "none") -> None:
        data = simple_chunk_data(records, compression)
        self.chunk(b"r", data, len(records), sum(len(r) for r in records))

    def padding_to(self, target: int) -> None:
        """A padding chunk, so that the next chunk begins near ``target`` (for boundary tests)."""
        begin = len(self.out)
        overhead = 0
        pos = begin
        # solve for a data size whose chunk ends at target
        for size in range(max(0, target - begin - 40 - 2 * BLOCK_HEADER), target - begin):
            pos = self._layout_end(begin, 40 + size, begin)
            if pos >= target:
                overhead = size
                break
        self.chunk(b"p", bytes(overhead), 0, 0)

    def getvalue(self) -> bytes:
        return bytes(self.out)


def riegeli_file(
    records: Sequence[bytes], compression: str = "snappy", per_chunk: int = 0
) -> bytes:
    w = RiegeliWriter()
    step = per_chunk or max(1, len(records))
    for k in range(0, len(records), step):
        w.records(records[k : k + step], compression)
    return w.getvalue()


# --- split protos (xla/util/split_proto) -----------------------------------------------------


def manifest(result_type: str, kinds: Sequence[object]) -> bytes:
    """kinds: "merge", an int field number (string override), or a raw Record message."""
    parts = [f_bytes(1, result_type)]
    for kind in kinds:
        if kind == "merge":
            rec = f_bytes(2, b"")
        elif isinstance(kind, int):
            rec = f_bytes(3, f_bytes(1, f_varint(1, kind)) + f_varint(2, 1))
        else:
            assert isinstance(kind, bytes)
            rec = kind
        parts.append(f_bytes(2, rec))
    return b"".join(parts)


HLO = (
    f_bytes(1, "jit_matmul")
    + f_bytes(2, "main.7")
    + f_bytes(3, f_bytes(1, "main.7") + f_bytes(2, f_bytes(1, "dot.3") + f_bytes(2, "dot")))
    + f_varint(5, 42)
    + f_varint(6, 7)
)


CONFIG = f_varint(4, 1) + f_varint(5, 2)


WITH_CONFIG = f_bytes(1, HLO) + f_bytes(2, CONFIG)


BUFFERS = f_bytes(3, f_varint(1, 0) + f_varint(2, 4096))


PTX = b"//\n// Generated by LLVM NVPTX Back-End\n.version 8.4\n.target sm_90a\n" * 30


CUBIN = b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 20


DNN = [f_bytes(5, f_bytes(1, f"cudnn$fusion{i}") + f_bytes(2, b'{"nodes": []}')) for i in range(2)]


CC_H100 = f_bytes(6, f_bytes(1, f_varint(1, 9)))  # minor 0 is omitted by proto3


THUNKS = [f_bytes(13, f_bytes(1, f_varint(1, i))) for i in range(5)]


def gpu_entry_file(tmp_path: Path, payload: bytes, header: bool, name: str) -> Path:
    if header:
        meta = f_varint(1, 3) + f_bytes(2, "pjrt_ifrt") + f_bytes(7, "jit_g")
        payload = _varint(len(meta)) + meta + payload
    path = tmp_path / f"jit_g-{name * 64}-cache"
    path.write_bytes(zstandard.ZstdCompressor().compress((7).to_bytes(4, "big") + payload))
    return path


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def gpu_compile_options(cache: Path) -> bytes:
    return f_bytes(3, f_bytes(3, f_bytes(310, f"{cache}/xla_gpu_per_fusion_autotune_cache_dir")))


def plain_gpu_entry(cache: Path, real_hlo_with_config: bytes) -> Path:
    """A legacy-layout GPU entry (PTX, cubin, cuDNN graphs) written into ``cache``."""
    executable = f_bytes(1, real_hlo_with_config) + f_bytes(2, BUFFERS) + f_bytes(3, PTX)
    executable += f_bytes(4, CUBIN) + b"".join(DNN) + CC_H100
    payload = f_bytes(1, executable) + f_bytes(2, gpu_compile_options(cache))
    payload += f_bytes(3, gpu.GPU_CLIENT_NAME)
    return gpu_entry_file(cache, payload, header=False, name="a")


MODEL = (
    "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 3352 GB/s, "
    "L2 cache: 50 MB, DNN version: 9.8.0"
)


TRITON = """run_time {
  nanos: 31744
}
triton {
  block_m: 32
  block_n: 32
  block_k: 32
  split_k: 1
  num_stages: 1
  num_warps: 4
  num_ctas: 1
}
"""


GEMM = """scratch_bytes: 4194304
run_time {
  nanos: 8192
}
gemm {
  algorithm: -1
}
"""


def file_name(key: str) -> str:
    """As GetBase64EncodedSha256Hash + ".textproto" (tsl Base64Encode: url-safe, unpadded)."""
    digest = hashlib.sha256(key.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode() + ".textproto"


def key(hlo: str) -> str:
    return f"<key model='{MODEL}', hlo='{hlo}', version=1>"
