"""Decode what a GPU cache entry holds: the PjRt payload and the GPU ``serialized_executable``.

Layouts (docs/format-gpu.md):

* PjRt payload: a plain ``ExecutableAndOptionsProto`` up to jax 0.9.0, a Riegeli split proto from
  0.9.1 (``unwrap_pjrt_payload``).
* ``serialized_executable`` (``ExecutableAndOptionsProto`` field 1):
  ``CompilationResultProto`` (jax 0.4.24-0.8.0; fields 1-5), ``GpuExecutableProto`` "legacy"
  (0.8.1-0.10.0; wire-compatible, plus 6 compute capability, 8 module name, …) and "new" with
  ``thunks`` (13), itself a split proto from 0.10.1 (``decode_gpu_executable``).
  The oldest ``CompilationResultProto`` (before 2024) had the bare ``HloModuleProto`` in field 1
  and the config in 5; we tell it apart by shape and report it as ``compilation_result_v0``.

Everything here is built from public sources without a GPU; see docs/format-gpu.md for what is
not yet checked against real entries.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachedoctor.formats import riegeli, splitproto
from cachedoctor.formats.errors import CorruptFormat, UnsupportedFormat
from cachedoctor.formats.wire import (
    LEN,
    VARINT,
    FieldValue,
    WireError,
    fields_by_number,
    iter_fields,
)

Buffer = bytes | bytearray | memoryview

EXECUTABLE_AND_OPTIONS = "xla.ExecutableAndOptionsProto"
GPU_EXECUTABLE = "xla.gpu.GpuExecutableProto"
GPU_CLIENT_NAME = "PjRtStreamExecutorClient"
DEFAULT_MAX_BYTES = 1 << 30

# GpuExecutableProto fields that CompilationResultProto never had.
_GPU_EXECUTABLE_ONLY = {6, 8, 9, 10, 11, 12, 13, 14, 15}


@dataclass(frozen=True)
class PjrtPayload:
    """The ``ExecutableAndOptionsProto`` bytes, and whether they came out of a split proto."""

    executable_and_options: bytes
    was_split: bool
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuExecutable:
    """What ``show`` and ``scan`` need from a GPU executable. Sizes are in bytes."""

    layout: str  # compilation_result_v0 | compilation_result | gpu_executable_legacy
    #              | gpu_executable_thunks
    was_split: bool
    hlo_module: bytes | None  # HloModuleProto, renderable with XlaComputation(...).as_hlo_text()
    module_name: str | None
    compute_capability: str | None  # "9.0" for CUDA, the gcn arch name for ROCm
    ptx_size: int
    cubin_size: int
    cudnn_graph_count: int
    thunk_count: int  # top-level thunks (field 13); nested sequences are not counted
    constant_count: int
    message_size: int
    problems: tuple[str, ...] = ()


def is_riegeli_payload(payload: Buffer) -> bool:
    """Cheap check on the signature bytes: is this a Riegeli file (a split proto on GPU)?"""
    return riegeli.is_riegeli(payload)


def unwrap_pjrt_payload(payload: Buffer, *, max_bytes: int = DEFAULT_MAX_BYTES) -> PjrtPayload:
    """Return the ``ExecutableAndOptionsProto`` bytes, reassembling a split proto if needed.

    A plain proto is returned as is. Raises CorruptFormat/UnsupportedFormat/TooLarge for a
    Riegeli payload that cannot be read or holds another message type.
    """
    if not riegeli.is_riegeli(payload):
        return PjrtPayload(bytes(payload), was_split=False)
    sp = splitproto.read_split_proto(
        payload, expected_type=EXECUTABLE_AND_OPTIONS, max_bytes=max_bytes
    )
    return PjrtPayload(sp.message, was_split=True, problems=sp.problems)


def _last(fields: dict[int, list[FieldValue]], number: int) -> FieldValue | None:
    values = fields.get(number)
    return values[-1] if values else None


def _len_size(value: FieldValue | None) -> int:
    return len(value) if isinstance(value, memoryview) else 0


def _text(value: FieldValue | None) -> str | None:
    if not isinstance(value, memoryview):
        return None
    return bytes(value).decode("utf-8", "replace")


def _is_module_with_config(value: memoryview) -> bool:
    """HloModuleProtoWithConfig has only LEN fields 1 (module) and 2 (config); a bare
    HloModuleProto has 3 computations and varint ids, and its field 1 is a name."""
    try:
        outer = fields_by_number(value)
        if not outer or set(outer) - {1, 2}:
            return False
        module = _last(outer, 1)
        if not isinstance(module, memoryview) or any(
            not isinstance(v, memoryview) for vs in outer.values() for v in vs
        ):
            return False
        inner = fields_by_number(module)
    except WireError:
        return False
    name = _last(inner, 1)
    return isinstance(name, memoryview) and (3 in inner or 2 in inner)


def _compute_capability(value: FieldValue | None, problems: list[str]) -> str | None:
    if not isinstance(value, memoryview):
        return None
    try:
        cc = fields_by_number(value)
        cuda = _last(cc, 1)
        if isinstance(cuda, memoryview):
            parts = fields_by_number(cuda)
            major, minor = _last(parts, 1), _last(parts, 2)
            major = major if isinstance(major, int) else 0  # proto3 omits zeros
            minor = minor if isinstance(minor, int) else 0
            return f"{major}.{minor}"
        rocm = _last(cc, 2)
        if isinstance(rocm, memoryview):
            return _text(_last(fields_by_number(rocm), 1))
        if isinstance(_last(cc, 3), memoryview):
            return "oneapi"
    except WireError as exc:
        problems.append(f"compute capability does not parse: {exc}")
    return None


def layout_of(field_numbers: set[int], *, module_with_config: bool = True) -> str:
    """Which GPU executable layout (docs/format-gpu.md) a message with these fields is."""
    if 13 in field_numbers:
        return "gpu_executable_thunks"
    if field_numbers & _GPU_EXECUTABLE_ONLY:
        return "gpu_executable_legacy"
    if not module_with_config:
        return "compilation_result_v0"
    return "compilation_result"


def compute_capability(value: FieldValue | None) -> str | None:
    """The compute capability message (field 6) rendered, e.g. ``9.0``; None if unreadable."""
    return _compute_capability(value, [])


def decode_gpu_executable(data: Buffer, *, max_bytes: int = DEFAULT_MAX_BYTES) -> GpuExecutable:
    """Decode a GPU ``serialized_executable`` of any layout in docs/format-gpu.md.

    Raises CorruptFormat when the bytes are not a message, UnsupportedFormat when they look
    like a CPU executable or a split proto of another type, TooLarge past ``max_bytes``.
    """
    was_split = False
    problems: list[str] = []
    if riegeli.is_riegeli(data):
        sp = splitproto.read_split_proto(data, expected_type=GPU_EXECUTABLE, max_bytes=max_bytes)
        message: Buffer = sp.message
        was_split = True
        problems.extend(sp.problems)
    else:
        message = data
    try:
        fields = fields_by_number(message)
    except WireError as exc:
        raise CorruptFormat(f"GPU executable does not parse: {exc}") from None
    if not fields:
        raise CorruptFormat("GPU executable is empty")
    field5 = fields.get(5, [])
    if any(isinstance(v, int) for v in field5):
        raise UnsupportedFormat("this looks like a CPU CompilationResultProto, not a GPU one")

    first = _last(fields, 1)
    hlo_module: bytes | None = None
    with_config = isinstance(first, memoryview) and _is_module_with_config(first)
    if isinstance(first, memoryview):
        if with_config:
            module = _last(fields_by_number(first), 1)
            hlo_module = bytes(module) if isinstance(module, memoryview) else None
        else:
            hlo_module = bytes(first)
    else:
        problems.append("no HLO module in the executable")

    layout = layout_of(set(fields), module_with_config=first is None or with_config)

    module_name = _text(_last(fields, 8)) if layout.startswith("gpu_executable") else None
    if module_name is None and hlo_module is not None:
        try:
            module_name = _text(_last(fields_by_number(hlo_module), 1))
        except WireError as exc:
            problems.append(f"HLO module does not parse: {exc}")

    cudnn = (
        0
        if layout == "compilation_result_v0"
        else sum(1 for v in field5 if isinstance(v, memoryview))
    )
    return GpuExecutable(
        layout=layout,
        was_split=was_split,
        hlo_module=hlo_module,
        module_name=module_name,
        compute_capability=_compute_capability(_last(fields, 6), problems),
        ptx_size=_len_size(_last(fields, 3)),
        cubin_size=_len_size(_last(fields, 4)),
        cudnn_graph_count=cudnn,
        thunk_count=len(fields.get(13, [])),
        constant_count=len(fields.get(12, [])),
        message_size=len(message),
        problems=tuple(problems),
    )


@dataclass(frozen=True)
class GpuEntry:
    """A GPU PjRt payload decoded down to the executable."""

    payload: PjrtPayload
    client_name: str | None
    executable: GpuExecutable


def decode_gpu_pjrt_payload(payload: Buffer, *, max_bytes: int = DEFAULT_MAX_BYTES) -> GpuEntry:
    """Unwrap the PjRt payload and decode its ``serialized_executable`` (field 1)."""
    unwrapped = unwrap_pjrt_payload(payload, max_bytes=max_bytes)
    executable: memoryview | None = None
    client: str | None = None
    try:
        for number, wire_type, value in iter_fields(unwrapped.executable_and_options):
            if number == 1 and wire_type == LEN:
                assert isinstance(value, memoryview)
                executable = value
            elif number == 3 and wire_type == LEN:
                client = _text(value)
            elif number in (1, 3) and wire_type == VARINT:
                raise CorruptFormat(f"ExecutableAndOptionsProto field {number} is not bytes")
    except WireError as exc:
        raise CorruptFormat(f"ExecutableAndOptionsProto does not parse: {exc}") from None
    if executable is None:
        raise CorruptFormat("ExecutableAndOptionsProto has no serialized_executable")
    return GpuEntry(unwrapped, client, decode_gpu_executable(executable, max_bytes=max_bytes))
