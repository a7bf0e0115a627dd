"""The walk of a serialized executable, and what its fields show: private to ``reader``.

``serialized_executable`` (field 1 of the payload) is walked here, as a stream or as a buffer
held in memory, into ``_Walk``: the HLO module and config, small fields kept whole, the sizes
and first bytes of large ones, a GPU executable written as a Riegeli split proto decoded whole
by ``xla.gpu``. ``_infer_platform``, ``_interpret_executable`` and ``_gpu_summary`` read the
platform, the section sizes and the GPU summary out of a finished walk. It is separate from
``reader`` (the entry files, their decompression and the API) and ``_payload`` (the framing
around the executable) because it is about XLA's executable messages alone; only those two
modules import it (the leading underscore says so).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cachedoctor.cache.decompress import DecodeFailure
from cachedoctor.cache.model import (
    FieldDigest,
    GpuSummary,
    MosaicKernel,
    Problem,
    Section,
    TpuSummary,
)
from cachedoctor.formats import wire
from cachedoctor.formats.errors import FormatError
from cachedoctor.xla import gpu, mosaic, tpu
from cachedoctor.xla.executable import (
    CPU_SIZE_SECTIONS,
    CPU_TARGET_MACHINE_FIELD,
    GPU_SIZE_SECTIONS,
    cpu_target_machine,
)

RIEGELI_MAGIC = b"\x83\xaf\x70\xd1\x0d\x88\x4a\x3f"

MAX_HLO_BYTES = 1 << 30
SMALL_FIELD = 64 << 10  # executable sub-fields kept whole for interpretation


@dataclass
class _Walk:
    """Mutable state of one streaming decode."""

    fields: dict[str, object] = field(default_factory=dict)
    hlo_module: bytes | None = None
    hlo_config: bytes | None = None
    compile_options: bytes | None = None
    ifrt_header: bytes | None = None
    small: list[tuple[int, bytes | memoryview]] = field(default_factory=list)  # <= SMALL_FIELD
    scalars: list[tuple[int, int]] = field(default_factory=list)
    sections: list[tuple[int, int, bytes]] = field(default_factory=list)  # number, size, head
    gpu_executable: gpu.GpuExecutable | None = None
    tpu_executable: tpu.TpuExecutable | None = None
    payload_split: bool = False
    hash_fields: bool = False  # detail decodes hash every executable field (FieldDigest)
    digests: list[FieldDigest] = field(default_factory=list)


def _walk_executable(fld: wire.StreamField, walk: _Walk) -> None:
    """Walk ``serialized_executable`` (CPU or GPU CompilationResultProto and successors).

    A GPU executable written as a Riegeli split proto (jax >= 0.10.1) is read whole and handed
    to ``gpu.decode_gpu_executable``; everything else is walked as a stream.
    """
    if fld.length and fld._stream.peek_byte() == RIEGELI_MAGIC[0]:
        _note_gpu_executable(walk, fld.read(MAX_HLO_BYTES))
        return
    for number, _wt, value in fld.sub():
        if not isinstance(value, wire.StreamField):
            walk.scalars.append((number, value))
            if walk.hash_fields:
                digest = hashlib.sha256(str(value).encode()).hexdigest()
                walk.digests.append(FieldDigest(number, 0, digest, value))
            continue
        if number == 1:
            data = value.read(MAX_HLO_BYTES)
            if walk.hash_fields:
                walk.digests.append(FieldDigest(1, len(data), hashlib.sha256(data).hexdigest()))
            _note_hlo_proto(walk, data)
        elif value.length <= SMALL_FIELD:
            data = value.read(SMALL_FIELD)
            walk.small.append((number, data))
            if walk.hash_fields:
                digest = hashlib.sha256(data).hexdigest()
                walk.digests.append(FieldDigest(number, len(data), digest))
        else:
            head = value._stream.read_exact(min(64, value.length))
            walk.sections.append((number, value.length, head))
            if walk.hash_fields:  # hash the rest while streaming past it
                hasher = hashlib.sha256(head)
                left = value.length - len(head)
                while left > 0:
                    chunk = value._stream.read_exact(min(left, 1 << 20))
                    hasher.update(chunk)
                    left -= len(chunk)
                walk.digests.append(FieldDigest(number, value.length, hasher.hexdigest()))


def _walk_executable_buffer(executable: memoryview, walk: _Walk) -> None:
    """``_walk_executable`` over an executable held in memory (see ``_walk_payload_buffer``)."""
    if len(executable) and executable[0] == RIEGELI_MAGIC[0]:
        _note_gpu_executable(walk, bytes(_capped(executable, MAX_HLO_BYTES)))
        return
    for number, _wt, value in wire.field_list(executable):
        if isinstance(value, int):
            walk.scalars.append((number, value))
        elif number == 1:
            _note_hlo_proto(walk, _capped(value, MAX_HLO_BYTES))
        elif len(value) <= SMALL_FIELD:
            walk.small.append((number, value))  # a slice: no copy of each object file
        else:
            walk.sections.append((number, len(value), bytes(value[:64])))


def _capped(value: memoryview, cap: int) -> memoryview:
    if len(value) > cap:
        raise wire.WireError(f"a field is {len(value)} bytes, over the {cap}-byte limit", 0)
    return value


def _note_gpu_executable(walk: _Walk, data: bytes) -> None:
    """A GPU executable written as a Riegeli split proto: decoded whole by ``gpu``."""
    try:
        decoded = gpu.decode_gpu_executable(data, max_bytes=MAX_HLO_BYTES)
    except FormatError as exc:
        raise DecodeFailure(_format_problem_kind(exc), f"GPU executable: {exc}") from exc
    walk.gpu_executable = decoded
    walk.hlo_module = decoded.hlo_module


def _note_hlo_proto(walk: _Walk, data: wire.Buffer) -> None:
    """The executable's ``HloProto``: keep its module and config. Raises WireError."""
    hf = wire.fields_by_number(data)
    module = wire.first(hf, 1)
    config = wire.first(hf, 2)
    walk.hlo_module = bytes(module) if module is not None and not isinstance(module, int) else None
    walk.hlo_config = bytes(config) if config is not None and not isinstance(config, int) else None


def _format_problem_kind(exc: FormatError) -> str:
    from cachedoctor.formats.errors import TooLarge, UnsupportedFormat

    if isinstance(exc, TooLarge):
        return "too-large"
    return "unsupported" if isinstance(exc, UnsupportedFormat) else "protobuf"


def _infer_platform(walk: _Walk) -> str:
    client = str(walk.fields.get("pjrt_client_name") or "").lower()
    if client:
        if "tpu" in client:
            return "tpu"
        if any(s in client for s in ("streamexecutor", "gpu", "cuda", "rocm")):
            return "gpu"
        if "cpu" in client:
            return "cpu"
    # each small field's and section's head, small fields first, in order, until the first
    # that tells (a CPU executable holds thousands of fields: its bytes are looked at only
    # where the first byte could start an ELF header, or in field 3)
    for n, head in walk.small:
        if head and (head[0] == 0x7F or n == 3):
            told = _platform_of_head(n, bytes(head[:64]))
            if told:
                return told
    for n, _, head in walk.sections:
        told = _platform_of_head(n, head)
        if told:
            return told
    numbers = {n for n, _ in walk.small} | {n for n, _, _ in walk.sections}
    if 9 in numbers or 7 in numbers:
        return "cpu"
    return "unknown"


def _platform_of_head(n: int, head: bytes) -> str | None:
    """What the first 64 bytes of executable field ``n`` say of the platform, if anything."""
    if head.startswith(b"\x7fELF") and len(head) >= 20:
        machine = int.from_bytes(head[18:20], "little")
        return "gpu" if machine == 190 else "cpu"  # EM_CUDA = 190
    if n == 3 and head.lstrip().startswith((b"//", b".version")):
        return "gpu"
    return None


def _tpu_summary(
    executable: tpu.TpuExecutable | None, problems: list[Problem]
) -> TpuSummary | None:
    """What scan and show say of libtpu's executable; the kernels from the optimised module."""
    if executable is None:
        return None
    kernels: tuple[MosaicKernel, ...] = ()
    try:
        if executable.hlo_module is not None:
            kernels = tuple(
                MosaicKernel(
                    k.instruction, mosaic.remember_body(k.body or k.config), len(k.body or b"")
                )
                for k in mosaic.kernels_in_module(executable.hlo_module)
            )
    except wire.WireError as exc:
        problems.append(Problem("protobuf", f"HLO module is malformed: {exc}"))
    chip = executable.chip
    return TpuSummary(
        chip=chip.label if chip else None,
        chip_version=chip.version if chip else None,
        chip_variant=chip.variant if chip else None,
        messages=executable.message_sizes,
        program_size=executable.program_size,
        environment=executable.environment_type,
        environment_size=len(executable.environment or b""),
        kernels=kernels,
    )


def _interpret_executable(walk: _Walk, platform: str, out: dict[str, object]) -> list[Section]:
    if walk.tpu_executable is not None:
        messages = walk.tpu_executable.message_sizes
        return [Section(tpu.MESSAGES[i], n) for i, n in enumerate(messages) if n]
    names = GPU_SIZE_SECTIONS if platform == "gpu" else CPU_SIZE_SECTIONS
    sizes: dict[str, int] = {}
    for n, size, _ in walk.sections:
        label = names.get(n, f"field {n}")
        sizes[label] = sizes.get(label, 0) + size
    for n, data in walk.small:
        if n in names:
            label = names[n]
            sizes[label] = sizes.get(label, 0) + len(data)
        if platform == "cpu" and n == CPU_TARGET_MACHINE_FIELD:
            target = cpu_target_machine(bytes(data))
            if target is not None:
                out["cpu_triple"], out["cpu_name"] = target[0], target[1]
    return [Section(k, v) for k, v in sorted(sizes.items())]


def _gpu_summary(walk: _Walk) -> GpuSummary:
    if walk.gpu_executable is not None:
        g = walk.gpu_executable
        return GpuSummary(
            layout=g.layout,
            payload_split=walk.payload_split,
            executable_split=g.was_split,
            compute_capability=g.compute_capability,
            ptx_size=g.ptx_size,
            cubin_size=g.cubin_size,
            cudnn_graphs=g.cudnn_graph_count,
            thunks=g.thunk_count,
        )
    sizes: dict[int, list[int]] = {}
    for n, size, _ in walk.sections:
        sizes.setdefault(n, []).append(size)
    for n, data in walk.small:
        sizes.setdefault(n, []).append(len(data))
    capability = next(
        (gpu.compute_capability(memoryview(d)) for n, d in walk.small if n == 6), None
    )
    return GpuSummary(
        layout=gpu.layout_of(set(sizes) | {n for n, _ in walk.scalars}),
        payload_split=walk.payload_split,
        executable_split=False,
        compute_capability=capability,
        ptx_size=sum(sizes.get(3, [])),
        cubin_size=sum(sizes.get(4, [])),
        cudnn_graphs=len(sizes.get(5, [])),
        thunks=len(sizes.get(13, [])),
    )
