"""The reader on real caches written by the installed JAX, and on damaged bytes."""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from cachedoctor import layout
from cachedoctor.cache import decompress, listdir, reader
from cachedoctor.cache.listdir import FileKind
from cachedoctor.cache.model import EntryDetail, EntryInfo
from tests.support.caches import raw_payload_layout


def _entries(cache: Path) -> list[EntryInfo]:
    return list(reader.iter_entries(listdir.list_cache(cache)))


@pytest.mark.slow
def test_listing_classifies_every_file(seed_cache: Path, tmp_path: Path) -> None:
    listing = listdir.list_cache(seed_cache)
    kinds = {i.kind for i in listing.items}
    assert FileKind.ENTRY in kinds
    assert {i.key for i in listing.entries} == {
        i.name.removesuffix("-cache") for i in listing.items if i.name.endswith("-cache")
    }
    assert all(i.key and i.key.split("-")[-1].__len__() == 64 for i in listing.entries)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("jit_f-" + "a" * 64 + "-cache", FileKind.ENTRY),
        ("jit_f-" + "a" * 64 + "-atime", FileKind.ATIME),
        ("a" * 64 + "-cache", FileKind.ENTRY),
        ("jit_f-" + "a" * 64, FileKind.ENTRY),  # jax <= 0.4.29 wrote no suffix
        (".lockfile", FileKind.LOCKFILE),
        ("_temp_jit_f-" + "a" * 63, FileKind.TEMP),
        ("xla_gpu_kernel_cache_file", FileKind.KERNEL_SUBCACHE),
        ("cachedoctor-manifests", FileKind.CACHEDOCTOR),
        ("notes.txt", FileKind.UNKNOWN),
        ("jit_f-" + "A" * 64 + "-cache", FileKind.UNKNOWN),
    ],
)
def test_classify(name: str, kind: FileKind) -> None:
    assert listdir.classify(name, is_dir=False)[0] is kind


_HEX = "0123456789abcdef"
_NAMES = st.builds(
    lambda prefix, module, digest, suffix: prefix + module + digest + suffix,
    st.sampled_from(
        [
            "",
            "cachedoctor",
            ".cachedoctor-",
            "xla_gpu_kernel_cache_file",
            "tmp.",
            "tmp_",
            "tmpx",
            "_temp_",
            "-",
            "\n",
        ]
    ),
    st.text(alphabet="jit_f-.\nA", max_size=6),
    st.one_of(
        st.sampled_from(
            ["-" + "a" * 64, "-" + "0f" * 32, "a" * 64, "-" + "a" * 63, "-" + "a" * 65]
        ),
        st.text(alphabet=_HEX + "A-", min_size=62, max_size=66),
    ),
    st.sampled_from(["-cache", "-atime", "", ".tmp", "-cache\n", "cache", "-atime-cache"]),
)


@settings(max_examples=600, deadline=None)
@given(name=_NAMES, is_dir=st.booleans())
def test_classify_agrees_with_its_rules(name: str, is_dir: bool) -> None:
    """The one-match fast path gives what the rules give, for names near the entry shape."""
    assert listdir.classify(name, is_dir) == listdir.classify_by_rules(name, is_dir)


@pytest.mark.parametrize(
    "name",
    [
        "jit_f-" + "a" * 64 + "-cache",
        "cachedoctor-" + "a" * 64 + "-cache",
        ".cachedoctor-x-" + "a" * 64 + "-atime",
        "xla_gpu_kernel_cache_file-" + "a" * 64 + "-cache",
        "tmp.jit_f-" + "a" * 64 + "-cache",
        "_temp_jit-" + "a" * 64 + "-atime",
        "jit\nf-" + "a" * 64 + "-cache",
        "-" + "a" * 64 + "-cache",
    ],
)
def test_classify_agrees_on_edges(name: str) -> None:
    for is_dir in (False, True):
        assert listdir.classify(name, is_dir) == listdir.classify_by_rules(name, is_dir)


def test_autotune_dir_is_a_subcache() -> None:
    assert listdir.classify(layout.AUTOTUNE_DIR, is_dir=True)[0] is FileKind.AUTOTUNE_SUBCACHE


@pytest.mark.slow
def test_decodes_real_entries(seed_cache: Path) -> None:
    entries = _entries(seed_cache)
    assert entries and all(e.ok for e in entries), [e.problems for e in entries]
    f_entries = [e for e in entries if e.module == "jit_f"]
    assert len(f_entries) == 3
    for e in f_entries:
        assert e.compression == "zstd"
        assert e.platform == "cpu"
        assert e.num_partitions == 8
        assert e.hlo is not None and e.hlo.name == "jit_f"
        assert e.hlo.instructions > 0
        assert e.autotune_dir == os.path.join(str(seed_cache), layout.AUTOTUNE_DIR)
        assert e.decompressed_size and e.decompressed_size > e.size
    # the seed symptom: one program, three keys
    assert len({e.key for e in f_entries}) == 3
    assert len({e.program_digest for e in f_entries}) == 1
    g = next(e for e in entries if e.module == "jit_g")
    assert g.hlo is not None and g.hlo.parameters == ("f32[16]{0}",)
    assert g.program_digest != f_entries[0].program_digest


@pytest.mark.slow
def test_payload_layout_is_read_from_the_bytes(seed_cache: Path) -> None:
    """The layout label (and the IFRT version in it) is what the raw bytes say."""
    entries = _entries(seed_cache)
    assert entries
    for e in entries:
        assert e.format_label == raw_payload_layout(Path(e.path)), e.path
        assert (e.ifrt_version is None) == (e.payload_format == "pjrt")


@pytest.mark.slow
def test_detail_and_extract_agree(seed_cache: Path, tmp_path: Path) -> None:
    item = next(i for i in listdir.list_cache(seed_cache).entries)
    path = seed_cache / item.name
    detail = reader.decode_entry(path, detail=True)
    assert isinstance(detail, EntryDetail)
    assert detail.hlo_module and detail.compile_options
    out = tmp_path / "payload.bin"
    with out.open("wb") as fh:
        written = reader.extract_payload(path, fh)
    raw = zstandard.ZstdDecompressor().decompress(path.read_bytes())
    assert out.read_bytes() == raw[4:]
    assert written == len(raw) - 4
    assert detail.info.compile_time_s == int.from_bytes(raw[:4], "big")


@pytest.mark.slow
def test_zlib_entries_decode_like_zstd(seed_cache: Path, tmp_path: Path) -> None:
    """JAX falls back to zlib without zstandard: same content, other compression."""
    item = next(i for i in listdir.list_cache(seed_cache).entries if i.name.startswith("jit_g"))
    raw = zstandard.ZstdDecompressor().decompress((seed_cache / item.name).read_bytes())
    zpath = tmp_path / item.name
    zpath.write_bytes(zlib.compress(raw))
    a = reader.decode_entry(seed_cache / item.name)
    b = reader.decode_entry(zpath)
    assert isinstance(a, EntryInfo) and isinstance(b, EntryInfo)
    assert b.ok and b.compression == "zlib"
    assert (a.executable_digest, a.program_digest, a.hlo) == (
        b.executable_digest,
        b.program_digest,
        b.hlo,
    )


def _real_payload(seed_cache: Path) -> bytes:
    item = next(i for i in listdir.list_cache(seed_cache).entries if i.name.startswith("jit_g"))
    return zstandard.ZstdDecompressor().decompress((seed_cache / item.name).read_bytes())


def _huge_frame() -> bytes:
    """A valid zstd frame header that declares 2**60 bytes, followed by a tiny raw block."""
    magic = decompress.ZSTD_MAGIC
    fhd = bytes([0b11000000 | 0b00100000])  # 8-byte content size, single segment
    size = (1 << 60).to_bytes(8, "little")
    block = bytes([0x01 | (4 << 3), 0, 0]) + b"abcd"  # last raw block of 4 bytes
    return magic + fhd + size + block


CORRUPT_CASES: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda payload: b"",
    "random": lambda payload: random.Random(1).randbytes(4096),
    "truncated-zstd": lambda payload: zstandard.ZstdCompressor().compress(payload)[:-40],
    "zstd-of-garbage": lambda payload: zstandard.ZstdCompressor().compress(
        random.Random(2).randbytes(5000)
    ),
    "huge-claimed-size": lambda payload: _huge_frame(),
    "runaway-length": lambda payload: zstandard.ZstdCompressor().compress(
        b"\0\0\0\0" + b"\x0a\xff\xff\xff\xff\x0f" + b"x" * 100
    ),
    "truncated-zlib": lambda payload: zlib.compress(payload)[:-30],
    "only-time-prefix": lambda payload: zstandard.ZstdCompressor().compress(payload[:4]),
    "cut-after-header": lambda payload: zstandard.ZstdCompressor().compress(payload[:60]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CORRUPT_CASES))
def test_corrupt_inputs_become_problems(case: str, seed_cache: Path, tmp_path: Path) -> None:
    data = CORRUPT_CASES[case](_real_payload(seed_cache))
    path = tmp_path / ("jit_bad-" + "0" * 64 + "-cache")
    path.write_bytes(data)
    info = reader.decode_entry(path)
    assert isinstance(info, EntryInfo)
    assert not info.ok, f"{case} decoded as fine"
    assert info.problems[0].message
    assert info.program_digest is None and info.executable_digest is None


@pytest.mark.slow
def test_decompression_cap_is_stated(seed_cache: Path, tmp_path: Path) -> None:
    path = tmp_path / ("jit_big-" + "1" * 64 + "-cache")
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\0" * (1 << 20)))
    info = reader.decode_entry(path, max_decompressed=1 << 16)
    assert isinstance(info, EntryInfo)
    assert info.problems[0].kind == "too-large"
    assert str(1 << 16) in info.problems[0].message


@pytest.mark.slow
def test_symlinked_entry_is_not_followed(seed_cache: Path, tmp_path: Path) -> None:
    target = tmp_path / "outside"
    target.write_bytes(b"secret")
    link = tmp_path / ("jit_l-" + "2" * 64 + "-cache")
    link.symlink_to(target)
    info = reader.decode_entry(link)
    assert isinstance(info, EntryInfo)
    assert info.problems[0].kind == "symlink"


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_entry(seed_cache: Path, tmp_path: Path) -> None:
    path = tmp_path / ("jit_u-" + "3" * 64 + "-cache")
    path.write_bytes(b"x")
    path.chmod(0)
    info = reader.decode_entry(path)
    assert isinstance(info, EntryInfo) and info.problems[0].kind == "unreadable"


def test_atime_file_format(tmp_path: Path) -> None:
    p = tmp_path / "k-atime"
    p.write_bytes((1234567890123).to_bytes(8, "little"))
    assert listdir.read_atime(p) == 1234567890123
    p.write_bytes(b"short")
    assert listdir.read_atime(p) is None


def _elf_head(machine: int) -> bytes:
    return b"\x7fELF" + bytes(14) + machine.to_bytes(2, "little") + bytes(44)


@pytest.mark.parametrize(
    ("small", "sections", "platform"),
    [
        ([(7, b"name"), (8, memoryview(b"\x0a\x03obj")), (4, _elf_head(190))], [], "gpu"),
        ([(7, b"name"), (4, _elf_head(62))], [], "cpu"),  # x86-64 object code
        ([(3, b"  // Generated by NVIDIA NVVM\n.version 8.0")], [], "gpu"),  # PTX
        ([(2, b"x")], [(4, 1 << 20, _elf_head(190))], "gpu"),  # a cubin too large to keep
        ([(7, b"name"), (8, b"\x0a\x03obj")], [], "cpu"),  # object_files messages, no ELF
        ([(2, b"\x7f")], [], "unknown"),
    ],
)
def test_platform_from_the_executable_fields(
    small: list[tuple[int, bytes]], sections: list[tuple[int, int, bytes]], platform: str
) -> None:
    """Without a PJRT client name, the first field head that tells names the platform."""
    from cachedoctor.cache import _executable_walk

    walk = _executable_walk._Walk(small=list(small), sections=list(sections))
    assert _executable_walk._infer_platform(walk) == platform
