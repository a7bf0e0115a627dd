"""The split-proto and GPU-executable decoders on messages built with XLA's real schemas.

docs/format.md took the field numbers of ``SplitProtoManifest``, ``GpuExecutableProto`` and
``CudaComputeCapabilityProto`` from sources that a GPU was to confirm. The installed (CPU)
jaxlib embeds all three files (``tests/support/jaxlib_schema.py``), so protobuf builds and merges
the messages here, and our decoders must agree with it.
"""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from cachedoctor.formats import splitproto
from cachedoctor.formats.errors import UnsupportedFormat
from cachedoctor.xla import gpu
from tests.support.gpu_vectors import riegeli_file
from tests.support.jaxlib_schema import message_class

SPLIT_PROTO = "xla/util/split_proto/split_proto.proto"
GPU_EXECUTABLE = "xla/service/gpu/gpu_executable.proto"


def manifest_of(result_type: str, overrides: list[int | None]) -> bytes:
    """A manifest from protobuf: an int is an override of that field, None a merge record."""
    manifest = message_class(SPLIT_PROTO, "xla.SplitProtoManifest")(result_proto_type=result_type)
    for field in overrides:
        record = manifest.records.add()
        if field is None:
            record.proto_merge_record.SetInParent()
        else:
            override = record.field_override_record
            override.field_path.add(field_number=field)
            override.field_type = override.TYPE_STRING
    return bytes(manifest.SerializeToString())


def gpu_executable_message() -> Message:
    exe = message_class(GPU_EXECUTABLE, "xla.gpu.GpuExecutableProto")()
    module = exe.hlo_module_with_config.hlo_module
    module.name, module.entry_computation_name = "jit_g", "main.1"
    module.computations.add(name="main.1")
    exe.hlo_module_with_config.config.num_partitions = 1
    exe.asm_text = ".version 8.4\n.target sm_90a\n" * 40
    exe.binary = b"\x7fELF" + bytes(5000)
    cc = exe.gpu_compute_capability.cuda_compute_capability
    cc.major, cc.minor = 9, 0
    exe.module_name = "jit_g"
    for i in range(3):
        exe.constants.add(symbol_name=f"buffer_for_constant_{i}", allocation_index=i)
    for _ in range(4):
        exe.thunks.add()
    exe.dnn_compiled_graphs["cudnn$fusion"] = b'{"graph": 1}'
    exe.dnn_compiled_graphs["cudnn$conv"] = b'{"graph": 2}'
    return exe


def test_manifest_field_numbers() -> None:
    parsed = splitproto.parse_manifest(manifest_of("xla.gpu.GpuExecutableProto", [3, 4, None]))
    assert parsed.result_proto_type == "xla.gpu.GpuExecutableProto"
    assert [(r.kind, r.field_path) for r in parsed.records] == [
        ("override", (3,)),
        ("override", (4,)),
        ("merge", ()),
    ]


@pytest.mark.parametrize("part", ["repeated_field_index", "string_map_key", "int_map_key"])
def test_path_parts_we_cannot_apply_are_refused(part: str) -> None:
    manifest = message_class(SPLIT_PROTO, "xla.SplitProtoManifest")(result_proto_type="xla.X")
    override = manifest.records.add().field_override_record
    override.field_type = override.TYPE_STRING
    setattr(
        override.field_path.add(field_number=5),
        part,
        1 if "int" in part or "index" in part else "k",
    )
    with pytest.raises(UnsupportedFormat, match=f"path part has an? {part}"):
        splitproto.parse_manifest(manifest.SerializeToString())


def test_gpu_executable_field_numbers() -> None:
    exe = gpu_executable_message()
    decoded = gpu.decode_gpu_executable(exe.SerializeToString())
    assert decoded.layout == "gpu_executable_thunks"
    assert decoded.compute_capability == "9.0"
    assert decoded.module_name == "jit_g"
    assert (decoded.ptx_size, decoded.cubin_size) == (len(exe.asm_text), len(exe.binary))
    assert (decoded.cudnn_graph_count, decoded.thunk_count, decoded.constant_count) == (2, 4, 3)
    hlo = message_class("xla/service/hlo.proto", "xla.HloModuleProto").FromString(
        decoded.hlo_module
    )
    assert hlo.name == "jit_g"


def test_reassembly_agrees_with_protobuf_merging() -> None:
    """XLA's split: override asm_text, override binary, merge the rest; protobuf's own parse of
    our reassembled bytes must equal the message that was split."""
    exe = gpu_executable_message()
    rest = type(exe)()
    rest.CopyFrom(exe)
    rest.ClearField("asm_text")
    rest.ClearField("binary")
    records = [
        manifest_of("xla.gpu.GpuExecutableProto", [3, 4, None]),
        exe.asm_text.encode(),
        exe.binary,
        rest.SerializeToString(),
    ]
    split = splitproto.read_split_proto(riegeli_file(records, "snappy"))
    assert type(exe).FromString(split.message) == exe
