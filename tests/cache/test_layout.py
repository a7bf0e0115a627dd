"""The payload layout is decided from evidence, never from one byte (issue 17, item 1).

Real entries (written by JAX) are re-encoded with ``pjrt_ifrt`` headers of every length, with
and without a header, zstd and zlib; every variant must decode to the same summary. JAX itself
is asked to load a sample of the re-encoded entries, so the variants are entries JAX accepts.
The reverse: every entry ``scan`` calls corrupt is refused by JAX's own deserialization.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.cache.reader import decode_entry
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.formats import wire
from cachedoctor.storage.location import Location

# Loads each entry file named in argv through JAX's own path (compilation_cache's decompress and
# extract, then backend.deserialize_executable) and prints one JSON verdict per file.
_JAX_LOADER = r"""
import json, sys
from jax._src import compilation_cache as cc, xla_bridge
from jax._src.lib import xla_client
backend = xla_bridge.get_backend("cpu")
devices = xla_client.DeviceList(tuple(backend.devices()[:1]))
for path in sys.argv[1:]:
    try:
        data = open(path, "rb").read()
        payload, _ = cc.extract_executable_and_time(cc.decompress_executable(data))
        backend.deserialize_executable(payload, devices, None)
        print(json.dumps([path, True]))
    except Exception as exc:
        print(json.dumps([path, False]))
"""


def jax_loads(paths: list[Path]) -> dict[str, bool]:
    """Which of ``paths`` JAX deserializes, asked in a fresh interpreter on CPU."""
    proc = subprocess.run(
        [sys.executable, "-c", _JAX_LOADER, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
        timeout=600,
    )
    return dict(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))


@dataclass(frozen=True)
class RealEntry:
    """A real entry taken apart: compile time, the ExecutableAndOptionsProto, its summary."""

    name: str
    compile_prefix: bytes
    executable_and_options: bytes
    summary: tuple[object, ...]
    had_header: bool  # this JAX writes (and then requires) a pjrt_ifrt header


def summary_of(info: EntryInfo) -> tuple[object, ...]:
    return (
        info.module,
        info.platform,
        info.compile_time_s,
        info.hlo,
        info.program_digest,
        info.sections,
        info.num_partitions,
        info.problems,
    )


@pytest.fixture(scope="module")
def real_entries(cache_factory: Callable[..., Path]) -> list[RealEntry]:
    cache = cache_factory("layout-plain", [("plain", {}), ("seed", {})])
    out = []
    for path in sorted(cache.glob("*-cache")):
        detail = decode_entry(path, detail=True)
        assert isinstance(detail, EntryDetail) and not detail.info.problems
        raw = path.read_bytes()
        plain = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 30)
        header_len = 0
        if detail.ifrt_header is not None:  # jax >= 0.9.1: strip the real header
            header_len = len(wire.encode_varint(len(detail.ifrt_header))) + len(detail.ifrt_header)
        body = plain[4 + header_len :]
        out.append(RealEntry(path.name, plain[:4], body, summary_of(detail.info), header_len > 0))
    assert len(out) >= 3
    return out


def header_of_length(length: int, name: bytes = b"jit_g") -> bytes:
    """A ``SerializedXlaExecutableMetadata`` of exactly ``length`` bytes (length >= 2).

    Field 1 (version 3), then field 2 (``pjrt_ifrt``) and the computation name when they fit,
    padded through field 7 (computation_name) and a one-byte field 8 (portable). A length no
    such combination reaches (3: every field takes two bytes at least) writes the version as a
    two-byte varint (a larger version number: the decoder must not care which).
    """
    runtime = wire.encode_field(2, wire.LEN, b"pjrt_ifrt")
    for version in (3, 131):
        for with_runtime in (True, False):
            base = wire.encode_field(1, wire.VARINT, version)
            if with_runtime:
                base += runtime
            for portable in (b"", wire.encode_field(8, wire.VARINT, 0)):
                room = length - len(base) - len(portable)
                if room == 0:
                    return base + portable
                for size in range(max(0, room - 4), room):
                    pad = wire.encode_field(7, wire.LEN, (name * (size // len(name) + 1))[:size])
                    if len(pad) == room:
                        return base + portable + pad
    raise AssertionError(f"no header of {length} bytes")


def test_headers_of_every_length_can_be_built() -> None:
    """The generator reaches every length the property test draws (3 and 14 once failed)."""
    assert all(len(header_of_length(n)) == n for n in range(2, 4097))


def entry_bytes(entry: RealEntry, header: bytes | None, compression: str) -> bytes:
    payload = entry.executable_and_options
    if header is not None:
        payload = wire.encode_varint(len(header)) + header + payload
    plain = entry.compile_prefix + payload
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(plain)
    return zlib.compress(plain)


@pytest.mark.slow
@pytest.mark.parametrize("length", [2, 10, 127, 128, 131, 259, 387, 16387])
def test_header_lengths_that_look_like_other_layouts(
    real_entries: list[RealEntry], tmp_path: Path, length: int
) -> None:
    """10 (``0a``, a bare proto's first byte) and 128n+3 (``83 0n``, Riegeli's) decode right."""
    for entry in real_entries:
        header = header_of_length(length)
        assert len(header) == length
        path = tmp_path / entry.name
        path.write_bytes(entry_bytes(entry, header, "zstd"))
        info = decode_entry(path)
        assert isinstance(info, EntryInfo)
        assert summary_of(info) == entry.summary, (length, info.problems)
        assert info.payload_format == "ifrt"


@pytest.mark.slow
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    length=st.one_of(st.none(), st.integers(min_value=2, max_value=4096)),
    compression=st.sampled_from(["zstd", "zlib"]),
    which=st.integers(min_value=0),
)
@example(length=131, compression="zlib", which=0)
@example(length=3, compression="zstd", which=0)
@example(length=14, compression="zstd", which=1)
@example(length=None, compression="zlib", which=0)
def test_any_header_decodes_to_the_same_summary(
    real_entries: list[RealEntry],
    tmp_path: Path,
    length: int | None,
    compression: str,
    which: int,
) -> None:
    entry = real_entries[which % len(real_entries)]
    header = None if length is None else header_of_length(length)
    path = tmp_path / entry.name
    path.write_bytes(entry_bytes(entry, header, compression))
    info = decode_entry(path)
    assert isinstance(info, EntryInfo)
    assert summary_of(info) == entry.summary, (length, compression, info.problems)
    assert info.compression == compression
    assert info.payload_format == ("pjrt" if header is None else "ifrt")


@pytest.mark.slow
def test_jax_loads_the_reencoded_entries(real_entries: list[RealEntry], tmp_path: Path) -> None:
    """The variants above are entries JAX accepts: the test's premise, checked by JAX."""
    paths = []
    lengths = (10, 131, 259, 1000) if real_entries[0].had_header else (None,)
    for length in lengths:
        for entry in real_entries[:2]:
            header = None if length is None else header_of_length(length, entry.name.encode())
            path = tmp_path / f"{length}-{entry.name}"
            path.write_bytes(entry_bytes(entry, header, "zstd"))  # what this JAX decompresses
            paths.append(path)
    loaded = jax_loads(paths)
    assert loaded == {str(p): True for p in paths}


def _damaged(entry: RealEntry, how: str) -> bytes:
    header = header_of_length(131)
    good = entry.compile_prefix + wire.encode_varint(len(header)) + header
    good += entry.executable_and_options
    if how == "truncated":
        return zstandard.ZstdCompressor().compress(good[: len(good) * 2 // 3])
    if how == "header-lies":  # the varint claims more header than there is
        lying = entry.compile_prefix + b"\xff\xff\x03" + good[7:]
        return zstandard.ZstdCompressor().compress(lying)
    if how == "garbage-payload":
        return zstandard.ZstdCompressor().compress(entry.compile_prefix + bytes(range(7, 250)))
    if how == "cut-file":
        return zstandard.ZstdCompressor().compress(good)[:-40]
    if how == "no-executable":
        return zstandard.ZstdCompressor().compress(entry.compile_prefix)
    raise AssertionError(how)


@pytest.mark.slow
def test_every_entry_scan_calls_corrupt_is_refused_by_jax(
    real_entries: list[RealEntry], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    kinds = ["truncated", "header-lies", "garbage-payload", "cut-file", "no-executable"]
    for i, how in enumerate(kinds):
        entry = real_entries[i % len(real_entries)]
        module, digest = entry.name.rsplit("-", 2)[:2]
        (cache / f"{module}-{digest[:-2]}{i:02d}-cache").write_bytes(_damaged(entry, how))
    for entry in real_entries[:2]:  # and good entries with awkward headers, which JAX loads
        header = header_of_length(131) if entry.had_header else None
        (cache / entry.name).write_bytes(entry_bytes(entry, header, "zstd"))
    report = scan_directory(Location.parse(str(cache)), use_index=False)
    corrupt = {f"{key}-cache" for f in report.findings if f.kind == "corrupt" for key in f.entries}
    assert len(corrupt) == len(kinds)
    loaded = jax_loads(sorted(cache.glob("*-cache")))
    for path, ok in loaded.items():
        assert ok == (Path(path).name not in corrupt), path
