"""Explain why two cache entries are two entries: the core of ``cachedoctor diff``.

``diff_entries(a, b)`` returns a frozen :class:`DiffReport` whose first field is the verdict: the
same executable under two keys (key instability), the same program with different compile
options, different programs, or different JAX/platform/target/topology. Every statement names
the data it comes from; nothing here guesses a cause the entries do not show.

What an entry holds is the *compiled* module and the compile options, not the pre-compilation
module that JAX hashes into the key. When the stable-key hook recorded key manifests
(``stablekeys.manifest``), the key's components are compared too; otherwise the report says so.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cachedoctor.cache import listdir, locate, reader
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.commands.plaindata import ToDict
from cachedoctor.errors import CachedoctorError, EntryNotFoundError
from cachedoctor.formats import wire
from cachedoctor.stablekeys.manifest import load_ir, load_manifest
from cachedoctor.storage import stores, urls
from cachedoctor.xla import compile_options, optionschema
from cachedoctor.xla import hlo as hlo_mod

DEFAULT_CONTEXT = 3
MAX_EXAMPLES = 50  # removed-value differences kept per kind (the count is always exact)

NO_MANIFEST = (
    "no manifest: the pre-compilation module is not recorded; "
    "this diff uses only what the entries hold"
)
ENABLE_ADVICE = "`cachedoctor enable` keys entries by a stable hash of what the program does"

# DebugOptions fields derived from the cache directory (docs/format.md): a different value with
# the same last component means the cache was moved or copied.
CACHE_PATH_FIELDS = {
    compile_options.DEBUG_AUTOTUNE_DIR,
    compile_options.DEBUG_KERNEL_CACHE_FILE,
    compile_options.DEBUG_AUTOTUNER_CACHE_DIR,
}
# DebugOptions fields JAX clears before hashing (jax/_src/cache_key.py), see docs/format.md.
CLEARED_BY_JAX = {compile_options.DEBUG_DUMP_TO, compile_options.DEBUG_AUTOTUNE_MODE, 61}
_DEBUG_PATHS = {(3, 3): "compile_options", (14,): "module_config"}

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
# CPU executable fields that exist only from (or until) one XLA revision (docs/format.md): one
# entry having such a field and the other not means two XLA versions wrote them.
CPU_FIELD_HISTORY = {
    4: "object code as field 4 (XLA up to 2025-06)",
    8: "object_files (XLA from 2025-06)",
    9: "target_machine_options (XLA from 2025-10-27)",
    10: "data_layout (XLA from 2026-03-24)",
}


def _cpu_layout_eras(na: set[int], nb: set[int]) -> list[str]:
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


class VerdictKind(enum.StrEnum):
    IDENTICAL = "identical"
    SAME_EXECUTABLE = "same-executable"
    SAME_PROGRAM = "same-program"
    DIFFERENT_PLATFORM = "different-platform"
    DIFFERENT_JAX = "different-jax"
    DIFFERENT_TOPOLOGY = "different-topology"
    DIFFERENT_TARGET = "different-target"
    DIFFERENT_PROGRAM = "different-program"
    DIFFERENT_OPTIONS = "different-options"


@dataclass(frozen=True)
class Verdict:
    """The one-line answer, the statements behind it, and what to do."""

    kind: VerdictKind
    line: str
    because: tuple[str, ...]
    advice: str | None
    equivalent: bool  # identical modulo volatile fields (exit 0)


@dataclass(frozen=True)
class EntrySide:
    key: str
    module: str | None
    path: str
    cache_dir: str
    format: str
    platform: str
    size: int
    decompressed_size: int | None
    compile_time_s: int | None
    mtime_ns: int
    executable_digest: str | None
    program_digest: str | None


@dataclass(frozen=True)
class ComponentDiff:
    """One input of the cache key, as recorded in both manifests."""

    name: str
    same: bool
    a_digest: str | None
    b_digest: str | None
    a: str | None = None  # the recorded value, rendered, when small enough to be recorded
    b: str | None = None
    fields: tuple[optionschema.FieldDiff, ...] = ()  # for compile_options: which fields


@dataclass(frozen=True)
class VolatileInput:
    """A volatile key input the hook canonicalised (e.g. a custom_partitioning pointer)."""

    field: str
    a_raw: str | None
    b_raw: str | None
    a_canonical: str | None
    b_canonical: str | None


@dataclass(frozen=True)
class ManifestSection:
    available: bool
    note: str
    stable_keys: tuple[str | None, str | None] = (None, None)
    jax_keys: tuple[str | None, str | None] = (None, None)
    components: tuple[ComponentDiff, ...] = ()
    volatile: tuple[VolatileInput, ...] = ()
    versions: tuple[tuple[str, str | None, str | None], ...] = ()  # name, a, b (differing only)
    ir_diff: tuple[str, ...] = ()  # unified diff of the recorded canonical modules
    backend_configs: tuple[tuple[str, str, str], ...] = ()  # target, a, b from the IR text


@dataclass(frozen=True)
class OptionsSection:
    compile_options: tuple[optionschema.FieldDiff, ...]
    module_config: tuple[optionschema.FieldDiff, ...]  # the executable's effective config
    ifrt_header: tuple[optionschema.FieldDiff, ...]
    names_from: str


@dataclass(frozen=True)
class RemovedDiff:
    """A difference that HLO normalisation removed, with both real values."""

    category: str  # backend_config-pointer | metadata | numbering
    what: str  # e.g. "instruction name", "source location", "op_name"
    where: str  # computation/instruction, named as in A
    a: str
    b: str


@dataclass(frozen=True)
class HloSection:
    available: bool
    same_canonical: bool
    instructions: tuple[int, int]
    changed_instructions: int
    parameters: tuple[tuple[str, ...], tuple[str, ...]]
    results: tuple[str, str]
    canonical_diff: tuple[str, ...]
    removed_counts: tuple[tuple[str, str, int], ...]  # category, what, count
    removed: tuple[RemovedDiff, ...]  # examples, at most MAX_EXAMPLES per (category, what)
    raw_diff: tuple[str, ...] | None = None
    note: str | None = None


@dataclass(frozen=True)
class SectionDiff:
    name: str
    number: int | None
    a_size: int | None
    b_size: int | None
    same: bool
    scalar: bool = False  # a varint field (e.g. object files kind): no size


@dataclass(frozen=True)
class BytesSection:
    identical: bool
    sections: tuple[SectionDiff, ...]


@dataclass(frozen=True)
class DiffReport(ToDict):
    verdict: Verdict
    a: EntrySide
    b: EntrySide
    manifest: ManifestSection
    options: OptionsSection
    hlo: HloSection
    executable: BytesSection

    @property
    def equivalent(self) -> bool:
        return self.verdict.equivalent


@dataclass(frozen=True)
class ModuleDiffReport(ToDict):
    """Every entry of one module against the most recent one."""

    module: str
    cache_dir: str
    latest: str | None
    reports: tuple[DiffReport, ...] = field(default=())
    undecodable: tuple[str, ...] = ()  # "key: why" for entries left out of the comparison

    @property
    def equivalent(self) -> bool:
        return not self.undecodable and all(r.equivalent for r in self.reports)


# --- loading --------------------------------------------------------------------------------


def load_detail(path: str | os.PathLike[str]) -> EntryDetail:
    """Decode one entry for diffing; raises CachedoctorError (one line) when it is unusable."""
    p = Path(path)
    if p.is_symlink():
        raise CachedoctorError(f"{p} is a symbolic link; not followed", slug="symlink")
    if not p.is_file():
        raise EntryNotFoundError(f"not a cache entry file: {p}")
    detail = reader.decode_entry(os.path.abspath(p), detail=True)
    assert isinstance(detail, EntryDetail)
    return _usable(detail, str(p))


def load_from_store(ref: str, cache_dir: str | None) -> EntryDetail:
    """Decode an entry in a bucket: ``ref`` is its URL, or a key/prefix in ``cache_dir`` (a URL)."""
    store, item = locate.locate_in_store(ref, cache_dir)
    return _load_item(store, item)


def _load_item(store: stores.Store, item: listdir.DirItem) -> EntryDetail:
    url = store.url_of(item.name)
    with stores.one_line_errors(url):
        detail = reader.decode_item(store, item, detail=True)
    assert isinstance(detail, EntryDetail)
    return _usable(detail, url)


def _usable(detail: EntryDetail, where: str) -> EntryDetail:
    if detail.info.problems:
        problem = detail.info.problems[0]
        slug = "unsupported" if problem.kind == "unsupported" else "corrupt"
        raise CachedoctorError(f"cannot diff {where}: {problem.kind}: {problem.message}", slug=slug)
    return detail


def _parent(path: str) -> str:
    """The cache directory of an entry path or URL (``Path`` would collapse ``gs://``)."""
    if urls.is_url(path):
        return path.rstrip("/").rpartition("/")[0]
    return str(Path(path).parent)


def _side(info: EntryInfo) -> EntrySide:
    return EntrySide(
        key=info.key,
        module=info.module,
        path=info.path,
        cache_dir=_parent(info.path),
        format=info.format_label,
        platform=info.platform,
        size=info.size,
        decompressed_size=info.decompressed_size,
        compile_time_s=info.compile_time_s,
        mtime_ns=info.mtime_ns,
        executable_digest=info.executable_digest,
        program_digest=info.program_digest,
    )


# --- compile options ----------------------------------------------------------------------------


def _options_section(a: EntryDetail, b: EntryDetail) -> OptionsSection:
    sch = optionschema.schema()

    def diff(x: bytes | None, y: bytes | None, message: str) -> tuple[optionschema.FieldDiff, ...]:
        if x == y:
            return ()
        try:
            return tuple(optionschema.diff_messages(x, y, message, sch))
        except wire.WireError as exc:
            return (optionschema.FieldDiff("(malformed)", (), str(exc), str(exc), False),)

    return OptionsSection(
        compile_options=diff(a.compile_options, b.compile_options, optionschema.COMPILE_OPTIONS),
        module_config=diff(a.hlo_config, b.hlo_config, optionschema.MODULE_CONFIG),
        ifrt_header=diff(a.ifrt_header, b.ifrt_header, optionschema.IFRT_METADATA),
        names_from=sch.source,
    )


def _debug_field(d: optionschema.FieldDiff) -> int | None:
    """The DebugOptions field number of a compile-options or module-config difference."""
    if len(d.numbers) == 3 and d.numbers[:2] == (3, 3):
        return d.numbers[2]
    if len(d.numbers) == 2 and d.numbers[0] == 14:
        return d.numbers[1]
    return None


def is_relocation(d: optionschema.FieldDiff) -> bool:
    """A cache-dir-derived path that differs only above its last component."""
    number = _debug_field(d)
    if number not in CACHE_PATH_FIELDS or not d.a or not d.b:
        return False
    return os.path.basename(d.a.rstrip("/")) == os.path.basename(d.b.rstrip("/"))


def _is_volatile_option(d: optionschema.FieldDiff) -> bool:
    return is_relocation(d) or _debug_field(d) in CLEARED_BY_JAX


# --- HLO ------------------------------------------------------------------------------------


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


def _pairs(
    a_lines: Sequence[str], b_lines: Sequence[str], matcher: difflib.SequenceMatcher[str]
) -> list[tuple[int, int]]:
    """Aligned line pairs: equal blocks, and replaced blocks of the same length."""
    out = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            out += list(zip(range(i1, i2), range(j1, j2), strict=True))
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


def _module_fields(a_mod: bytes, b_mod: bytes) -> list[RemovedDiff]:
    """Module-level fields that differ; the canonical lines hold only the computations."""
    fa, fb = wire.fields_by_number(a_mod), wire.fields_by_number(b_mod)
    out = []
    for number in sorted((set(fa) | set(fb)) - {3}):
        va, vb = fa.get(number, []), fb.get(number, [])
        raw_a = [v if isinstance(v, int) else bytes(v) for v in va]
        raw_b = [v if isinstance(v, int) else bytes(v) for v in vb]
        if raw_a == raw_b:
            continue
        category, what = MODULE_FIELDS.get(number, ("module-field", f"field {number}"))
        out.append(RemovedDiff(category, what, "module", _short(raw_a), _short(raw_b)))
    return out


def _short(values: list[int | bytes]) -> str:
    if not values:
        return "(unset)"
    parts = []
    for v in values:
        if isinstance(v, int):
            parts.append(str(v))
        elif v.isascii() and v.decode("ascii").isprintable() and len(v) <= 80:
            parts.append(v.decode("ascii"))
        else:
            parts.append(f"<{len(v)} bytes sha256:{hashlib.sha256(v).hexdigest()[:12]}>")
    return parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"


def _removed(
    a_mod: bytes, b_mod: bytes, pairs: list[tuple[int, int]], n_a: int, n_b: int
) -> tuple[list[RemovedDiff], str | None]:
    ia, ib = identities(a_mod), identities(b_mod)
    if len(ia) != n_a or len(ib) != n_b:
        return [], "could not align removed values with the canonical lines"
    out = _module_fields(a_mod, b_mod)
    for i, j in pairs:
        x, y = ia[i], ib[j]
        kind = "computation name" if x.is_computation else "instruction name"
        if x.name != y.name:
            out.append(RemovedDiff("numbering", kind, x.where, x.name, y.name))
        if x.id != y.id:
            id_kind = "computation id" if x.is_computation else "instruction id"
            out.append(RemovedDiff("numbering", id_kind, x.where, str(x.id), str(y.id)))
        if x.is_computation:
            continue
        for what, va, vb in (
            ("source location", x.location, y.location),
            ("op_name", x.op_name, y.op_name),
            ("op_type", x.op_type, y.op_type),
        ):
            if va != vb:
                out.append(RemovedDiff("metadata", what, x.where, va or "-", vb or "-"))
        if x.config != y.config:
            out.append(
                RemovedDiff(
                    "backend_config-pointer",
                    "backend_config",
                    x.where,
                    x.config or "-",
                    y.config or "-",
                )
            )
    return out, None


def _hlo_section(a: EntryDetail, b: EntryDetail, context: int, raw: bool) -> HloSection:
    if a.hlo_module is None or b.hlo_module is None or a.info.hlo is None or b.info.hlo is None:
        return HloSection(
            False,
            False,
            (0, 0),
            0,
            ((), ()),
            ("", ""),
            (),
            (),
            (),
            note="an entry holds no readable HLO module",
        )
    ca, cb = hlo_mod.canonicalize(a.hlo_module), hlo_mod.canonicalize(b.hlo_module)
    matcher = difflib.SequenceMatcher(None, ca.lines, cb.lines, autojunk=False)
    changed_a = changed_b = 0  # per side, so that "N of M instructions" never exceeds M
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            changed_a += sum(1 for line in ca.lines[i1:i2] if line.startswith("  %"))
            changed_b += sum(1 for line in cb.lines[j1:j2] if line.startswith("  %"))
    changed = max(changed_a, changed_b)
    udiff = tuple(
        difflib.unified_diff(
            ca.lines, cb.lines, "A (canonical)", "B (canonical)", n=context, lineterm=""
        )
    )
    removed, note = _removed(
        a.hlo_module,
        b.hlo_module,
        _pairs(ca.lines, cb.lines, matcher),
        len(ca.lines),
        len(cb.lines),
    )
    counts = Counter((r.category, r.what) for r in removed)
    kept: list[RemovedDiff] = []
    seen: Counter[tuple[str, str]] = Counter()
    for r in removed:
        seen[(r.category, r.what)] += 1
        if seen[(r.category, r.what)] <= MAX_EXAMPLES:
            kept.append(r)
    raw_diff: tuple[str, ...] | None = None
    if raw:
        ta, tb = hlo_mod.hlo_text(a.hlo_module), hlo_mod.hlo_text(b.hlo_module)
        if ta is None or tb is None:
            raw_diff = ("(the installed jaxlib could not render the HLO text)",)
        else:
            raw_diff = tuple(
                difflib.unified_diff(
                    ta.splitlines(),
                    tb.splitlines(),
                    "A (HLO text)",
                    "B (HLO text)",
                    n=context,
                    lineterm="",
                )
            )
    return HloSection(
        available=True,
        same_canonical=ca.digest == cb.digest,
        instructions=(a.info.hlo.instructions, b.info.hlo.instructions),
        changed_instructions=changed,
        parameters=(a.info.hlo.parameters, b.info.hlo.parameters),
        results=(a.info.hlo.result, b.info.hlo.result),
        canonical_diff=udiff,
        removed_counts=tuple((c, w, n) for (c, w), n in sorted(counts.items())),
        removed=tuple(kept),
        raw_diff=raw_diff,
        note=note,
    )


# --- executable bytes ---------------------------------------------------------------------------


def _executable_section(a: EntryDetail, b: EntryDetail) -> BytesSection:
    names = GPU_EXECUTABLE_FIELDS if a.info.platform == "gpu" else CPU_EXECUTABLE_FIELDS
    fa = {d.number: d for d in a.executable_fields}
    fb = {d.number: d for d in b.executable_fields}
    sections: list[SectionDiff] = []

    def digest(data: bytes | None) -> str | None:
        return hashlib.sha256(data).hexdigest() if data is not None else None

    def size(data: bytes | None) -> int | None:
        return len(data) if data is not None else None

    top = [
        ("pjrt_ifrt header", a.ifrt_header, b.ifrt_header),
        ("compile options", a.compile_options, b.compile_options),
        ("HLO module", a.hlo_module, b.hlo_module),
        ("HLO module config", a.hlo_config, b.hlo_config),
    ]
    for name, x, y in top:
        if x is None and y is None:
            continue
        sections.append(SectionDiff(name, None, size(x), size(y), digest(x) == digest(y)))
    for number in sorted(set(fa) | set(fb)):
        if number == 1:
            continue  # shown as HLO module and config above
        da, db = fa.get(number), fb.get(number)
        sections.append(
            SectionDiff(
                names.get(number, f"field {number}"),
                number,
                da.size if da else None,
                db.size if db else None,
                da is not None and db is not None and da.sha256 == db.sha256,
                scalar=(da or db) is not None and (da or db).value is not None,  # type: ignore[union-attr]
            )
        )
    if a.info.pjrt_client_name or b.info.pjrt_client_name:
        sections.append(
            SectionDiff(
                "pjrt client name",
                None,
                len(a.info.pjrt_client_name or ""),
                len(b.info.pjrt_client_name or ""),
                a.info.pjrt_client_name == b.info.pjrt_client_name,
            )
        )
    identical = a.info.executable_digest == b.info.executable_digest
    return BytesSection(identical, tuple(sections))


# --- manifests ------------------------------------------------------------------------------------


def _render_component(name: str, data: str | None) -> str | None:
    if data is None:
        return None
    import base64

    try:
        raw = base64.b64decode(data)
    except ValueError:
        return None
    if name == "compile_options":
        return f"<{len(raw)} bytes of serialized CompileOptionsProto>"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.hex()
    return text if text.isprintable() else raw.hex()


def _component_fields(
    name: str, a: str | None, b: str | None
) -> tuple[optionschema.FieldDiff, ...]:
    if name != "compile_options" or a is None or b is None:
        return ()
    import base64

    try:
        return tuple(
            optionschema.diff_messages(
                base64.b64decode(a), base64.b64decode(b), optionschema.COMPILE_OPTIONS
            )
        )
    except (ValueError, wire.WireError):
        return ()


def _ir_backend_configs(text: str) -> list[tuple[str, str]]:
    """(target, backend_config) of each custom call in a recorded module's text."""
    import re

    out = []
    for line in text.splitlines():
        if "custom_call" not in line:
            continue
        target = re.search(r'call_target_name\s*=\s*"([^"]*)"', line) or re.search(
            r"custom_call\s*@(\w+)", line
        )
        config = re.search(r'backend_config\s*=\s*"([^"]*)"', line)
        if target and config:
            out.append((target.group(1), config.group(1)))
    return out


def _manifest_section(a: EntrySide, b: EntrySide, context: int) -> ManifestSection:
    try:
        ma = load_manifest(a.cache_dir, a.key)
        mb = load_manifest(b.cache_dir, b.key)
    except (OSError, ValueError) as exc:
        return ManifestSection(False, f"{NO_MANIFEST} (a manifest is unreadable: {exc})")
    if ma is None or mb is None:
        which = "either entry" if ma is None and mb is None else ("A" if ma is None else "B")
        return ManifestSection(False, f"{NO_MANIFEST} (no manifest for {which})")
    ca = {c["name"]: c for c in ma.components}
    cb = {c["name"]: c for c in mb.components}
    order = [c["name"] for c in ma.components] + [
        c["name"] for c in mb.components if c["name"] not in ca
    ]
    components = []
    for name in order:
        x, y = ca.get(name, {}), cb.get(name, {})
        same = x.get("digest") == y.get("digest")
        xa, yb = x.get("data"), y.get("data")
        if name == "XLA flags":
            ra = " ".join(ma.xla_flags) if name in ca else None
            rb = " ".join(mb.xla_flags) if name in cb else None
        else:
            ra, rb = _render_component(name, xa), _render_component(name, yb)
        components.append(
            ComponentDiff(
                name,
                same,
                x.get("digest"),
                y.get("digest"),
                ra,
                rb,
                () if same else _component_fields(name, xa, yb),
            )
        )
    va = {v["field"]: v for v in ma.volatile}
    vb = {v["field"]: v for v in mb.volatile}
    volatile = tuple(
        VolatileInput(
            f,
            va.get(f, {}).get("raw"),
            vb.get(f, {}).get("raw"),
            va.get(f, {}).get("canonical"),
            vb.get(f, {}).get("canonical"),
        )
        for f in sorted(set(va) | set(vb))
    )
    versions = tuple(
        (k, ma.versions.get(k), mb.versions.get(k))
        for k in sorted(set(ma.versions) | set(mb.versions))
        if ma.versions.get(k) != mb.versions.get(k)
    )
    ir_diff: tuple[str, ...] = ()
    configs: list[tuple[str, str, str]] = []
    ir_a = load_ir(a.cache_dir, a.key) if ma.has_ir else None
    ir_b = load_ir(b.cache_dir, b.key) if mb.has_ir else None
    if ir_a is not None and ir_b is not None:
        ir_diff = tuple(
            difflib.unified_diff(
                ir_a.splitlines(),
                ir_b.splitlines(),
                "A (recorded module)",
                "B (recorded module)",
                n=context,
                lineterm="",
            )
        )
        for (ta, xa_), (_tb, xb_) in zip(
            _ir_backend_configs(ir_a), _ir_backend_configs(ir_b), strict=False
        ):
            configs.append((ta, xa_, xb_))
    note = "manifests recorded by the stable-key hook"
    if not (ir_a and ir_b):
        note += " (no recorded module text: the hook ran without record_ir)"
    return ManifestSection(
        available=True,
        note=note,
        stable_keys=(ma.stable_key, mb.stable_key),
        jax_keys=(ma.jax_key, mb.jax_key),
        components=tuple(components),
        volatile=volatile,
        versions=versions,
        ir_diff=ir_diff,
        backend_configs=tuple(configs),
    )


# --- the verdict ----------------------------------------------------------------------------------


def _pair(label: str, x: object, y: object) -> str:
    return f"{label} {x} vs {y}"


def _cpu_target(detail: EntryDetail) -> tuple[str | None, str | None, frozenset[str]]:
    for number, data in detail.small_fields:
        if number == 9 and detail.info.platform == "cpu":
            try:
                f = wire.fields_by_number(data)
            except wire.WireError:
                break
            features = wire.as_str(wire.first(f, 3)) or ""
            return (
                wire.as_str(wire.first(f, 1)),
                wire.as_str(wire.first(f, 2)),
                frozenset(x for x in features.split(",") if x),
            )
    return None, None, frozenset()


def _custom_partitioning_evidence(detail: EntryDetail) -> str | None:
    if detail.hlo_module is None:
        return None
    found = [
        i for i in identities(detail.hlo_module) if i.op_name and "custom_partitioning" in i.op_name
    ]
    if not found:
        return None
    return (
        f"the compiled module's metadata names a custom_partitioning op "
        f"(op_name {found[0].op_name!r} on {len(found)} instructions); its "
        "CustomSPMDPartitioning call carries a per-process pointer in backend_config that JAX "
        "hashes into the key, and is partitioned away before the module is stored"
    )


def _first_option(diffs: Sequence[optionschema.FieldDiff]) -> str:
    d = diffs[0]
    more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
    va = d.a if d.a is not None else "(unset)"
    vb = d.b if d.b is not None else "(unset)"
    return f"{d.path} {va} vs {vb}{more}"


def _verdict(
    a: EntryDetail,
    b: EntryDetail,
    same_file: bool,
    options: OptionsSection,
    hlo: HloSection,
    execs: BytesSection,
    manifest: ManifestSection,
) -> Verdict:
    """The strongest statement the evidence allows: same file, same bytes, same program, else
    what differs (platform, JAX era, topology, target, program, options)."""
    ia, ib = a.info, b.info
    if same_file:
        return Verdict(
            VerdictKind.IDENTICAL, "identical: A and B are the same file", (), None, True
        )
    if ia.executable_digest == ib.executable_digest:
        return _same_executable_verdict(a, b, manifest)
    if ia.program_digest is not None and ia.program_digest == ib.program_digest:
        return _same_program_verdict(options, hlo, execs)
    claims = [
        *_platform_claims(a, b),
        *_era_claims(a, b),
        *_topology_claims(a, b, options),
        *_target_claims(a, b),
        *_program_claims(hlo, options),
    ]
    kind: VerdictKind | None = None
    line = ""
    because: list[str] = []
    for claimed, text in claims:  # the first claim is the verdict, the rest are reasons
        if claimed is not None and kind is None:
            kind, line = claimed, text
        else:
            because.append(text)
    if kind is None:
        sec = [s.name for s in execs.sections if not s.same]
        kind = VerdictKind.DIFFERENT_PROGRAM
        line = "different entries: " + (", ".join(sec) or "payloads") + " differ"
    relocated = [d for d in options.compile_options if is_relocation(d)]
    if relocated:
        because.append("also relocated: " + _first_option(relocated))
    return Verdict(kind, line, tuple(because), None, False)


# A verdict step's output: (a verdict it supports, or None for a plain reason; the sentence)
_Claim = tuple[VerdictKind | None, str]


def _same_executable_verdict(a: EntryDetail, b: EntryDetail, manifest: ManifestSection) -> Verdict:
    """Byte-identical payloads: identical under one key, else a key input the entry lacks."""
    ia, ib = a.info, b.info
    digest = (ia.executable_digest or "")[:16]
    if ia.key == ib.key:
        return Verdict(
            VerdictKind.IDENTICAL,
            f"identical: same key and byte-identical payloads (sha256 {digest}…)",
            (f"A is in {_parent(ia.path)}, B in {_parent(ib.path)}",),
            None,
            True,
        )
    because = [
        f"the decompressed payloads are byte-identical (sha256 {digest}…): same compiled "
        "module, compile options and object code"
    ]
    changed = [c for c in manifest.components if not c.same]
    if manifest.available and changed:
        because.append("the key manifests differ in: " + ", ".join(c.name for c in changed))
    moved = [v for v in manifest.volatile if v.a_raw != v.b_raw]
    cp = _custom_partitioning_evidence(a)
    if moved:
        v = moved[0]
        line = (
            "same executable under different keys: keys differ only in volatile input "
            f"{v.field} {v.a_raw} vs {v.b_raw} (key instability)"
        )
        because.append(
            f"the manifests record {v.field} = {v.a_raw} (A) and {v.b_raw} (B); the hook "
            "canonicalises it to "
            + ("the same value" if v.a_canonical == v.b_canonical else "different values")
        )
    elif cp:
        line = (
            "same executable under different keys: the keys differ in an input not stored "
            "in the entry; the module's metadata shows a custom_partitioning op, whose "
            "CustomSPMDPartitioning backend_config is a per-run pointer (key instability)"
        )
    else:
        line = (
            "same executable under different keys: the keys differ in an input not stored "
            "in the entry (key instability)"
        )
    if cp:
        because.append(cp)
    if not manifest.available:
        because.append(
            "JAX's key also hashes the pre-compilation module, the jaxlib version, XLA "
            "flags, platform version, device topology and compression; the entries do not "
            "store these inputs"
        )
    if manifest.available and manifest.stable_keys[0] == manifest.stable_keys[1]:
        advice = (
            "the stable keys are equal: with `cachedoctor enable` (stable mode) both runs "
            "use one entry"
        )
    elif manifest.available:
        advice = "the stable keys differ too: see the key components below"
    else:
        advice = f"{ENABLE_ADVICE}; with record_ir its manifests name the differing input"
    return Verdict(VerdictKind.SAME_EXECUTABLE, line, tuple(because), advice, True)


def _same_program_verdict(options: OptionsSection, hlo: HloSection, execs: BytesSection) -> Verdict:
    """Equal canonical HLO and options: name the volatile difference that remains."""
    volatile_opts = [d for d in options.compile_options if _is_volatile_option(d)]
    relocated = [d for d in volatile_opts if is_relocation(d)]
    pointers = [r for r in hlo.removed if r.category == "backend_config-pointer"]
    because: list[str] = []
    advice: str | None = None
    if relocated:
        line = (
            f"same program, different compile options: {_first_option(relocated)} (cache relocated)"
        )
        because.append(
            "the options differ only in paths JAX derives from the cache directory; "
            "the canonical HLO is identical"
        )
        because += _hashes_autotune_dir()
        advice = (
            "a relocated cache misses on jax versions that hash this path; "
            f"{ENABLE_ADVICE} (paths relative to the cache dir)"
        )
    elif volatile_opts:
        line = (
            f"same program, different compile options: {_first_option(volatile_opts)} "
            "(JAX clears this field before hashing)"
        )
    elif pointers:
        p = pointers[0]
        value_b = p.b.split(": ", 1)[-1]
        line = (
            f"same program, keys differ only in volatile input: {p.a} vs {value_b} "
            "(key instability)"
        )
        advice = ENABLE_ADVICE if "CustomSPMDPartitioning" in p.a else None
    elif hlo.removed:
        kinds = sorted({r.what for r in hlo.removed})
        line = "same program; only " + ", ".join(kinds) + " differ (removed by normalisation)"
    else:
        sec = [s.name for s in execs.sections if not s.same]
        line = "same program, compiled to different bytes: " + (", ".join(sec) or "payload")
        because.append("the canonical HLO and compile options are identical")
    if options.ifrt_header:
        because.append("the pjrt_ifrt header differs: " + _first_option(list(options.ifrt_header)))
    return Verdict(VerdictKind.SAME_PROGRAM, line, tuple(because), advice, True)


def _hashes_autotune_dir() -> list[str]:
    """Whether the installed JAX hashes the autotune path, as a reason (empty when unknown)."""
    from cachedoctor.cache.jaxenv import installed_jax

    jax_info = installed_jax()
    if jax_info.hashes_autotune_dir is None:
        return []
    return [
        f"the installed jax {jax_info.jax_version} "
        + ("hashes" if jax_info.hashes_autotune_dir else "does not hash")
        + f" xla_gpu_per_fusion_autotune_cache_dir into the key ({jax_info.cache_key_source})"
    ]


def _platform_claims(a: EntryDetail, b: EntryDetail) -> list[_Claim]:
    ia, ib = a.info, b.info
    if ia.platform == ib.platform:
        return []
    return [
        (VerdictKind.DIFFERENT_PLATFORM, _pair("different platforms:", ia.platform, ib.platform))
    ]


def _era_claims(a: EntryDetail, b: EntryDetail) -> list[_Claim]:
    """Different JAX/XLA versions, only where the layout shows two eras."""
    ia, ib = a.info, b.info
    claims: list[_Claim] = []
    if ia.format_label != ib.format_label:
        claims.append(
            (
                VerdictKind.DIFFERENT_JAX,
                f"different JAX versions: payload format {ia.format_label} (A) vs "
                f"{ib.format_label} (B); the pjrt_ifrt header is written from jax 0.9.1",
            )
        )
    if ia.platform == ib.platform == "cpu":
        only = _cpu_layout_eras(
            {d.number for d in a.executable_fields}, {d.number for d in b.executable_fields}
        )
        if only:
            claims.append(
                (
                    VerdictKind.DIFFERENT_JAX,
                    "different JAX/XLA versions: the serialized executable has " + "; ".join(only),
                )
            )
    if ia.runtime_name != ib.runtime_name and ia.runtime_name and ib.runtime_name:
        claims.append((None, _pair("runtime", ia.runtime_name, ib.runtime_name)))
    return claims


def _topology_claims(a: EntryDetail, b: EntryDetail, options: OptionsSection) -> list[_Claim]:
    ia, ib = a.info, b.info
    topo = [
        (label, x, y)
        for label, x, y in (
            ("replicas", ia.num_replicas, ib.num_replicas),
            ("partitions", ia.num_partitions, ib.num_partitions),
            ("host device count", ia.host_device_count, ib.host_device_count),
            ("process count", ia.process_count, ib.process_count),
        )
        if x != y
    ]
    device_assignment = [d for d in options.compile_options if d.numbers[:2] == (3, 9)]
    if not topo and not device_assignment:
        return []
    parts = [_pair(lbl, x, y) for lbl, x, y in topo]
    if device_assignment:
        parts.append("device assignment differs")
    return [(VerdictKind.DIFFERENT_TOPOLOGY, "different device topology: " + ", ".join(parts))]


def _target_claims(a: EntryDetail, b: EntryDetail) -> list[_Claim]:
    ta, tb = _cpu_target(a), _cpu_target(b)
    if not (ta[0] and tb[0]) or ta == tb:
        return []
    parts = []
    if ta[0] != tb[0]:
        parts.append(_pair("triple", ta[0], tb[0]))
    if ta[1] != tb[1]:
        parts.append(_pair("cpu", ta[1], tb[1]))
    if ta[2] != tb[2]:
        only_a, only_b = sorted(ta[2] - tb[2]), sorted(tb[2] - ta[2])
        parts.append(
            f"features differ ({len(only_a)} only in A, {len(only_b)} only in B"
            + (f", e.g. {(only_a or only_b)[0]}" if only_a or only_b else "")
            + ")"
        )
    return [
        (VerdictKind.DIFFERENT_TARGET, "different CPU target machine options: " + ", ".join(parts))
    ]


def _program_claims(hlo: HloSection, options: OptionsSection) -> list[_Claim]:
    """Shapes, then compile options, then the canonical HLO."""
    claims: list[_Claim] = []
    if hlo.available and hlo.parameters[0] != hlo.parameters[1]:
        claims.append(
            (
                VerdictKind.DIFFERENT_PROGRAM,
                "different programs: parameter shapes differ: "
                f"{', '.join(hlo.parameters[0]) or '()'} vs "
                f"{', '.join(hlo.parameters[1]) or '()'}",
            )
        )
    elif hlo.available and hlo.results[0] != hlo.results[1]:
        claims.append(
            (
                VerdictKind.DIFFERENT_PROGRAM,
                f"different programs: result shapes differ: {hlo.results[0]} vs {hlo.results[1]}",
            )
        )
    real_opts = [d for d in options.compile_options if not _is_volatile_option(d)]
    if real_opts:
        n = len(real_opts)
        claims.append(
            (
                VerdictKind.DIFFERENT_OPTIONS,
                f"different compile options ({n} field{'s' if n != 1 else ''}): "
                + _first_option(real_opts),
            )
        )
    if hlo.available and not hlo.same_canonical:
        claims.append(
            (
                VerdictKind.DIFFERENT_PROGRAM,
                f"different programs: {hlo.changed_instructions} of "
                f"{max(hlo.instructions)} instructions differ in the canonical HLO",
            )
        )
    elif hlo.available:
        claims.append((None, "the canonical HLO is identical"))
    return claims


# --- entry points ---------------------------------------------------------------------------------


def diff_details(
    a: EntryDetail,
    b: EntryDetail,
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> DiffReport:
    """Compare two decoded entries (see :func:`diff_entries`)."""
    if urls.is_url(a.info.path) or urls.is_url(b.info.path):
        same_file = a.info.path == b.info.path
    else:
        try:
            same_file = os.path.samefile(a.info.path, b.info.path)
        except OSError:
            same_file = False
    side_a, side_b = _side(a.info), _side(b.info)
    options = _options_section(a, b)
    hlo = _hlo_section(a, b, context, raw_hlo)
    execs = _executable_section(a, b)
    manifest = _manifest_section(side_a, side_b, context)
    verdict = _verdict(a, b, same_file, options, hlo, execs, manifest)
    return DiffReport(verdict, side_a, side_b, manifest, options, hlo, execs)


def diff_entries(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> DiffReport:
    """Explain the difference between two entry files. Raises CachedoctorError for bad input."""
    return diff_details(load_detail(a), load_detail(b), context=context, raw_hlo=raw_hlo)


def diff_module(
    cache_dir: str | os.PathLike[str],
    module: str,
    *,
    context: int = DEFAULT_CONTEXT,
    raw_hlo: bool = False,
) -> ModuleDiffReport:
    """Every entry of ``module`` against the most recently written one."""
    store: stores.Store | None = None
    if urls.is_url(cache_dir):
        root = str(cache_dir)
        store = stores.open_store(root)
    else:
        root = os.path.abspath(os.fspath(cache_dir))
    try:
        with stores.one_line_errors(root):
            listing = listdir.list_cache(store if store is not None else root)
    except FileNotFoundError as exc:
        raise CachedoctorError(f"no such directory: {root}", slug="no-such-dir") from exc
    except OSError as exc:
        raise CachedoctorError(f"cannot read {root}: {exc.strerror or exc}") from exc
    items = [
        i
        for i in listing.entries
        if i.key and listdir.parse_key(i.key) and listdir.parse_key(i.key)[1] == module  # type: ignore[index]
    ]
    if not items:
        known = sorted(
            {
                m
                for i in listing.entries
                if i.key and (p := listdir.parse_key(i.key)) and (m := p[1])
            }
        )
        hint = f"; modules here: {', '.join(known[:8])}" if known else ""
        raise EntryNotFoundError(f"no entries of module {module!r} in {root}{hint}")
    items.sort(key=lambda i: (i.mtime_ns, i.name))
    latest = items[-1]

    def load(item: listdir.DirItem) -> EntryDetail:
        return _load_item(store, item) if store is not None else load_detail(listing.path(item))

    decoded: list[tuple[listdir.DirItem, EntryDetail]] = []
    undecodable: list[str] = []
    for item in items:
        try:
            decoded.append((item, load(item)))
        except CachedoctorError as exc:  # one bad entry must not hide the pairs that compare
            undecodable.append(f"{item.key}: {exc}")
    if not decoded:
        return ModuleDiffReport(module, root, None, (), tuple(undecodable))
    latest, latest_detail = decoded[-1]
    reports = tuple(
        diff_details(detail, latest_detail, context=context, raw_hlo=raw_hlo)
        for _, detail in decoded[:-1]
    )
    return ModuleDiffReport(module, root, latest.key, reports, tuple(undecodable))
