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
``scan``. It covers the module's bytes with the module's name, id, schedule and stack frames,
every instruction's name, source metadata and backend-config payload, and every computation's
name and program shape left out, and volatile custom-call configs masked; everything else
stays, instruction and computation ids included. Those ids are numbered per module, so the same
program compiled again gets the same ones (measured: copies written under other keys differ
only in the module id); ``hlo.canonicalize``, which ``diff`` shows, also writes operands as
positions, so a renumbered module that it calls the same is another program here. Doing without
positions keeps Python's work to about three steps per instruction (measured 4.7 x faster).
"""

from __future__ import annotations

import functools
import hashlib
import re
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachedoctor.formats import wire
from cachedoctor.xla import hlo

# Bumped whenever what the program digest covers changes (it is part of every digest).
PROGRAM_DIGEST_VERSION = b"cachedoctor-program-v2\0"
# Bumped whenever what the program signature covers changes.
SIGNATURE_VERSION = b"cachedoctor-signature-v1\0"

_CUSTOM_PARTITIONING = b"custom_partitioning"
# A volatile backend_config is address-like (``hlo._ADDRESS_LIKE``: whitespace, then 9-20 ASCII
# digits) or belongs to a callback target: a module whose bytes hold neither needs no
# per-instruction look at configs. The regex finds backend_config's tag (field 43), a varint
# length, optional whitespace and 9 digits, at ~0.3 ms a MB (mapping every byte to digit or
# not and searching took ~2 ms a MB).
_ADDRESS_LIKE_CONFIG = re.compile(rb"\xda\x02[\x80-\xff]{0,3}[\x00-\x7f][ \t\n\r\f\v]*[0-9]{9}")
# A custom_call_target (field 28) that names a callback target: tag, length, name.
_VOLATILE_TARGET = re.compile(
    b"\xe2\x01(?:"
    + b"|".join(
        re.escape(bytes([len(t)]) + t.encode()) for t in sorted(hlo.VOLATILE_CONFIG_TARGETS)
    )
    + b")"
)
_PAYLOAD_TAG = wire.encode_varint(99 << 3 | wire.LEN)  # backend_config_payload's tag


@dataclass(frozen=True, slots=True)
class ScanFacts:
    """A module's summary, its program digest, and the volatile fields that make keys unstable."""

    summary: hlo.HloSummary
    program_digest: str
    volatile: tuple[hlo.VolatileField, ...]  # backend_config-pointer, custom-partitioning
    signature: str  # ``signature(module)``: equal program digests have equal signatures


# (number, name, type, repeated) of each declared field; types: "b" bytes, "i" int64, or a
# message name. Names are ours; numbers are XLA's.
_VIEW: dict[str, tuple[tuple[int, str, str, bool], ...]] = {
    "StackFrameIndex": ((1, "file_names", "b", True),),
    "Instruction": (
        (1, "name", "b", False),
        (2, "opcode", "b", False),
        (7, "metadata", "b", False),
        (28, "custom_call_target", "b", False),
        (43, "backend_config", "b", False),
        (99, "backend_config_payload", "b", False),  # left out, as in hlo.canonicalize
    ),
    "Computation": (
        (1, "name", "b", False),
        (2, "instructions", "Instruction", True),
        (4, "program_shape", "b", False),
    ),
    "Module": (
        (1, "name", "b", False),
        (2, "entry_computation_name", "b", False),
        (3, "computations", "Computation", True),
        (4, "host_program_shape", "b", False),
        (5, "id", "i", False),
        (6, "entry_computation_id", "i", False),
        (7, "schedule", "b", False),
        (17, "stack_frame_index", "StackFrameIndex", False),
        (23, "pjrt_id", "i", False),
    ),
}
# The signature's view: only what it reads, and every message-typed field of ``_VIEW`` (the
# stack frame index, the computations and their instructions), so that it parses as deep and
# refuses exactly what ``_VIEW`` refuses. A field left out is skipped as an unknown field, with
# the same checks as a bytes or int64 field declared: its tag, its length or varint. It parses
# in less than half the time (an instruction's fields need not be kept one by one).
_SIGNED = {"Instruction": "SignedInstruction", "Computation": "SignedComputation"}


def _signature_fields(message: str, read: set[int]) -> tuple[tuple[int, str, str, bool], ...]:
    """``_VIEW[message]``'s fields that the signature reads (numbered in ``read``) and its
    message-typed ones, typed as the signature view's messages."""
    return tuple(
        (number, name, _SIGNED.get(kind, kind), repeated)
        for number, name, kind, repeated in _VIEW[message]
        if number in read or kind not in ("b", "i")
    )


_SIGNATURE_VIEW = {
    "StackFrameIndex": _VIEW["StackFrameIndex"],
    "SignedInstruction": _signature_fields("Instruction", set()),
    "SignedComputation": _signature_fields("Computation", {1, 4}),
    "SignedModule": _signature_fields("Module", {2, 4}),
}
# Module fields that identify rather than define (as hlo._MODULE_IDENTITY_FIELDS); the host
# program shape stays, as in ``hlo.canonicalize``'s module attrs.
_MODULE_IDENTITY = (
    "name",
    "entry_computation_name",
    "id",
    "entry_computation_id",
    "schedule",
    "stack_frame_index",
    "pjrt_id",
)


def prepare() -> None:
    """Load protobuf's parser and build the views' classes now (~5 ms, once per process): a
    process about to fork workers that will parse modules does it once for all of them."""
    _module_class()
    _signature_parse()


@functools.cache
def _module_class() -> tuple[Callable[[bytes], Any], type[Exception], Callable[[Any, str], None]]:
    """``FromString`` of the view's module message, protobuf's DecodeError, and the unbound
    ``ClearField`` of the view's instruction message (built once)."""
    from google.protobuf import message

    make_class = _class_maker()
    return (
        make_class("Module").FromString,
        message.DecodeError,
        make_class("Instruction").ClearField,
    )


@functools.cache
def _signature_parse() -> Callable[[bytes], Any]:
    """``FromString`` of the signature's module message (``_SIGNATURE_VIEW``)."""
    return _class_maker()("SignedModule").FromString  # type: ignore[no-any-return]


_PACKAGE = "cachedoctor_hlo_view"


@functools.cache
def _class_maker() -> Callable[[str], Any]:
    """A function from a view message's name to its class, the views' file added to a pool of
    their own (once).

    protobuf's C parser (upb) is used directly where it is installed, as protobuf itself uses
    it: the public route (``descriptor_pool``, ``message_factory``) imports protobuf's pure
    Python message machinery first, ~10 ms of every first scan of a fresh process spent on code
    a view never runs (docs/performance.md, "Performance IV"). Elsewhere (protobuf's C++ or
    pure Python implementation, or a upb whose private API is not what it was), the public
    route."""
    direct = _upb_class_maker()
    if direct is not None:
        return direct
    from google.protobuf import descriptor_pool, message_factory

    public = descriptor_pool.DescriptorPool()
    public.AddSerializedFile(view_file_descriptor())

    def public_class(name: str) -> Any:
        found = public.FindMessageTypeByName(f"{_PACKAGE}.{name}")
        return message_factory.GetMessageClass(found)

    return functools.cache(public_class)


def _upb_class_maker() -> Callable[[str], Any] | None:
    """``_class_maker``'s direct route, or None where upb is absent or does not take the calls
    protobuf's own ``message_factory`` makes of it (checked by making the module's class)."""
    try:
        from google._upb import _message as upb
        from google.protobuf import message

        pool = upb.DescriptorPool()
        pool.AddSerializedFile(view_file_descriptor())

        def upb_class(name: str) -> Any:
            found = pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")
            return upb.MessageMeta(
                name, (message.Message,), {"DESCRIPTOR": found, "__module__": None}
            )

        made = functools.cache(upb_class)
        made("Module").FromString(b"")
    except Exception:  # ImportError, AttributeError, TypeError: the public route then
        return None
    return made


# FieldDescriptorProto's label and type values (google/protobuf/descriptor.proto)
_LABEL_OPTIONAL, _LABEL_REPEATED = 1, 3
_TYPE_INT64, _TYPE_MESSAGE, _TYPE_BYTES = 3, 11, 12


def view_file_descriptor() -> bytes:
    """The views' messages (``_VIEW``, ``_SIGNATURE_VIEW``) as a serialized
    ``FileDescriptorProto``, written with the wire encoder: protobuf's ``descriptor_pb2`` is
    a module too costly to import for a few dozen fields. Tests hold it to ``descriptor_pb2``'s
    own encoding of the same file."""

    def text(number: int, value: str) -> bytes:
        return wire.encode_field(number, wire.LEN, value.encode())

    def number_field(number: int, value: int) -> bytes:
        return wire.encode_field(number, wire.VARINT, value)

    messages = []
    for message_name, fields in {**_VIEW, **_SIGNATURE_VIEW}.items():
        body = [text(1, message_name)]
        for number, name, kind, repeated in fields:
            field = [
                text(1, name),
                number_field(3, number),
                number_field(4, _LABEL_REPEATED if repeated else _LABEL_OPTIONAL),
            ]
            if kind == "b":
                field.append(number_field(5, _TYPE_BYTES))
            elif kind == "i":
                field.append(number_field(5, _TYPE_INT64))
            else:
                field.append(number_field(5, _TYPE_MESSAGE))
                field.append(text(6, f".{_PACKAGE}.{kind}"))
            body.append(wire.encode_field(2, wire.LEN, b"".join(field)))
        messages.append(wire.encode_field(4, wire.LEN, b"".join(body)))
    return b"".join(
        [text(1, "cachedoctor/hlo_view.proto"), text(2, _PACKAGE), *messages, text(12, "proto2")]
    )


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def scan_facts(module: bytes) -> ScanFacts:
    """Summary, program digest and key-volatile fields of one module. Raises WireError.

    The summary and volatile fields equal ``hlo.summarize`` and ``hlo.canonicalize``'s (tests
    compare them on real modules). Python touches each instruction about three times (its
    opcode, and clearing its name and metadata); everything else is read only where the
    module's bytes show it can matter. The view is mutated while digesting: it is private.
    The loops over instructions stay inline, with their methods bound to locals, for speed
    (docs/performance.md, "scan_facts touches each instruction once").
    """
    view, clear_field = _parse_view(module)
    entry = view.entry_computation_name
    computations = view.computations
    counts = [len(comp.instructions) for comp in computations]
    # Gates: a field or value the bytes never contain needs no look per instruction.
    look_for_partitioning = _CUSTOM_PARTITIONING in module
    has_custom_calls = b"custom-call" in module
    look_at_configs = _may_hold_volatile_config(module)
    clear_payloads = _PAYLOAD_TAG in module
    look_closer = look_for_partitioning or has_custom_calls or look_at_configs
    all_opcodes: list[bytes] = []
    custom_calls: list[hlo.CustomCall] = []
    volatile: list[tuple[int, int, int, hlo.VolatileField]] = []  # sorted into module order
    entry_flags: list[bool] = []
    params: tuple[str, ...] = ()
    result = ""
    take_opcode = all_opcodes.append
    for ci, comp in enumerate(computations):
        instructions = comp.instructions
        if not look_closer and not clear_payloads:  # the common case: one pass
            for instr in instructions:
                take_opcode(instr.opcode)
                clear_field(instr, "name")
                clear_field(instr, "metadata")
        elif not look_closer:  # the tag's two bytes turn up by chance in most large modules
            for instr in instructions:
                take_opcode(instr.opcode)
                clear_field(instr, "name")
                clear_field(instr, "metadata")
                clear_field(instr, "backend_config_payload")
        else:
            cname = _text(comp.name)
            opcodes = [instr.opcode for instr in instructions]
            all_opcodes += opcodes
            if look_at_configs or b"custom-call" in opcodes:
                _custom_calls(
                    ci, cname, instructions, opcodes, look_at_configs, custom_calls, volatile
                )
            if look_for_partitioning:
                found = _custom_partitioning(ci, cname, instructions)
                if found is not None:
                    volatile.append(found)
                    look_for_partitioning = False
            for instr in instructions:
                clear_field(instr, "name")
                clear_field(instr, "metadata")
            if clear_payloads:
                for instr in instructions:
                    clear_field(instr, "backend_config_payload")
        is_entry = comp.name == entry
        entry_flags.append(is_entry)
        if is_entry and comp.HasField("program_shape"):
            params, result = _program_shape(comp.program_shape)
        comp.ClearField("name")
        comp.ClearField("program_shape")
    summary = _summary(view, entry, len(computations), all_opcodes, custom_calls, params, result)
    signed = _signed(entry_flags, counts, view.host_program_shape)
    for name in _MODULE_IDENTITY:
        view.ClearField(name)
    digest = hashlib.sha256(PROGRAM_DIGEST_VERSION)
    digest.update(bytes(entry_flags))
    digest.update(view.SerializeToString(deterministic=True))
    volatile.sort(key=lambda found: found[:3])
    return ScanFacts(summary, digest.hexdigest(), tuple(v for *_, v in volatile), signed)


def signature(module: bytes) -> str:
    """The program signature: a digest of what a first look at the module shows (which
    computations are the entry, each computation's number of instructions, the host program
    shape), all of which the program digest covers, so two modules with different signatures
    hold different programs. Raises WireError exactly where ``scan_facts`` does (a parse as
    deep, ``_SIGNATURE_VIEW``; the same program shapes read), so a module it accepts yields the
    same problems either way. One C parse and a step per computation, none per instruction."""
    _, decode_error, _ = _module_class()
    try:
        view = _signature_parse()(module)
    except decode_error:
        scan_facts(module)  # raises the pure walker's WireError, with its offset
        raise wire.WireError("HLO module does not parse as HloModuleProto", 0) from None
    entry = view.entry_computation_name
    entry_flags: list[bool] = []
    counts: list[int] = []
    shaped = False
    for comp in view.computations:  # one wrapper per computation, made once
        is_entry = comp.name == entry
        entry_flags.append(is_entry)
        counts.append(len(comp.instructions))
        if is_entry and comp.HasField("program_shape"):
            shaped = _program_shape(comp.program_shape) != ((), "")
    if not shaped and view.HasField("host_program_shape"):
        _program_shape(view.host_program_shape)
    return _signed(entry_flags, counts, view.host_program_shape)


def _signed(entry_flags: list[bool], counts: list[int], host_shape: bytes) -> str:
    digest = hashlib.sha256(SIGNATURE_VERSION)
    digest.update(bytes(entry_flags))
    digest.update(array("q", counts).tobytes())
    digest.update(host_shape)
    return digest.hexdigest()


def _parse_view(module: bytes) -> tuple[Any, Callable[[Any, str], None]]:
    """The module parsed into the view, and the instructions' unbound ``ClearField``. Raises
    WireError."""
    parse, decode_error, clear_field = _module_class()
    try:
        return parse(module), clear_field
    except decode_error:
        # the pure walker names the offset of the damage; a module only protobuf refuses
        # (nesting too deep, say) is refused all the same
        hlo.summarize(module)
        raise wire.WireError("HLO module does not parse as HloModuleProto", 0) from None


def _summary(
    view: Any,
    entry: bytes,
    computations: int,
    all_opcodes: list[bytes],
    custom_calls: list[hlo.CustomCall],
    params: tuple[str, ...],
    result: str,
) -> hlo.HloSummary:
    """The module's summary from what the pass over its computations collected (the program
    shape from the module's host shape when the entry computation has none)."""
    opcode_counts = Counter(all_opcodes)
    if not params and not result and view.HasField("host_program_shape"):
        params, result = _program_shape(view.host_program_shape)
    return hlo.HloSummary(
        name=_text(view.name),
        entry_computation=_text(entry),
        computations=computations,
        instructions=sum(opcode_counts.values()),
        parameters=params,
        result=result,
        custom_calls=tuple(custom_calls),
        opcodes=_most_common(opcode_counts),
        source_files=_source_files(view),
    )


_SHAPES: dict[bytes, tuple[tuple[str, ...], str]] = {}
_SHAPES_MAX = 4096


def _program_shape(shape: bytes) -> tuple[tuple[str, ...], str]:
    """``hlo.program_shape``, memoised by the shape's bytes: rendering one costs ~17 us, and
    the programs of a cache share few signatures (88 among the 5,225 modules of the benchmark's
    ``dist-10k``). Raises WireError (not memoised)."""
    found = _SHAPES.get(shape)
    if found is None:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        found = _SHAPES[shape] = hlo.program_shape(memoryview(shape))
    return found


def _may_hold_volatile_config(module: bytes) -> bool:
    """Whether some backend_config may be volatile (``hlo.is_volatile_config``): one whose
    value opens address-like (tag, length, whitespace, 9 digits), or a custom call to a
    callback target. False only where no instruction can have one."""
    return (
        _ADDRESS_LIKE_CONFIG.search(module) is not None
        or _VOLATILE_TARGET.search(module) is not None
    )


def _custom_calls(
    ci: int,
    cname: str,
    instructions: Any,
    opcodes: list[bytes],
    look_at_configs: bool,
    custom_calls: list[hlo.CustomCall],
    volatile: list[tuple[int, int, int, hlo.VolatileField]],
) -> None:
    """Record the custom calls, and mask volatile backend_configs (as ``hlo.canonicalize``)."""
    if look_at_configs:
        configs = [instr.backend_config for instr in instructions]
        wanted = [ii for ii, op in enumerate(opcodes) if op == b"custom-call" or configs[ii]]
    else:
        wanted = [ii for ii, op in enumerate(opcodes) if op == b"custom-call"]
    for ii in wanted:
        instr = instructions[ii]
        target = _text(instr.custom_call_target)
        config = _text(instr.backend_config)
        name = _text(instr.name)
        if opcodes[ii] == b"custom-call":
            custom_calls.append(hlo.CustomCall(target, config, cname, name))
        if config and hlo.is_volatile_config(target, config):
            where = f"{cname}/{name}"
            pointer = hlo.VolatileField("backend_config-pointer", where, f"{target}: {config}")
            volatile.append((ci, ii, 0, pointer))
            instr.backend_config = b"<volatile>"


def _custom_partitioning(
    ci: int, cname: str, instructions: Any
) -> tuple[int, int, int, hlo.VolatileField] | None:
    """The first instruction whose source metadata names a custom_partitioning op."""
    for ii, instr in enumerate(instructions):
        if not instr.HasField("metadata"):
            continue
        metadata = instr.metadata
        if _CUSTOM_PARTITIONING in metadata and hlo.names_custom_partitioning(memoryview(metadata)):
            where = f"{cname}/{_text(instr.name)}"
            found = hlo.VolatileField("custom-partitioning", where, hlo.CUSTOM_PARTITIONING_DETAIL)
            return (ci, ii, 1, found)
    return None


def _most_common(counts: Counter[bytes]) -> tuple[tuple[str, int], ...]:
    """Opcode counts by name, most common first, ties in order of first appearance (as a
    Counter of the decoded names built instruction by instruction)."""
    by_name: Counter[str] = Counter()
    for opcode, count in counts.items():
        by_name[_text(opcode) or "?"] += count
    return tuple(by_name.most_common())


def _source_files(view: Any) -> tuple[str, ...]:
    """File names from the module's StackFrameIndexProto (as ``hlo.summarize``)."""
    return tuple(_text(name) for name in view.stack_frame_index.file_names)
