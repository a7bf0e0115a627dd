"""Read XLA ``HloModuleProto`` bytes: a summary for scans, and the canonical form used to tell
whether two entries hold the same program modulo volatile fields.

Normalisation lives here, once: ``scan`` groups entries by ``canonical_digest`` and ``diff`` shows
the canonical lines and the list of differences that normalisation removed.
"""

from __future__ import annotations

import gc
import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field

from cachedoctor.formats import wire

# xla.PrimitiveType (xla/xla_data.proto); stable numbers.
PRIMITIVE_TYPES = {
    1: "pred",
    2: "s8",
    3: "s16",
    4: "s32",
    5: "s64",
    6: "u8",
    7: "u16",
    8: "u32",
    9: "u64",
    10: "f16",
    11: "f32",
    12: "f64",
    13: "tuple",
    14: "opaque",
    15: "c64",
    16: "bf16",
    17: "token",
    18: "c128",
    19: "f8e5m2",
    20: "f8e4m3fn",
    21: "s4",
    22: "u4",
    23: "f8e4m3b11fnuz",
    24: "f8e5m2fnuz",
    25: "f8e4m3fnuz",
    26: "s2",
    27: "u2",
    28: "f8e4m3",
    29: "f8e3m4",
    30: "f8e8m0fnu",
    31: "f4e2m1fn",
    32: "s1",
    33: "u1",
}

# Custom-call targets whose backend_config holds a process-local address or registry index.
VOLATILE_CONFIG_TARGETS = frozenset(
    {
        "CustomSPMDPartitioning",
        "xla_python_cpu_callback",
        "xla_python_gpu_callback",
        "xla_ffi_python_cpu_callback",
        "xla_ffi_python_gpu_callback",
        "xla_ffi_partitioned_python_cpu_callback",
        "xla_ffi_partitioned_python_gpu_callback",
    }
)
# What a "custom-partitioning" VolatileField says.
CUSTOM_PARTITIONING_DETAIL = (
    "source metadata names a custom_partitioning op, whose CustomSPMDPartitioning "
    "backend_config (a Python object address) JAX hashes into the key"
)
_ADDRESS_LIKE = re.compile(r"^\s*\d{9,20}\s*$", re.ASCII)  # how Python prints an address

# HloInstructionProto fields that identify rather than define an instruction.
_INSTR_NAME, _INSTR_OPCODE, _INSTR_SHAPE, _INSTR_METADATA = 1, 2, 3, 7
_INSTR_CUSTOM_TARGET, _INSTR_ID, _INSTR_OPERANDS, _INSTR_CALLED = 28, 35, 36, 38
_INSTR_CONTROL_PREDS = 37
_INSTR_BACKEND_CONFIG = 43
_INSTR_STATISTICS = 99  # never hashed: profiling payloads, see docs/format.md
_NOT_DEFINING = frozenset(
    {
        _INSTR_NAME,
        _INSTR_OPCODE,
        _INSTR_SHAPE,
        _INSTR_METADATA,
        _INSTR_ID,
        _INSTR_OPERANDS,
        _INSTR_CALLED,
        _INSTR_CUSTOM_TARGET,
        _INSTR_BACKEND_CONFIG,
        _INSTR_CONTROL_PREDS,
        _INSTR_STATISTICS,
    }
)  # fields left out of an instruction's ``attrs`` hash (they are in the line, or volatile)


@dataclass(frozen=True, slots=True)
class CustomCall:
    target: str
    backend_config: str
    computation: str
    instruction: str


@dataclass(frozen=True, slots=True)
class VolatileField:
    """A difference that normalisation removes, classified for ``diff`` and findings."""

    # "backend_config-pointer" | "custom-partitioning" | "metadata" | "numbering"
    category: str
    where: str  # computation/instruction
    detail: str  # e.g. the raw backend_config value


@dataclass(frozen=True, slots=True)
class HloSummary:
    name: str
    entry_computation: str
    computations: int
    instructions: int
    parameters: tuple[str, ...]  # rendered shapes of the entry's parameters, in order
    result: str
    custom_calls: tuple[CustomCall, ...]
    opcodes: tuple[tuple[str, int], ...]  # most common first
    source_files: tuple[str, ...]


@dataclass(frozen=True)
class CanonicalHlo:
    """The module with names, ids and metadata removed and volatile configs masked."""

    lines: tuple[str, ...]
    digest: str
    volatile: tuple[VolatileField, ...] = field(default=())


def render_shape(buf: wire.Buffer) -> str:
    """ShapeProto -> ``f32[8,4]{1,0}`` (tuples as ``(a, b)``)."""
    f = wire.fields_by_number(buf)
    etype = wire.as_int(wire.first(f, 2)) or 0
    if etype == 13:  # TUPLE
        parts = [render_shape(t) for t in f.get(4, []) if not isinstance(t, int)]
        return "(" + ", ".join(parts) + ")"
    dims: list[int] = []
    for v in f.get(3, []):
        dims.extend(wire.as_sint(d) for d in wire.packed_varints(v))
    text = f"{PRIMITIVE_TYPES.get(etype, f'type{etype}')}[{','.join(map(str, dims))}]"
    layout = wire.first(f, 5)
    if layout is not None and not isinstance(layout, int):
        lf = wire.fields_by_number(layout)
        mtm: list[int] = []
        for v in lf.get(1, []):
            mtm.extend(wire.packed_varints(v))
        if dims:
            text += "{" + ",".join(map(str, mtm)) + "}"
    return text


def program_shape(buf: wire.Buffer) -> tuple[tuple[str, ...], str]:
    f = wire.fields_by_number(buf)
    params = tuple(render_shape(p) for p in f.get(1, []) if not isinstance(p, int))
    result = wire.first(f, 2)
    return params, render_shape(result) if result is not None and not isinstance(
        result, int
    ) else ""


def names_custom_partitioning(metadata: wire.FieldValue) -> bool:
    """Whether an instruction's ``OpMetadata.op_name`` says a ``custom_partitioning`` made it.

    The stored module is partitioned, so the ``CustomSPMDPartitioning`` call is gone; its
    output keeps the op's name (``jit(f)/custom_partitioning``) in the source metadata.
    """
    if isinstance(metadata, int):
        return False
    try:
        op_name = wire.as_str(wire.first(wire.fields_by_number(metadata), 2)) or ""
    except wire.WireError:
        return False
    return "custom_partitioning" in op_name.split("/")


# The primitives whose lowering reads jax_default_matmul_precision (jax lax's
# canonicalize_precision), and the instructions that may hold one: a custom call's body may.
PRECISION_PRIMITIVES = ("dot_general", "ragged_dot_general", "conv_general_dilated")
PRECISION_OPCODES = frozenset({"dot", "convolution", "ragged-dot", "custom-call"})


def precision_op(module: wire.Buffer) -> str | None:
    """The first instruction of a compiled module that the matmul precision setting may have
    changed, in words, or None when there is none: no dot, convolution or custom call, and no
    instruction whose source metadata names a primitive that takes the precision. XLA keeps
    JAX's op name on what it rewrites an instruction into (a small dot becomes a multiply and
    a reduce named ``jit(f)/dot_general``). Raises WireError on malformed bytes."""
    for _fields, instructions in _parse(module).computations:
        for fields in instructions:
            f = _by_number(fields)
            opcode = wire.as_str(wire.first(f, 2)) or ""
            if opcode in PRECISION_OPCODES:
                return f"a {opcode} instruction"
            metadata = wire.first(f, 7)
            if metadata is None or isinstance(metadata, int):
                continue
            op_name = wire.as_str(wire.first(wire.fields_by_number(metadata), 2)) or ""
            if any(p in op_name for p in PRECISION_PRIMITIVES):
                return f"a {opcode} instruction JAX named {op_name}"
    return None


def is_volatile_config(target: str, config: str) -> bool:
    return target in VOLATILE_CONFIG_TARGETS or bool(_ADDRESS_LIKE.match(config))


Fields = list[tuple[int, int, wire.FieldValue]]


@dataclass(frozen=True, slots=True)
class _ParsedModule:
    """A module's fields, and each computation's fields with its instructions' field lists."""

    fields: dict[int, list[wire.FieldValue]]
    computations: list[tuple[dict[int, list[wire.FieldValue]], list[Fields]]]


def _parse(module: wire.Buffer) -> _ParsedModule:
    f = wire.fields_by_number(module)
    comps = []
    for comp in f.get(3, []):
        if isinstance(comp, int):
            continue
        cf = wire.fields_by_number(comp)
        comps.append((cf, [wire.field_list(i) for i in cf.get(2, []) if not isinstance(i, int)]))
    return _ParsedModule(f, comps)


def module_facts(module: wire.Buffer) -> tuple[HloSummary, CanonicalHlo]:
    """``summarize`` and ``canonicalize`` of one module, parsing its instructions once (what a
    scan needs of each distinct module). Raises WireError on malformed bytes.

    The cyclic garbage collector is paused meanwhile: a large module holds millions of field
    tuples at once, none in a cycle, and the collector's passes over them cost more than the
    walk itself (0.39 against 0.62 of two separate walks, same process, measured).
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        parsed = _parse(module)
        return _summary(parsed), _canonical(module, parsed)
    finally:
        if collecting:
            gc.enable()


def summarize(module: wire.Buffer) -> HloSummary:
    """Summarise an HloModuleProto. Raises WireError on malformed bytes."""
    return _summary(_parse(module))


def _summary(parsed: _ParsedModule) -> HloSummary:
    f = parsed.fields
    name = wire.as_str(wire.first(f, 1)) or ""
    entry = wire.as_str(wire.first(f, 2)) or ""
    opcodes: Counter[str] = Counter()
    custom: list[CustomCall] = []
    params: tuple[str, ...] = ()
    result = ""
    for cf, instrs in parsed.computations:
        cname = wire.as_str(wire.first(cf, 1)) or ""
        for fields in instrs:
            opcode = None
            for number, _wt, value in fields:
                if number == _INSTR_OPCODE:
                    opcode = value  # the last occurrence wins
            op = wire.as_str(opcode) or "?"
            opcodes[op] += 1
            if op == "custom-call":
                inf = _by_number(fields)
                custom.append(
                    CustomCall(
                        target=wire.as_str(wire.first(inf, _INSTR_CUSTOM_TARGET)) or "",
                        backend_config=wire.as_str(wire.first(inf, _INSTR_BACKEND_CONFIG)) or "",
                        computation=cname,
                        instruction=wire.as_str(wire.first(inf, _INSTR_NAME)) or "",
                    )
                )
        if cname == entry:
            ps = wire.first(cf, 4)
            if ps is not None and not isinstance(ps, int):
                params, result = program_shape(ps)
    if not params and not result:
        host = wire.first(f, 4)
        if host is not None and not isinstance(host, int):
            params, result = program_shape(host)
    return HloSummary(
        name=name,
        entry_computation=entry,
        computations=len(parsed.computations),
        instructions=sum(opcodes.values()),
        parameters=params,
        result=result,
        custom_calls=tuple(custom),
        opcodes=tuple(opcodes.most_common()),
        source_files=_source_files(f),
    )


def _by_number(fields: Fields) -> dict[int, list[wire.FieldValue]]:
    out: dict[int, list[wire.FieldValue]] = {}
    for number, _wt, value in fields:
        out.setdefault(number, []).append(value)
    return out


def _source_files(f: dict[int, list[wire.FieldValue]]) -> tuple[str, ...]:
    """File names from the module's StackFrameIndexProto (field 17), if present."""
    index = wire.first(f, 17)
    if index is None or isinstance(index, int):
        return ()
    names = wire.fields_by_number(index).get(1, [])
    return tuple(wire.as_str(n) or "" for n in names)


def canonicalize(module: wire.Buffer) -> CanonicalHlo:
    """Canonical lines of a module: one per instruction, in order, without names, ids, metadata.

    Operands and called computations are written as positions, so renumbering between runs
    disappears; volatile custom-call configs become ``<volatile>`` and are listed in ``volatile``.
    """
    return _canonical(module, _parse(module))


def _canonical(module: wire.Buffer, parsed: _ParsedModule) -> CanonicalHlo:
    f = parsed.fields
    comp_index: dict[int, int] = {}
    for ci, (cf, _instrs) in enumerate(parsed.computations):
        comp_index[wire.as_int(wire.first(cf, 5)) or -1 - ci] = ci
    entry = wire.as_str(wire.first(f, 2)) or ""
    lines: list[str] = []
    volatile: list[VolatileField] = []
    with_metadata = 0
    partitioned_by_python = False
    named = 0
    shapes: dict[bytes, str] = {}  # a module repeats few distinct shapes: render each once
    for ci, (cf, instrs) in enumerate(parsed.computations):
        cname = wire.as_str(wire.first(cf, 1)) or ""
        marker = " ENTRY" if cname == entry else ""
        lines.append(f"computation c{ci}{marker}:")
        local: dict[int, int] = {}
        for ii, fields in enumerate(instrs):
            instr_id: wire.FieldValue | None = None
            for number, _wt, value in fields:
                if number == _INSTR_ID:
                    instr_id = value
            local[wire.as_int(instr_id) or -1 - ii] = ii
        root_id = wire.as_int(wire.first(cf, 6))
        for ii, fields in enumerate(instrs):
            line, name, masked_config, metadata = _canonical_line(
                ii, fields, root_id, local, comp_index, shapes
            )
            named += 1
            where = f"{cname}/{wire.as_str(name) or ''}"
            if masked_config is not None:
                volatile.append(VolatileField("backend_config-pointer", where, masked_config))
            if metadata is not None:
                with_metadata += 1
                if not partitioned_by_python and names_custom_partitioning(metadata):
                    partitioned_by_python = True
                    volatile.append(
                        VolatileField(
                            "custom-partitioning",
                            where,
                            CUSTOM_PARTITIONING_DETAIL,
                        )
                    )
            lines.append(line)
    lines.append(f"module attrs={_module_attrs_digest(module)}")
    if with_metadata:
        volatile.append(
            VolatileField("metadata", "module", f"source metadata of {with_metadata} instructions")
        )
    if named:
        volatile.append(
            VolatileField("numbering", "module", f"names and ids of {named} instructions")
        )
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return CanonicalHlo(lines=tuple(lines), digest=digest, volatile=tuple(volatile))


def _canonical_line(
    index: int,
    fields: Fields,
    root_id: int | None,
    local: dict[int, int],
    comp_index: dict[int, int],
    shapes: dict[bytes, str],
) -> tuple[str, wire.FieldValue | None, str | None, wire.FieldValue | None]:
    """One instruction's canonical line, from one pass over its fields (the hot loop of a scan).

    Returns the line, the instruction's name, the masked backend_config (``target: config``)
    when it was volatile, and its source metadata (OpMetadata) if any. Repeated singular
    fields: the last occurrence wins.
    """
    name = opcode = shape_buf = target_value = config_value = instr_id = metadata = None
    operand_values: list[wire.FieldValue] = []
    called_values: list[wire.FieldValue] = []
    rest: list[bytes] = []  # one hash of the concatenation == the incremental hash
    for number, _wt, value in fields:
        if number not in _NOT_DEFINING:
            rest.append(number.to_bytes(4, "little"))
            rest.append(
                bytes(value) if not isinstance(value, int) else value.to_bytes(16, "little")
            )
        elif number == _INSTR_OPERANDS:
            operand_values.append(value)
        elif number == _INSTR_OPCODE:
            opcode = value
        elif number == _INSTR_SHAPE:
            shape_buf = value
        elif number == _INSTR_NAME:
            name = value
        elif number == _INSTR_ID:
            instr_id = value
        elif number == _INSTR_METADATA:
            metadata = value
        elif number == _INSTR_CALLED:
            called_values.append(value)
        elif number == _INSTR_CUSTOM_TARGET:
            target_value = value
        elif number == _INSTR_BACKEND_CONFIG:
            config_value = value
    op = wire.as_str(opcode) or "?"
    shape = ""
    if shape_buf is not None and not isinstance(shape_buf, int):
        shape_key = bytes(shape_buf)
        shape = shapes.get(shape_key) or shapes.setdefault(shape_key, render_shape(shape_buf))
    operands: list[str] = []
    for v in operand_values:
        operands.extend(f"%{local.get(wire.as_sint(o), '?')}" for o in wire.packed_varints(v))
    called: list[str] = []
    for v in called_values:
        called.extend(f"c{comp_index.get(wire.as_sint(o), '?')}" for o in wire.packed_varints(v))
    target = wire.as_str(target_value) or ""
    config = wire.as_str(config_value) or ""
    masked: str | None = None
    if config and is_volatile_config(target, config):
        masked = f"{target}: {config}"
        config = "<volatile>"
    root = " ROOT" if wire.as_int(instr_id) == root_id else ""
    line = f"  %{index}{root} = {shape} {op}({', '.join(operands)})"
    if called:
        line += f" calls={','.join(called)}"
    if target:
        line += f" target={target!r}"
    if config:
        line += f" config={config!r}"
    line += f" attrs={hashlib.sha256(b''.join(rest)).hexdigest()[:12]}"
    return line, name, masked, metadata


# HloModuleProto fields left out of the canonical form: names and ids (1, 2, 5, 6, 23), the
# computations (walked above), the schedule (instruction ids), stack frames (source metadata).
_MODULE_IDENTITY_FIELDS = frozenset({1, 2, 3, 5, 6, 7, 17, 23})


def _module_attrs_digest(module: wire.Buffer) -> str:
    """Digest of module-level fields that change what runs: aliasing, donation, shapes..."""
    digest = hashlib.sha256()
    for number, _wt, value in wire.field_list(module):
        if number in _MODULE_IDENTITY_FIELDS:
            continue
        digest.update(number.to_bytes(4, "little"))
        digest.update(bytes(value) if not isinstance(value, int) else value.to_bytes(16, "little"))
    return digest.hexdigest()[:16]


# jaxlib sizes its tables by the largest id and count a module holds: one flipped bit in a stored
# instruction's id made it allocate about 8 GB for a 2.4 KB entry. The text is rendered in a
# child process whose private memory is capped (RLIMIT_DATA: the heap and anonymous maps, not
# the libraries it loads), so a hostile or damaged module costs at most this much.
RENDER_MEMORY_CAP = 2 << 30
_RENDER = """
import resource, sys
cap = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
from jax._src.lib import xla_client
module = sys.stdin.buffer.read()
try:
    text = xla_client.XlaComputation(module).as_hlo_text()
except MemoryError:
    sys.exit(3)
sys.stdout.write(text)
"""


# what a child stopped at its memory cap says (Python, the C++ runtime, the loader, the kernel)
_OUT_OF_MEMORY = ("MemoryError", "bad_alloc", "failed to map segment", "Cannot allocate memory")


@dataclass(frozen=True)
class Rendered:
    """The HLO text jaxlib rendered, or why there is none."""

    text: str | None
    refused: str | None = None  # what was refused and why, in words


def render_hlo(module: bytes, *, memory_cap: int = RENDER_MEMORY_CAP) -> Rendered:
    """Real HLO text through the installed jaxlib, in a child process capped at ``memory_cap``
    bytes of private memory; a module that needs more is refused and said so."""
    import subprocess
    import sys

    cap = memory_cap + 64 * len(module)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RENDER, str(cap)],
            input=module,
            capture_output=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Rendered(None, f"jaxlib's renderer did not finish ({type(exc).__name__})")
    if done.returncode == 0:
        return Rendered(done.stdout.decode("utf-8", "replace"))
    err = done.stderr.decode("utf-8", "replace")
    if done.returncode == 3 or done.returncode < 0 or any(m in err for m in _OUT_OF_MEMORY):
        return Rendered(
            None,
            f"refused: jaxlib would need more than {cap >> 20} MiB of memory to render this"
            " module (it sizes its tables by the largest id and count the module holds: one"
            " of them is out of range, a damaged or hostile entry)",
        )
    last = next((line for line in reversed(err.splitlines()) if line.strip()), "")
    return Rendered(None, f"jaxlib could not render this module: {last[:200]}")


def hlo_text(module: bytes) -> str | None:
    """Real HLO text through the installed jaxlib, or None when it cannot (``render_hlo`` says
    why)."""
    return render_hlo(module).text
