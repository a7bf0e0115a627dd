"""Every field the reader reports, checked against the entry's bytes as protobuf and zstandard
read them (issue 13: the entry decoder under mutation testing).

The oracle takes an entry apart with zstandard, a plain varint loop for the header length and
protobuf's own parser (``UnknownFieldSet`` of an empty message: field numbers, wire types and
values, without our ``wire`` module). The entries are real: the seed cache, and a program of
the tests' own (``tests/support/large_program.py``) whose object file is larger than the reader's
64 KB ``SMALL_FIELD`` and whose payload is larger than a 1 MiB read. Each entry is decoded by
every path: in memory, as a stream, in detail, and through a store (an open file object).
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest
import zstandard
from google.protobuf import empty_pb2
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from cachedoctor.cache import decompress, listdir, reader
from cachedoctor.cache.model import EntryDetail, EntryInfo, FieldDigest, Problem, Section
from cachedoctor.storage.files import open_regular
from cachedoctor.storage.local_store import LocalStore

SMALL = 64 << 10  # the reader keeps executable fields up to this size whole (SMALL_FIELD)
# CompilationResultProto (xla/service/cpu/executable.proto): the fields the summary names
CPU_NAMES = {2: "buffer assignment", 4: "object code", 6: "thunk sequence", 8: "object files"}

Field = tuple[int, int, "bytes | int"]


def fields_of(data: bytes) -> list[Field]:
    """``(number, wire type, value)`` of each field, in order, as protobuf parses them."""
    message = empty_pb2.Empty()
    message.ParseFromString(data)
    return [(f.field_number, f.wire_type, f.data) for f in UnknownFieldSet(message)]


def first(fields: list[Field], number: int) -> bytes | int | None:
    return next((value for n, _wt, value in fields if n == number), None)


def text(value: bytes | int | None) -> str | None:
    assert not isinstance(value, int)
    return None if value is None else value.decode("utf-8")


def varint(data: bytes) -> tuple[int, int]:
    value = shift = pos = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if byte < 0x80:
            return value, pos


def split_payload(raw: bytes) -> tuple[bytes | None, bytes]:
    """The pjrt_ifrt header (None before jax 0.9.1) and the ExecutableAndOptionsProto."""
    payload = raw[4:]
    if payload[0] == 0x0A:  # see conftest.raw_payload_layout
        return None, payload
    length, start = varint(payload)
    return payload[start : start + length], payload[start + length :]


@dataclass(frozen=True)
class Taken:
    """An entry taken apart by the oracle."""

    raw: bytes  # decompressed: compile time, then the payload
    header: bytes | None  # pjrt_ifrt metadata (jax >= 0.9.1)
    top: list[Field]  # ExecutableAndOptionsProto
    executable: list[Field]  # serialized_executable (CPU CompilationResultProto)
    hlo: list[Field]  # its HloProto


def take_apart(path: Path) -> Taken:
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    header, payload = split_payload(raw)
    top = fields_of(payload)
    executable = first(top, 1)
    assert isinstance(executable, bytes)
    exe_fields = fields_of(executable)
    hlo = first(exe_fields, 1)
    assert isinstance(hlo, bytes)
    return Taken(raw, header, top, exe_fields, fields_of(hlo))


def expected_sections(t: Taken) -> tuple[Section, ...]:
    sizes: dict[str, int] = {}
    for n, _wt, value in t.executable:
        if n == 1 or isinstance(value, int):
            continue
        if n in CPU_NAMES or len(value) > SMALL:
            label = CPU_NAMES.get(n, f"field {n}")
            sizes[label] = sizes.get(label, 0) + len(value)
    return tuple(Section(k, v) for k, v in sorted(sizes.items()))


def check_info(info: EntryInfo, path: Path, t: Taken) -> None:
    st = path.stat()
    assert info.problems == ()
    assert info.key == path.name.removesuffix("-cache")  # JAX names the file KEY-cache
    assert info.module == info.key.rsplit("-", 1)[0]  # and the key MODULE-SHA256HEX
    assert (info.size, info.mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert info.compression == "zstd"
    assert info.compile_time_s == int.from_bytes(t.raw[:4], "big")
    assert info.decompressed_size == len(t.raw)
    assert info.executable_digest == hashlib.sha256(t.raw[4:]).hexdigest()
    if t.header is None:
        assert (info.payload_format, info.ifrt_version, info.runtime_name) == ("pjrt", None, None)
    else:
        header = fields_of(t.header)
        assert info.payload_format == "ifrt"
        assert info.ifrt_version == first(header, 1)
        assert info.runtime_name == text(first(header, 2))
    assert info.pjrt_client_name == text(first(t.top, 3))
    # the programs ran with JAX_PLATFORMS=cpu; an entry whose bytes name no client and hold no
    # code (jax 0.6.2's jit_squeeze, a bitcast) shows nothing of its platform: "unknown"
    code = {"object code", "object files"} & {s.name for s in expected_sections(t)}
    if code or first(t.top, 3) is not None:
        assert info.platform == "cpu"
    else:
        assert info.platform in ("cpu", "unknown")
    target = first(t.executable, 9)  # TargetMachineOptionsProto: triple, cpu
    if target is None:  # older releases (jax 0.4.38) store none
        assert (info.cpu_triple, info.cpu_name) == (None, None)
    else:
        assert isinstance(target, bytes)
        target_fields = fields_of(target)
        assert info.cpu_triple == text(first(target_fields, 1))
        assert info.cpu_name == text(first(target_fields, 2))
    assert info.sections == expected_sections(t)
    assert info.hlo is not None and info.hlo.name == info.module
    assert info.program_digest is not None
    assert info.gpu is None


def check_detail(detail: EntryDetail, path: Path, t: Taken) -> None:
    check_info(detail.info, path, t)
    assert detail.hlo_module == first(t.hlo, 1)
    assert detail.hlo_config == first(t.hlo, 2)
    assert detail.compile_options == first(t.top, 2)
    assert detail.ifrt_header == t.header
    small = [(n, v) for n, _wt, v in t.executable if n != 1 and isinstance(v, bytes)]
    assert detail.small_fields == tuple((n, v) for n, v in small if len(v) <= SMALL)
    digests = []
    for n, _wt, value in t.executable:
        if isinstance(value, int):
            digests.append(
                FieldDigest(n, 0, hashlib.sha256(str(value).encode()).hexdigest(), value)
            )
        else:
            digests.append(FieldDigest(n, len(value), hashlib.sha256(value).hexdigest()))
    assert detail.executable_fields == tuple(digests)


@pytest.fixture(scope="module")
def large_cache(cache_factory: Callable[..., Path]) -> Path:
    return cache_factory("large", [("large_program.py", {})])


@pytest.fixture(scope="module")
def large_entry(large_cache: Path) -> Path:
    (path,) = large_cache.glob("jit_large-*-cache")
    return path


def _entries(*caches: Path) -> list[Path]:
    return [c / i.name for c in caches for i in listdir.list_cache(c).entries]


@pytest.mark.slow
def test_the_large_entry_has_large_parts(large_entry: Path) -> None:
    """The premise: an executable field over SMALL_FIELD and a payload over 1 MiB."""
    t = take_apart(large_entry)
    assert any(isinstance(v, bytes) and len(v) > SMALL for n, _wt, v in t.executable if n != 1)
    assert len(t.raw) - 4 > 1 << 20


def _without_header(path: Path, folder: Path) -> Path:
    """The entry in the layout of jax <= 0.9.0 (no pjrt_ifrt header), as test_layout builds it."""
    t = take_apart(path)
    payload = t.raw[4:]
    if t.header is not None:
        payload = payload[payload.index(t.header) + len(t.header) :]
    folder.mkdir(exist_ok=True)
    out = folder / path.name
    out.write_bytes(zstandard.ZstdCompressor().compress(t.raw[:4] + payload))
    return out


@pytest.mark.slow
def test_every_decode_path_reports_the_bytes(
    seed_cache: Path, large_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _entries(seed_cache, large_cache)
    for path in real + [_without_header(p, tmp_path / "pjrt") for p in real]:
        t = take_apart(path)
        whole = reader.decode_entry(path)
        assert isinstance(whole, EntryInfo)
        check_info(whole, path, t)
        detail = reader.decode_entry(path, detail=True)
        assert isinstance(detail, EntryDetail)
        check_detail(detail, path, t)
        assert detail.info == whole
        with monkeypatch.context() as m:  # the stream decoder
            m.setattr(decompress, "WHOLE_DECODE_MAX", 0)
            assert reader.decode_entry(path) == whole
        # through a store: an open file object, and the size and time of the listing
        store = LocalStore(str(path.parent))
        item = next(i for i in listdir.list_cache(path.parent).entries if path.name == i.name)
        assert reader.decode_item(store, item) == whole
        store_detail = reader.decode_item(store, item, detail=True)
        assert isinstance(store_detail, EntryDetail)
        check_detail(store_detail, path, t)


class _UrlStore(LocalStore):
    """A local store that names its objects by URL, as a bucket does (no local path)."""

    def url_of(self, name: str) -> str:
        return f"store://cache/{name}"

    def open_read(self, name: str) -> BinaryIO:
        return open_regular(os.path.join(self.root, name))


@pytest.mark.slow
def test_a_store_entry_is_read_through_the_store(seed_cache: Path) -> None:
    store = _UrlStore(str(seed_cache))
    for item in listdir.list_cache(seed_cache).entries:
        info = reader.decode_item(store, item)
        assert isinstance(info, EntryInfo)
        path = seed_cache / item.name
        assert info.path == f"store://cache/{item.name}"
        check_info(info, path, take_apart(path))
        capped = reader.decode_item(store, item, max_decompressed=100)
        assert isinstance(capped, EntryInfo)
        assert [p.kind for p in capped.problems] == ["too-large"]
    capped_all = reader.decode_store_entries(
        store, listdir.list_cache(seed_cache).entries, max_decompressed=100
    )
    assert capped_all and all([p.kind for p in e.problems] == ["too-large"] for e in capped_all)
    listing = listdir.list_cache(seed_cache)
    assert all(
        [p.kind for p in e.problems] == ["too-large"]
        for e in reader.iter_entries(listing, max_decompressed=100)
    )


@pytest.mark.slow
def test_store_entries_in_listing_order_with_progress(seed_cache: Path) -> None:
    store = LocalStore(str(seed_cache))
    items = list(listdir.list_cache(seed_cache).entries)
    seen: list[tuple[int, int]] = []
    decoded = reader.decode_store_entries(
        store, items, progress=lambda done, total: seen.append((done, total))
    )
    assert [e.key for e in decoded] == [i.key for i in items]
    for info, item in zip(decoded, items, strict=True):
        check_info(info, seed_cache / item.name, take_apart(seed_cache / item.name))
    assert sorted(seen) == [(n, len(items)) for n in range(1, len(items) + 1)]


@pytest.mark.slow
def test_extract_payload_writes_the_bytes(large_entry: Path, tmp_path: Path) -> None:
    raw = take_apart(large_entry).raw
    zpath = tmp_path / large_entry.name
    zpath.write_bytes(zlib.compress(raw))
    for path in (large_entry, zpath):
        out = tmp_path / "payload"
        with out.open("wb") as fh:
            assert reader.extract_payload(path, fh) == len(raw) - 4
        assert out.read_bytes() == raw[4:]
        with path.open("rb") as src, out.open("wb") as fh:  # from an open file; no path
            assert reader.extract_payload(tmp_path / "absent", fh, fileobj=src) == len(raw) - 4
        assert out.read_bytes() == raw[4:]


@pytest.mark.parametrize(
    "data",
    [
        b"not compressed",
        zstandard.ZstdCompressor().compress(b"\0\0\0"),  # shorter than the time prefix
        zlib.compress(b"\0\0"),
    ],
)
def test_extract_payload_refuses_what_jax_cannot_read(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / ("jit_x-" + "0" * 64 + "-cache")
    path.write_bytes(data)
    with (tmp_path / "out").open("wb") as fh, pytest.raises(ValueError, match=r"."):
        reader.extract_payload(path, fh)


def _flushed_zlib_cut(raw: bytes, keep: int) -> bytes:
    """zlib of ``raw`` flushed after ``keep`` bytes and cut there: a writer stopped mid-write
    (zlib then yields exactly ``keep`` bytes and reports the stream unfinished)."""
    comp = zlib.compressobj()
    return comp.compress(raw[:keep]) + comp.flush(zlib.Z_FULL_FLUSH)


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _without_hlo(raw: bytes) -> bytes:
    """zstd of ``raw`` with the executable's field 1 (its HloProto) left out."""
    payload = split_payload(raw)[1]
    exe_length, exe_start = varint(payload[1:])  # payload: 0a LENGTH executable, then the rest
    executable = payload[1 + exe_start : 1 + exe_start + exe_length]
    rest = payload[1 + exe_start + exe_length :]
    assert executable[0] == 0x0A  # the executable opens with its HloProto
    hlo_length, hlo_start = varint(executable[1:])
    kept = executable[1 + hlo_start + hlo_length :]
    assert first(fields_of(kept), 1) is None
    before = raw[: len(raw) - len(payload)]
    return zstandard.ZstdCompressor().compress(
        before + b"\x0a" + _encode_varint(len(kept)) + kept + rest
    )


def _spoiled(raw: bytes, part: str) -> bytes:
    """zstd of ``raw`` with the first byte of its HLO module or compile options made 0x0f."""
    top = fields_of(split_payload(raw)[1])
    executable = first(top, 1)
    assert isinstance(executable, bytes)
    target = first(fields_of(executable), 1) if part == "hlo" else first(top, 2)
    if part == "hlo":
        assert isinstance(target, bytes)
        target = first(fields_of(target), 1)
    assert isinstance(target, bytes)
    spoiled = bytearray(raw)
    spoiled[raw.index(target)] = 0x0F
    with pytest.raises(DecodeError):
        fields_of(bytes(spoiled[raw.index(target) : raw.index(target) + len(target)]))
    return zstandard.ZstdCompressor().compress(bytes(spoiled))


# The first problem's kind decides what scan makes of an entry (scan.DAMAGE; a young "truncated"
# entry may be a write in progress), and docs/format.md defines the kinds. Each case's kinds,
# in order, on the grounds in its comment.
DAMAGE_CASES: dict[str, tuple[Callable[[bytes], bytes], tuple[str, ...]]] = {
    "empty": (lambda raw: b"", ("truncated",)),  # docs: "truncated (empty, ...)"
    # neither zstd's magic bytes nor a zlib header that zlib accepts
    "not-compressed": (lambda raw: b"\x00garbage", ("not-compressed",)),
    # zstandard refuses the cut frame (its single block yields nothing): then the prefix is
    # missing too
    "cut-zstd": (
        lambda raw: zstandard.ZstdCompressor().compress(raw)[:-40],
        ("truncated", "truncated"),
    ),
    # zlib yields a prefix of the data, reports the stream unfinished, and the prefix ends
    # inside a field (protobuf refuses it)
    "cut-zlib": (lambda raw: zlib.compress(raw)[:-30], ("truncated", "protobuf")),
    # zlib yields 40 bytes: the compile time and a cut pjrt_ifrt header (or a cut proto)
    "cut-zlib-in-header": (lambda raw: _flushed_zlib_cut(raw, 40), ("truncated", "HEADER")),
    # a complete frame whose payload ends inside a field tag (protobuf: truncated message)
    "tag-cut": (lambda raw: zstandard.ZstdCompressor().compress(raw + b"\x80"), ("truncated",)),
    # random bytes: no varint length of a header that parses, and no field 1 (protobuf's
    # parser refuses them too: checked in the test)
    "garbage": (
        lambda raw: zstandard.ZstdCompressor().compress(raw[:4] + random.Random(2).randbytes(5000)),
        ("header",),
    ),
    # a varint longer than 10 bytes where the header length would be
    "no-varint": (
        lambda raw: zstandard.ZstdCompressor().compress(raw[:4] + b"\xff" * 64),
        ("header",),
    ),
    # the HLO module's first tag made wire type 7 (protobuf refuses it: checked in the test)
    "hlo-malformed": (lambda raw: _spoiled(raw, "hlo"), ("protobuf",)),
    # the same in the compile options
    "options-malformed": (lambda raw: _spoiled(raw, "options"), ("protobuf",)),
    # field 1 of a bare proto whose length never ends
    "length-never-ends": (
        lambda raw: zstandard.ZstdCompressor().compress(raw[:4] + b"\x0a" + b"\xff" * 20),
        ("header",),
    ),
    # an executable without its HLO module (XLA cannot rebuild the program)
    "no-hlo": (lambda raw: _without_hlo(raw), ("protobuf",)),
    # a complete frame holding the compile time only
    "time-only": (lambda raw: zstandard.ZstdCompressor().compress(raw[:4]), ("truncated",)),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(DAMAGE_CASES))
def test_damage_kinds(case: str, seed_cache: Path, tmp_path: Path) -> None:
    make, kinds = DAMAGE_CASES[case]
    (real,) = seed_cache.glob("jit_g-*-cache")
    t = take_apart(real)
    if "HEADER" in kinds:  # the cut falls in the header (jax >= 0.9.1) or in the bare proto
        kinds = tuple(k.replace("HEADER", "header" if t.header else "protobuf") for k in kinds)
    path = tmp_path / real.name
    path.write_bytes(make(t.raw))
    if kinds == ("header",):  # the premise: protobuf does not parse the payload either
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
        with pytest.raises(DecodeError):
            fields_of(raw[4:])
    for streamed in (False, True):
        with pytest.MonkeyPatch.context() as m:
            if streamed:
                m.setattr(decompress, "WHOLE_DECODE_MAX", 0)
            info = reader.decode_entry(path)
        assert isinstance(info, EntryInfo)
        assert tuple(p.kind for p in info.problems) == kinds, info.problems
        assert all(isinstance(p.message, str) and p.message for p in info.problems)
        assert info.program_digest is None and info.volatile == ()


@pytest.mark.slow
def test_over_the_cap_still_says_its_compression(seed_cache: Path, tmp_path: Path) -> None:
    """A zstd frame that declares more than the cap is not decoded, but it is zstd (magic)."""
    (real,) = seed_cache.glob("jit_g-*-cache")
    info = reader.decode_entry(real, max_decompressed=100)
    assert isinstance(info, EntryInfo)
    assert real.read_bytes().startswith(b"\x28\xb5\x2f\xfd")
    assert info.compression == "zstd"
    assert [p.kind for p in info.problems] == ["too-large"]


class _FailingFile(io.BytesIO):
    """A file whose reads fail with EIO from byte ``at`` on (a disk or bucket going away)."""

    def __init__(self, data: bytes, at: int) -> None:
        super().__init__(data)
        self.at = at

    def read(self, n: int | None = -1) -> bytes:
        want = len(self.getbuffer()) if n is None or n < 0 else n
        if self.tell() + want > self.at:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return super().read(n)


@pytest.mark.slow
@pytest.mark.parametrize("at", [0, 2, 100, -10])
def test_read_errors_are_unreadable(at: int, seed_cache: Path) -> None:
    """An I/O error is "unreadable" (scan never calls it corrupt), wherever the read fails."""
    (real,) = seed_cache.glob("jit_g-*-cache")
    data = real.read_bytes()
    url = f"gs://bucket/cache/{real.name}"
    for detail in (False, True):
        fh = _FailingFile(data, at % len(data))
        info = reader.decode_entry(url, fileobj=fh, size=len(data), mtime_ns=5, detail=detail)
        if isinstance(info, EntryDetail):
            info = info.info
        assert info.problems == (Problem("unreadable", os.strerror(errno.EIO)),)
        assert (info.key, info.module, info.path) == (real.name[: -len("-cache")], "jit_g", url)
        assert (info.size, info.mtime_ns) == (len(data), 5)


def test_a_vanished_entry_is_unreadable(tmp_path: Path) -> None:
    """JAX's own eviction may delete an entry between the listing and the read."""
    path = tmp_path / ("jit_gone-" + "6" * 64 + "-cache")
    info = reader.decode_entry(path)
    assert isinstance(info, EntryInfo)
    assert info.problems == (Problem("unreadable", "no such file or directory"),)  # os_reason
    assert (info.key, info.module) == ("jit_gone-" + "6" * 64, "jit_gone")
    assert (info.size, info.mtime_ns, info.volatile) == (0, 0, ())
    stray = reader.decode_entry(tmp_path / "leftover-cache")  # not a key: no module
    assert isinstance(stray, EntryInfo)
    assert (stray.key, stray.module, stray.problems[0].kind) == ("leftover", None, "unreadable")


@pytest.mark.slow
def test_an_entry_without_suffix_is_named_by_its_key(seed_cache: Path, tmp_path: Path) -> None:
    """jax <= 0.4.29 wrote entries as KEY, without "-cache"."""
    (real,) = seed_cache.glob("jit_g-*-cache")
    old = tmp_path / real.name.removesuffix("-cache")
    old.write_bytes(real.read_bytes())
    info = reader.decode_entry(old)
    assert isinstance(info, EntryInfo)
    assert (info.key, info.module, info.problems) == (old.name, "jit_g", ())


@pytest.mark.slow
def test_copies_under_other_names_keep_their_own(seed_cache: Path, tmp_path: Path) -> None:
    """The payload memo serves copies of one executable; the key, module, path and times
    stay each file's own (a copy renamed, e.g. by hand or by a sync tool)."""
    (real,) = seed_cache.glob("jit_g-*-cache")
    copy = tmp_path / ("renamed-" + "5" * 64 + "-cache")
    copy.write_bytes(real.read_bytes())
    os.utime(copy, ns=(1, 2_000_000_000))
    first_info = reader.decode_entry(real)
    again = reader.decode_entry(copy)
    assert isinstance(first_info, EntryInfo) and isinstance(again, EntryInfo)
    assert (again.key, again.module, again.path) == ("renamed-" + "5" * 64, "renamed", str(copy))
    assert (again.size, again.mtime_ns) == (copy.stat().st_size, 2_000_000_000)
    assert again.executable_digest == first_info.executable_digest


class _SeekFailsFile(io.BytesIO):
    """A file whose seeks fail from the ``fail_from``-th on (a stream that cannot go back)."""

    def __init__(self, data: bytes, fail_from: int) -> None:
        super().__init__(data)
        self.fail_from = fail_from
        self.seeks = 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self.seeks += 1
        if self.seeks > self.fail_from:
            raise OSError(errno.ESPIPE, os.strerror(errno.ESPIPE))
        return super().seek(pos, whence)


@pytest.mark.slow
@pytest.mark.parametrize("fail_from", range(8))
def test_seek_errors_never_escape(fail_from: int, seed_cache: Path) -> None:
    """Whichever seek fails, decode_entry returns: the entry decoded, or "unreadable"."""
    (real,) = seed_cache.glob("jit_g-*-cache")
    data = real.read_bytes()
    clean = reader.decode_entry(real)
    assert isinstance(clean, EntryInfo) and clean.ok
    fh = _SeekFailsFile(data, fail_from)
    info = reader.decode_entry(f"gs://b/c/{real.name}", fileobj=fh, size=len(data), mtime_ns=5)
    assert isinstance(info, EntryInfo)
    if info.problems:
        assert info.problems == (Problem("unreadable", os.strerror(errno.ESPIPE)),)
    else:
        assert info.executable_digest == clean.executable_digest
