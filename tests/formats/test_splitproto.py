"""Split-proto reassembly, following the layouts XLA writes (split_executable_and_options_writer,
split_gpu_executable_writer) and the behaviour of its reader tests (split_proto_reader_test)."""

from __future__ import annotations

import pytest

from cachedoctor.formats import splitproto
from cachedoctor.formats.errors import CorruptFormat, TooLarge, UnsupportedFormat
from cachedoctor.formats.wire import fields_by_number
from tests.support.gpu_vectors import f_bytes, f_varint, manifest, riegeli_file

EAO = "xla.ExecutableAndOptionsProto"
GPU = "xla.gpu.GpuExecutableProto"


def test_executable_and_options_layout() -> None:
    executable = b"\x0a\x03abc" * 1000
    options = f_bytes(2, f_bytes(3, f_bytes(3, f_varint(1, 7))))
    rest = options + f_bytes(3, "PjRtStreamExecutorClient")
    data = riegeli_file([manifest(EAO, [1, "merge"]), executable, rest], "snappy")
    assert splitproto.is_split_proto(data)
    sp = splitproto.read_split_proto(data, expected_type=EAO)
    assert sp.record_kinds == ("override", "merge")
    fields = fields_by_number(sp.message)
    assert bytes(fields[1][-1]) == executable
    assert bytes(fields[3][-1]) == b"PjRtStreamExecutorClient"
    assert bytes(fields[2][-1]) == f_bytes(3, f_bytes(3, f_varint(1, 7)))
    assert sp.problems == ()


def test_gpu_executable_layout_with_constants() -> None:
    ptx, cubin = b".version 8.0\n" * 50, b"\x7fELF" + bytes(3000)
    dnn = f_bytes(5, f_bytes(1, "cudnn$conv") + f_bytes(2, b'{"graph": 1}'))
    constants = [f_bytes(12, f_bytes(1, f"c{i}") + f_varint(3, i)) for i in range(3)]
    rest = f_bytes(1, f_bytes(1, f_bytes(1, "jit_f"))) + f_bytes(8, "jit_f") + f_bytes(13, b"")
    kinds: list[object] = [3, 4, "merge", "merge", "merge", "merge", "merge"]
    records = [manifest(GPU, kinds), ptx, cubin, dnn, *constants, rest]
    sp = splitproto.read_split_proto(riegeli_file(records, "snappy", per_chunk=2))
    fields = fields_by_number(sp.message)
    assert bytes(fields[3][-1]) == ptx
    assert bytes(fields[4][-1]) == cubin
    assert len(fields[5]) == 1
    assert len(fields[12]) == 3
    assert bytes(fields[8][-1]) == b"jit_f"


def test_later_merge_wins_for_a_singular_field() -> None:
    # split_proto_reader_test ReadSplitProtoWithProtoMergeRecord: the last asm_text wins.
    records = [
        manifest(GPU, ["merge", "merge", "merge"]),
        f_bytes(3, "test_text"),
        f_bytes(13, f_bytes(1, f_varint(1, 1))),
        f_bytes(3, "overridden_test_text"),
    ]
    sp = splitproto.reassemble(records)
    fields = fields_by_number(sp.message)
    assert bytes(fields[3][-1]) == b"overridden_test_text"
    assert len(fields[13]) == 1


def test_override_after_merge_replaces_the_value() -> None:
    records = [manifest(GPU, ["merge", 3]), f_bytes(3, "original_text"), b"overridden_text"]
    fields = fields_by_number(splitproto.reassemble(records).message)
    assert bytes(fields[3][-1]) == b"overridden_text"


def test_nested_override_path() -> None:
    rec = f_bytes(3, f_bytes(1, f_varint(1, 1)) + f_bytes(1, f_varint(1, 3)) + f_varint(2, 1))
    records = [manifest("x.Outer", [rec]), b"inner value"]
    fields = fields_by_number(splitproto.reassemble(records).message)
    nested = fields[1][-1]
    assert isinstance(nested, memoryview)
    inner = fields_by_number(nested)
    assert bytes(inner[3][-1]) == b"inner value"


def test_unknown_record_kind_is_skipped() -> None:
    # split_proto_reader_test UnknownRecordType
    records = [manifest(GPU, [b"", "merge"]), b"some record we don't know about", f_bytes(3, "t")]
    sp = splitproto.reassemble(records)
    assert bytes(fields_by_number(sp.message)[3][-1]) == b"t"
    assert sp.record_kinds == ("unknown", "merge")
    assert any("unknown" in p for p in sp.problems)


def test_missing_records() -> None:
    with pytest.raises(CorruptFormat, match="manifest lists 2"):
        splitproto.reassemble([manifest(GPU, ["merge", "merge"]), b""])


def test_extra_records_are_reported() -> None:
    sp = splitproto.reassemble([manifest(GPU, ["merge"]), b"", b"extra"])
    assert sp.problems


def test_type_mismatch() -> None:
    with pytest.raises(UnsupportedFormat, match="AnotherProto"):
        splitproto.reassemble([manifest("AnotherProto", ["merge"]), b""], expected_type=GPU)


def test_unsupported_override_type() -> None:
    rec = f_bytes(3, f_bytes(1, f_varint(1, 13)) + f_varint(2, 0))  # TYPE_UNKNOWN
    with pytest.raises(UnsupportedFormat, match="type 0"):
        splitproto.reassemble([manifest(GPU, [rec]), b"some_data"])


def test_override_with_an_index_part() -> None:
    rec = f_bytes(3, f_bytes(1, f_varint(1, 13) + f_varint(2, 0)) + f_varint(2, 1))
    with pytest.raises(UnsupportedFormat, match="index"):
        splitproto.reassemble([manifest(GPU, [rec]), b"x"])


def test_override_with_empty_path() -> None:
    rec = f_bytes(3, f_varint(2, 1))
    with pytest.raises(CorruptFormat, match="empty field path"):
        splitproto.reassemble([manifest(GPU, [rec]), b"x"])


def test_size_limit() -> None:
    with pytest.raises(TooLarge):
        splitproto.reassemble([manifest(GPU, [3]), b"x" * 1000], max_bytes=1000)


@pytest.mark.parametrize(
    "first",
    [
        f_bytes(3, "test_text"),  # a GpuExecutableProto, not a manifest (IsSplitProto false)
        b"",
        b"\xff\xff",
        f_bytes(1, b"\xff\xfe not utf-8"),
        f_bytes(1, "has spaces in it"),
    ],
)
def test_not_a_manifest(first: bytes) -> None:
    data = riegeli_file([first, b"more"], "none")
    assert not splitproto.is_split_proto(data)
    with pytest.raises(CorruptFormat):
        splitproto.read_split_proto(data)


def test_is_split_proto_on_other_input() -> None:
    assert not splitproto.is_split_proto(b"")
    assert not splitproto.is_split_proto(b"This is not a riegeli file")
    assert not splitproto.is_split_proto(f_bytes(1, b"plain ExecutableAndOptionsProto"))
    signature_only = riegeli_file([], "none")
    assert not splitproto.is_split_proto(signature_only)
    damaged = bytearray(riegeli_file([manifest(GPU, ["merge"]), b""], "none"))
    del damaged[-3:]
    assert not splitproto.is_split_proto(bytes(damaged))


def test_empty_records() -> None:
    with pytest.raises(CorruptFormat):
        splitproto.reassemble([])
