"""What a scan needs of an HLO module (summary, program digest, key-volatile fields), parsed by
protobuf's C parser (upb) instead of the pure wire walker.

A cache of distinct large programs spends nearly all of a first scan here: the pure walk of
``hlo.module_facts`` costs 65-110 x D (D = reading and decompressing the entry), because it
builds a Python object per field. protobuf parses a *minimal view* of ``HloModuleProto``: only
the module, computation and instruction fields we read or drop are declared, every one of them as
``bytes`` or ``int64`` (never ``string``, so non-UTF-8 names parse; never a nested message below
the instruction, so shapes and metadata stay raw slices), and every other field is kept by
protobuf as an unknown field, in wire order. The schema is ours (field numbers from
xla/service/hlo.proto, stable across the JAX releases we read, see docs/format.md), so no
jaxlib descriptor is needed and no jaxlib version changes a digest.

The **program digest** says "same program modulo volatile fields" and groups entries in
``scan``. It covers the module after normalisation: instruction and computation names, ids,
source metadata, control edges and backend-config payloads dropped, operands and called
computations replaced by their positions, volatile custom-call configs masked; all other fields
(opcodes, raw shapes, custom-call targets, configs, attributes, module-level fields such as
aliasing and donation) stay. It is a different hash from ``hlo.canonicalize``'s line digest
(which ``diff`` shows), over the same normalisation, with shapes compared as raw bytes (stricter).
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachedoctor.formats import wire
from cachedoctor.xla import hlo

# Bumped whenever what the program digest covers changes (it is part of every digest).
PROGRAM_DIGEST_VERSION = b"cachedoctor-program-v2\0"

_CUSTOM_PARTITIONING = b"custom_partitioning"


@dataclass(frozen=True, slots=True)
class ScanFacts:
    """A module's summary, its program digest, and the volatile fields that make keys unstable."""

    summary: hlo.HloSummary
    program_digest: str
    volatile: tuple[hlo.VolatileField, ...]  # backend_config-pointer, custom-partitioning


# (number, name, type, repeated) of each declared field; types: "b" bytes, "i" int64, or a
# message name. Names are ours; numbers are XLA's.
_VIEW: dict[str, tuple[tuple[int, str, str, bool], ...]] = {
    "Instruction": (
        (1, "name", "b", False),
        (2, "opcode", "b", False),
        (3, "shape", "b", False),
        (7, "metadata", "b", False),
        (28, "custom_call_target", "b", False),
        (35, "id", "i", False),
        (36, "operand_ids", "i", True),
        (37, "control_predecessor_ids", "i", True),
        (38, "called_computation_ids", "i", True),
        (43, "backend_config", "b", False),
        (99, "backend_config_payload", "b", False),  # left out, as in hlo.canonicalize
    ),
    "Computation": (
        (1, "name", "b", False),
        (2, "instructions", "Instruction", True),
        (4, "program_shape", "b", False),
        (5, "id", "i", False),
        (6, "root_id", "i", False),
    ),
    "Module": (
        (1, "name", "b", False),
        (2, "entry_computation_name", "b", False),
        (3, "computations", "Computation", True),
        (4, "host_program_shape", "b", False),
        (5, "id", "i", False),
        (6, "entry_computation_id", "i", False),
        (7, "schedule", "b", False),
        (17, "stack_frame_index", "b", False),
        (23, "pjrt_id", "i", False),
    ),
}
# Fields that identify rather than define, cleared before hashing (as hlo._NOT_DEFINING and
# hlo._MODULE_IDENTITY_FIELDS); operands and called computations are hashed as positions.
_INSTRUCTION_IDENTITY = (
    "name",
    "id",
    "metadata",
    "operand_ids",
    "control_predecessor_ids",
    "called_computation_ids",
    "backend_config_payload",
)
_COMPUTATION_IDENTITY = ("name", "program_shape", "id", "root_id")
_MODULE_IDENTITY = (
    "name",
    "entry_computation_name",
    "host_program_shape",
    "id",
    "entry_computation_id",
    "schedule",
    "stack_frame_index",
    "pjrt_id",
)


@functools.cache
def _module_class() -> tuple[Callable[[bytes], Any], type[Exception]]:
    """``FromString`` of the view's module message, and protobuf's DecodeError (built once)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

    file = descriptor_pb2.FileDescriptorProto(
        name="cachedoctor/hlo_view.proto", package="cachedoctor_hlo_view", syntax="proto2"
    )
    field_type = descriptor_pb2.FieldDescriptorProto
    for message_name, fields in _VIEW.items():
        proto = file.message_type.add(name=message_name)
        for number, name, kind, repeated in fields:
            field = proto.field.add(name=name, number=number)
            field.label = field_type.LABEL_REPEATED if repeated else field_type.LABEL_OPTIONAL
            if kind == "b":
                field.type = field_type.TYPE_BYTES
            elif kind == "i":
                field.type = field_type.TYPE_INT64
            else:
                field.type = field_type.TYPE_MESSAGE
                field.type_name = f".cachedoctor_hlo_view.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("cachedoctor_hlo_view.Module"))
    return cls.FromString, message.DecodeError


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def scan_facts(module: bytes) -> ScanFacts:
    """Summary, program digest and key-volatile fields of one module. Raises WireError.

    The summary and volatile fields equal ``hlo.summarize`` and ``hlo.canonicalize``'s (tests
    compare them on real modules). The view is mutated while digesting: it is private.
    """
    parse, decode_error = _module_class()
    try:
        view = parse(module)
    except decode_error:
        # the pure walker names the offset of the damage; a module only protobuf refuses (a
        # declared field of the wrong wire type, nesting too deep) is refused all the same
        hlo.summarize(module)
        raise wire.WireError("HLO module does not parse as HloModuleProto", 0) from None
    entry = view.entry_computation_name
    computations = view.computations
    # ids default to 0 when absent (proto3 omits zeros); the last of duplicate ids wins
    comp_position = {comp.id: ci for ci, comp in enumerate(computations)}
    # custom_partitioning leaves its name in the source metadata only; most modules never
    # mention it, so the per-instruction look is skipped unless the bytes do
    look_for_partitioning = _CUSTOM_PARTITIONING in module
    opcode_counts: Counter[bytes] = Counter()
    custom_calls: list[hlo.CustomCall] = []
    volatile: list[hlo.VolatileField] = []
    structure: list[object] = []  # per computation: entry?, root position, operand positions...
    params: tuple[str, ...] = ()
    result = ""
    for comp in computations:
        cname = _text(comp.name)
        instructions = comp.instructions
        opcodes = [instr.opcode for instr in instructions]
        opcode_counts.update(opcodes)
        local = {instr.id: ii for ii, instr in enumerate(instructions)}
        operands: list[int] = []
        for ii, instr in enumerate(instructions):
            ids = instr.operand_ids
            called = instr.called_computation_ids
            operands.append(len(ids))
            operands.extend([local.get(i, -1) for i in ids])
            operands.append(len(called))
            operands.extend([comp_position.get(c, -1) for c in called])
            if instr.HasField("backend_config") or opcodes[ii] == b"custom-call":
                _custom_call_facts(instr, opcodes[ii], cname, custom_calls, volatile)
            if look_for_partitioning and instr.HasField("metadata"):
                metadata = instr.metadata
                if _CUSTOM_PARTITIONING in metadata and hlo.names_custom_partitioning(
                    memoryview(metadata)
                ):
                    look_for_partitioning = False
                    volatile.append(
                        hlo.VolatileField(
                            "custom-partitioning",
                            f"{cname}/{_text(instr.name)}",
                            hlo.CUSTOM_PARTITIONING_DETAIL,
                        )
                    )
            for name in _INSTRUCTION_IDENTITY:
                instr.ClearField(name)
        structure.append((comp.name == entry, local.get(comp.root_id, -1), operands))
        if comp.name == entry and comp.HasField("program_shape"):
            params, result = hlo.program_shape(memoryview(comp.program_shape))
        for name in _COMPUTATION_IDENTITY:
            comp.ClearField(name)
    if not params and not result and view.HasField("host_program_shape"):
        params, result = hlo.program_shape(memoryview(view.host_program_shape))
    summary = hlo.HloSummary(
        name=_text(view.name),
        entry_computation=_text(entry),
        computations=len(computations),
        instructions=sum(opcode_counts.values()),
        parameters=params,
        result=result,
        custom_calls=tuple(custom_calls),
        opcodes=_most_common(opcode_counts),
        source_files=_source_files(view),
    )
    for name in _MODULE_IDENTITY:
        view.ClearField(name)
    digest = hashlib.sha256(PROGRAM_DIGEST_VERSION)
    digest.update(repr(structure).encode())
    digest.update(view.SerializeToString(deterministic=True))
    return ScanFacts(summary, digest.hexdigest(), tuple(volatile))


def _custom_call_facts(
    instr: Any,
    opcode: bytes,
    cname: str,
    custom_calls: list[hlo.CustomCall],
    volatile: list[hlo.VolatileField],
) -> None:
    """Record a custom call, and mask a volatile backend_config (as ``hlo.canonicalize`` does)."""
    target = _text(instr.custom_call_target)
    config = _text(instr.backend_config)
    name = _text(instr.name)
    if opcode == b"custom-call":
        custom_calls.append(hlo.CustomCall(target, config, cname, name))
    if config and hlo.is_volatile_config(target, config):
        volatile.append(
            hlo.VolatileField("backend_config-pointer", f"{cname}/{name}", f"{target}: {config}")
        )
        instr.backend_config = b"<volatile>"


def _most_common(counts: Counter[bytes]) -> tuple[tuple[str, int], ...]:
    """Opcode counts by name, most common first, ties in order of first appearance (as a
    Counter of the decoded names built instruction by instruction)."""
    by_name: Counter[str] = Counter()
    for opcode, count in counts.items():
        by_name[_text(opcode) or "?"] += count
    return tuple(by_name.most_common())


def _source_files(view: Any) -> tuple[str, ...]:
    if not view.HasField("stack_frame_index"):
        return ()
    names = wire.fields_by_number(memoryview(view.stack_frame_index)).get(1, [])
    return tuple(wire.as_str(n) or "" for n in names)
