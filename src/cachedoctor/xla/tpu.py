"""libtpu's serialized executable: what follows the ``pjrt_ifrt`` header in a TPU cache entry.

Read from the bytes of real entries (TPU v5 lite, jax/jaxlib 0.10.2, libtpu 0.0.42.1;
docs/format-tpu.md): six varint-length-delimited messages, each of which libtpu parses when JAX
loads the entry. What libtpu said when one did not parse (tests/fixtures/tpu-v5e, damage.json)
names them:

====  =========================================  ============================================
 #    libtpu's word                              what it holds
====  =========================================  ============================================
 0    core program                               the program: fingerprint, machine code (8),
                                                 the chip it was built for (12)
 1    compiler metadata                          ``HloProto`` (6: the optimised module in 6.1),
                                                 the original module (38), the TPU compilation
                                                 environment as an ``Any`` (40), the name (20)
 2    (sparse core compiler metadata)            empty on a v5e
 3    (sparse core program)                      empty on a v5e
 4    hlo module                                 ``HloModuleProtoWithConfig`` (1 module,
                                                 2 config)
 5    full proto                                 ``TpuExecutableProto``: 4 the
                                                 ``CompileOptionsProto`` JAX hashed into the key
====  =========================================  ============================================

Bytes left after the sixth message make libtpu refuse the entry ("found leftover bytes after
parsing all submessages"), and so does a message that does not parse. Those are the only grounds
on which this module calls an entry damaged (``CorruptFormat``). A payload that does not start
like this at all raises ``UnknownLayout``: a newer libtpu, another plugin, a platform we have not
seen, never damage.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachedoctor.formats import wire
from cachedoctor.formats.errors import CorruptFormat, UnsupportedFormat

Buffer = bytes | bytearray | memoryview

MESSAGES = (
    "core program",
    "compiler metadata",
    "sparse core compiler metadata",
    "sparse core program",
    "hlo module",
    "full proto",
)
CORE_PROGRAM, COMPILER_METADATA, HLO_MODULE, FULL_PROTO = 0, 1, 4, 5

# Field numbers, as read from the bytes (docs/format-tpu.md)
PROGRAM_CODE = 8
PROGRAM_CHIP = 12  # {1: TpuVersionEnum, 2: variant ("lite"), 3: "default", ...}
METADATA_HLO_PROTO = 6  # xla.HloProto: 1 module, 3 buffer assignment
METADATA_NAME = 20
METADATA_ORIGINAL_MODULE = 38
METADATA_ENVIRONMENT = 40  # google.protobuf.Any: 1 type_url, 2 value
FULL_OPTIONS = 4

# TpuVersionEnum of XLA's TPU C API (xla/stream_executor/tpu/c_api_decl.h)
TPU_VERSIONS = {1: "v2", 2: "v3", 3: "v4", 4: "v5"}


class UnknownLayout(UnsupportedFormat):
    """The bytes do not start like libtpu's executable: no verdict on them."""


@dataclass(frozen=True, slots=True)
class TpuChip:
    """The chip an executable was built for, as its program says."""

    version: int | None  # TpuVersionEnum
    variant: str | None  # "lite" on a v5e

    @property
    def label(self) -> str:
        """``TPU v5 lite`` (JAX's ``device_kind`` for the same chip), or the raw numbers."""
        name = TPU_VERSIONS.get(self.version or 0)
        gen = f"TPU {name}" if name else f"TPU (version enum {self.version})"
        return f"{gen} {self.variant}" if self.variant else gen


@dataclass(frozen=True)
class TpuExecutable:
    """What cachedoctor reads of one libtpu executable. Sizes are in bytes."""

    message_sizes: tuple[int, ...]
    chip: TpuChip | None
    module_name: str | None
    hlo_module: bytes | None  # the optimised HloModuleProto
    original_module: bytes | None  # the module before optimisation
    hlo_config: bytes | None  # HloModuleConfigProto
    compile_options: bytes | None  # CompileOptionsProto
    environment_type: str | None  # the Any's type URL: ...TpuCompilationEnvironment
    environment: bytes | None  # its value
    program_size: int  # the machine code


def read_messages(payload: Buffer) -> list[memoryview]:
    """The payload split into libtpu's six messages, or UnknownLayout / CorruptFormat.

    libtpu's layout is recognised by its shape: six length-delimited messages and nothing
    after them, or a first message that is a core program (a message naming a chip, field 12).
    Once recognised, anything that does not frame, or that leaves bytes, is damage, as it is
    to libtpu; a payload recognised neither way is unknown.
    """
    view = payload if isinstance(payload, memoryview) else memoryview(payload)
    parts, pos, problem = _frame(view)
    if problem is None and len(parts) == len(MESSAGES):
        return parts
    if not parts or not _is_core_program(parts[0]):
        raise UnknownLayout(
            f"not libtpu's six messages ({len(parts)} framed"
            f"{'' if problem is None else ', then ' + problem}), and no TPU program first"
        )
    if problem is not None:
        raise CorruptFormat(f"message {len(parts)} ({_name(len(parts))}) {problem}", pos)
    if len(parts) > len(MESSAGES):
        raise CorruptFormat(
            f"bytes left after the {len(MESSAGES)} messages (libtpu: leftover bytes after"
            " parsing all submessages)",
        )
    raise CorruptFormat(f"{len(parts)} of the {len(MESSAGES)} messages", pos)


def _frame(view: memoryview) -> tuple[list[memoryview], int, str | None]:
    """Split ``view`` into length-delimited parts: (parts, where it stopped, why, or None)."""
    parts: list[memoryview] = []
    pos, end = 0, len(view)
    while pos < end:
        try:
            length, start = wire.read_varint(view, pos, end)
        except wire.WireError as exc:
            return parts, pos, f"has no length: {exc}"
        if start + length > end:
            return parts, pos, f"claims {length} bytes but {end - start} remain"
        parts.append(view[start : start + length])
        pos = start + length
    return parts, pos, None


def _name(index: int) -> str:
    return MESSAGES[index] if index < len(MESSAGES) else "?"


def _is_core_program(message: memoryview) -> bool:
    """A TPU program: a message with machine code (field 8) and a chip (field 12)."""
    try:
        fields = wire.fields_by_number(message)
    except wire.WireError:
        return False
    chip = wire.first(fields, PROGRAM_CHIP)
    return chip is not None and not isinstance(chip, int) and PROGRAM_CODE in fields


def is_tpu_payload(payload: Buffer) -> bool:
    """Whether ``payload`` is in libtpu's layout (damaged or not)."""
    try:
        read_messages(payload)
    except UnknownLayout:
        return False
    except CorruptFormat:
        return True
    return True


def decode_tpu_executable(payload: Buffer) -> TpuExecutable:
    """Read libtpu's executable. Raises UnknownLayout, or CorruptFormat where libtpu would fail.

    Each message is parsed as libtpu parses it (its fields, and those of the messages whose
    schema is known: the HLO protos, the compile options, the environment), so what fails here
    fails in JAX too. Deeper damage inside fields whose schema is libtpu's own is not seen:
    such an entry is read as healthy, and JAX's warning then names it.
    """
    parts = read_messages(payload)
    fields = []
    for index, message in enumerate(parts):
        try:
            fields.append(wire.fields_by_number(message))
        except wire.WireError as exc:
            raise CorruptFormat(
                f"message {index} ({MESSAGES[index]}) does not parse: {exc}"
            ) from exc
    program, metadata = fields[CORE_PROGRAM], fields[COMPILER_METADATA]
    module, hlo_proto = None, _message(metadata, METADATA_HLO_PROTO, "compiler metadata's HloProto")
    if hlo_proto is not None:
        module = _bytes(_message(hlo_proto, 1, "the optimised module"), 1, hlo_proto)
        _message(hlo_proto, 3, "the buffer assignment")
    original = _message(metadata, METADATA_ORIGINAL_MODULE, "the original module")
    # an Any: its value is not parsed on load (seen: a damaged value loads)
    env_type, env = None, _message(metadata, METADATA_ENVIRONMENT, "the compilation environment")
    if env is not None:
        env_type = wire.as_str(wire.first(env, 1))
    with_config = fields[HLO_MODULE]
    _message(with_config, 1, "the hlo module's module")
    config = _message(with_config, 2, "the hlo module's config")
    options = _message(fields[FULL_PROTO], FULL_OPTIONS, "the compile options")
    code = wire.first(program, PROGRAM_CODE)
    return TpuExecutable(
        message_sizes=tuple(len(p) for p in parts),
        chip=_chip(program),
        module_name=wire.as_str(wire.first(metadata, METADATA_NAME)),
        hlo_module=module,
        original_module=_raw(metadata, METADATA_ORIGINAL_MODULE) if original is not None else None,
        hlo_config=_raw(with_config, 2) if config is not None else None,
        compile_options=_raw(fields[FULL_PROTO], FULL_OPTIONS) if options is not None else None,
        environment_type=env_type,
        environment=_raw(env, 2) if env is not None else None,
        program_size=len(code) if code is not None and not isinstance(code, int) else 0,
    )


def _message(
    fields: dict[int, list[wire.FieldValue]], number: int, what: str
) -> dict[int, list[wire.FieldValue]] | None:
    """Field ``number`` parsed as a message (libtpu parses it on load), or None if absent."""
    value = wire.first(fields, number)
    if value is None:
        return None
    if isinstance(value, int):
        raise CorruptFormat(f"{what} is a number where a message belongs")
    try:
        return wire.fields_by_number(value)
    except wire.WireError as exc:
        raise CorruptFormat(f"{what} does not parse: {exc}") from exc


def _bytes(
    parsed: dict[int, list[wire.FieldValue]] | None,
    number: int,
    parent: dict[int, list[wire.FieldValue]],
) -> bytes | None:
    if parsed is None:
        return None
    return _raw(parent, number)


def _raw(fields: dict[int, list[wire.FieldValue]] | None, number: int) -> bytes | None:
    value = None if fields is None else wire.first(fields, number)
    return None if value is None or isinstance(value, int) else bytes(value)


def _chip(program: dict[int, list[wire.FieldValue]]) -> TpuChip | None:
    value = wire.first(program, PROGRAM_CHIP)
    if value is None or isinstance(value, int):
        return None
    try:
        abi = wire.fields_by_number(value)
    except wire.WireError:
        return None
    return TpuChip(version=wire.as_int(wire.first(abi, 1)), variant=wire.as_str(wire.first(abi, 2)))
