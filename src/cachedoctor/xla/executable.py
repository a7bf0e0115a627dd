"""The top-level fields of serialized CPU and GPU executables (docs/format.md, format-gpu.md),
which CPU fields date an XLA revision, and the CPU target machine options (field 9).
"""

from __future__ import annotations

from cachedoctor.formats import wire

# Top-level fields of the serialized executable (docs/format.md and docs/format-gpu.md).
CPU_EXECUTABLE_FIELDS = {
    1: "HLO module and config",
    2: "buffer assignment",
    3: "entry function name",
    4: "object code",
    5: "object files kind",
    6: "thunk sequence",
    7: "compiled symbols",
    8: "object files",
    9: "target machine",
    10: "data layout",
}


GPU_EXECUTABLE_FIELDS = {
    1: "HLO module and config",
    2: "buffer assignment",
    3: "PTX",
    4: "cubin",
    5: "cuDNN graphs",
    6: "compute capability",
    7: "thunk",
    8: "module name",
    9: "program shape",
    10: "buffer allocations",
    11: "output info",
    12: "constants",
    13: "thunks",
    14: "executable ABI version",
    15: "CPU target machine",
}


# The fields whose bytes make an executable's size, as `show` and `scan` list them by section
CPU_SIZE_SECTIONS = {n: CPU_EXECUTABLE_FIELDS[n] for n in (4, 8, 6, 2)}
GPU_SIZE_SECTIONS = {n: GPU_EXECUTABLE_FIELDS[n] for n in (3, 4, 5, 2, 13, 12)}


# CPU executable fields that exist only from (or until) one XLA revision (docs/format.md): one
# entry having such a field and the other not means two XLA versions wrote them.
CPU_FIELD_HISTORY = {
    4: "object code as field 4 (XLA up to 2025-06)",
    8: "object_files (XLA from 2025-06)",
    9: "target_machine_options (XLA from 2025-10-27)",
    10: "data_layout (XLA from 2026-03-24)",
}


def cpu_layout_eras(na: set[int], nb: set[int]) -> list[str]:
    """CPU executable fields that show two XLA eras, as "X only in A" lines; [] when none do.

    A field one side lacks is not evidence by itself: an empty repeated field is not written
    (a trivial module has no object files). Only a field the other side's era cannot write
    counts: field 4 (object code, up to 2025-06) beside field 8 (object_files, from then on),
    or a later-era field (9, 10) beside the old field 4.
    """
    out = []
    for this, other, side in ((na, nb, "A"), (nb, na, "B")):
        if 4 in this and 8 in other:
            out.append(f"{CPU_FIELD_HISTORY[4]} only in {side}")
        if 4 in other and 4 not in this:
            out += [f"{CPU_FIELD_HISTORY[n]} only in {side}" for n in sorted({9, 10} & this)]
    return sorted(set(out))


CPU_TARGET_MACHINE_FIELD = 9  # TargetMachineOptionsProto: triple, cpu, comma-separated features


def cpu_target_machine(data: bytes) -> tuple[str | None, str | None, frozenset[str]] | None:
    """(triple, cpu, features) of a CPU executable's target machine options; None if malformed."""
    try:
        f = wire.fields_by_number(data)
    except wire.WireError:
        return None
    features = wire.as_str(wire.first(f, 3)) or ""
    return (
        wire.as_str(wire.first(f, 1)),
        wire.as_str(wire.first(f, 2)),
        frozenset(x for x in features.split(",") if x),
    )
