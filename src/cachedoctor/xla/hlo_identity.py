"""What HLO normalisation removes from each line, read off the HloModuleProto: names, ids,
metadata (op_name, op_type, source location) and volatile backend configs.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachedoctor.formats import wire
from cachedoctor.xla import hlo as hlo_mod


@dataclass(frozen=True)
class _Identity:
    """What normalisation removes from one canonical line (a computation or an instruction)."""

    where: str
    name: str
    op_name: str | None = None
    op_type: str | None = None
    location: str | None = None
    config: str | None = None  # "target: value" for a volatile backend_config
    is_computation: bool = False
    id: int | None = None


def _frames(module_fields: dict[int, list[wire.FieldValue]]) -> dict[int, str]:
    """stack_frame_id -> ``file:line`` from the module's StackFrameIndexProto."""
    index = wire.first(module_fields, 17)
    if index is None or isinstance(index, int):
        return {}
    f = wire.fields_by_number(index)
    files = [wire.as_str(v) or "" for v in f.get(1, [])]
    locations = []
    for loc in f.get(3, []):
        if isinstance(loc, int):
            continue
        lf = wire.fields_by_number(loc)
        fid = wire.as_int(wire.first(lf, 1)) or 0
        line = wire.as_int(wire.first(lf, 3))
        name = files[fid - 1] if 0 < fid <= len(files) else "?"
        locations.append(f"{name}:{line}")  # as metadata.source_file:source_line
    out: dict[int, str] = {}
    for i, frame in enumerate(f.get(4, []), start=1):
        if isinstance(frame, int):
            continue
        loc_id = wire.as_int(wire.first(wire.fields_by_number(frame), 1)) or 0
        if 0 < loc_id <= len(locations):
            out[i] = locations[loc_id - 1]
    return out


def identities(module: bytes) -> list[_Identity]:
    """One record per line of ``hlo.canonicalize(module).lines``, in the same order."""
    f = wire.fields_by_number(module)
    frames = _frames(f)
    out: list[_Identity] = []
    for comp in f.get(3, []):
        if isinstance(comp, int):
            continue
        cf = wire.fields_by_number(comp)
        cname = wire.as_str(wire.first(cf, 1)) or ""
        cid = wire.as_int(wire.first(cf, 5))
        out.append(_Identity(cname, cname, is_computation=True, id=cid))
        for instr in cf.get(2, []):
            if isinstance(instr, int):
                continue
            inf = wire.fields_by_number(instr)
            iname = wire.as_str(wire.first(inf, 1)) or ""
            op_name = op_type = location = None
            md = wire.first(inf, 7)
            if md is not None and not isinstance(md, int):
                mf = wire.fields_by_number(md)
                op_type = wire.as_str(wire.first(mf, 1)) or None
                op_name = wire.as_str(wire.first(mf, 2)) or None
                source = wire.as_str(wire.first(mf, 3))
                line = wire.as_int(wire.first(mf, 4))
                frame = wire.as_int(wire.first(mf, 15))
                if source:
                    location = f"{source}:{line}"
                elif frame:
                    location = frames.get(frame, f"stack frame {frame}")
            target = wire.as_str(wire.first(inf, 28)) or ""
            config = wire.as_str(wire.first(inf, 43)) or ""
            volatile = (
                f"{target}: {config}"
                if config and hlo_mod.is_volatile_config(target, config)
                else None
            )
            out.append(_Identity(f"{cname}/{iname}", iname, op_name, op_type, location, volatile))
    return out


# HloModuleProto fields outside the computations (docs/format.md), and how diff classifies them.
MODULE_FIELDS = {
    1: ("numbering", "module name"),
    2: ("numbering", "entry computation name"),
    4: ("module-field", "host_program_shape"),
    5: ("numbering", "module id"),
    6: ("numbering", "entry computation id"),
    7: ("module-field", "schedule"),
    8: ("module-field", "input_output_alias"),
    15: ("module-field", "device_assignment"),
    17: ("metadata", "stack frame index"),
    18: ("module-field", "buffer_donor"),
    19: ("module-field", "frontend_attributes"),
    21: ("module-field", "device_type"),
    22: ("module-field", "payloads"),
    23: ("numbering", "pjrt id"),
}


def module_level_fields(module: bytes) -> dict[int, list[int | bytes]]:
    """Every top-level field of an HloModuleProto but its computations (field 3), raw."""
    return {
        number: [v if isinstance(v, int) else bytes(v) for v in values]
        for number, values in wire.fields_by_number(module).items()
        if number != 3
    }
