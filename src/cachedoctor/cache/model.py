"""What a decoded entry is: plain data that every command reads, whatever the entry's layout."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from cachedoctor.plaindata import slot_filler
from cachedoctor.xla import hlo as hlo_mod

_C = TypeVar("_C", bound=type)


def _pickled_by_values(cls: _C) -> _C:
    """Pickle a frozen, slotted dataclass as the tuple of its field values, set back slot by
    slot. The state methods dataclasses gives such a class look its fields up for every object
    (``fields()``, ``getattr``/``object.__setattr__`` by name): half the cost of sending a
    parallel scan's results from its workers (measured; ``parallel.py``)."""
    names = [f.name for f in fields(cls)]
    assert len(names) > 1  # attrgetter of one name returns the value, not a tuple
    values: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
    setters = tuple(getattr(cls, name).__set__ for name in names)

    def getstate(self: Any) -> tuple[Any, ...]:
        return values(self)

    def setstate(self: Any, state: tuple[Any, ...] | list[Any]) -> None:
        for setter, value in zip(setters, state, strict=True):
            setter(self, value)

    setattr(cls, "__getstate__", getstate)  # noqa: B010 (replacing dataclass's own)
    setattr(cls, "__setstate__", setstate)  # noqa: B010
    return cls


@_pickled_by_values
@dataclass(frozen=True, slots=True)
class Problem:
    """Why an entry could not be (fully) decoded. ``kind`` is a stable slug."""

    kind: str  # unreadable | symlink | not-compressed | truncated | decompress | too-large |
    #            header | protobuf | unsupported | unknown-layout
    message: str


@_pickled_by_values
@dataclass(frozen=True, slots=True)
class Section:
    """A part of the serialized executable, by size (object code, PTX, cubin, thunks...)."""

    name: str
    size: int


@_pickled_by_values
@dataclass(frozen=True, slots=True)
class GpuSummary:
    """GPU executable facts (docs/format-gpu.md); see gpu.py for the layouts."""

    layout: str
    payload_split: bool  # the PjRt payload was a Riegeli split proto (jax >= 0.9.1)
    executable_split: bool  # the GPU executable itself was split (jax >= 0.10.1)
    compute_capability: str | None
    ptx_size: int
    cubin_size: int
    cudnn_graphs: int
    thunks: int


@_pickled_by_values
@dataclass(frozen=True, slots=True)
class MosaicKernel:
    """A Pallas TPU kernel: one ``tpu_custom_call`` and the Mosaic body its config holds
    (docs/format-tpu.md). Its name, stripped digest and debug locations are read with jaxlib's
    MLIR (``xla/mosaic.describe``) only for entries a verdict compares."""

    instruction: str  # computation/instruction
    body_sha256: str  # of the MLIR bytecode, debug locations included
    body_size: int
    # read with jaxlib's MLIR, only where a verdict needs them (cache/tiers.kernel_candidates)
    name: str | None = None  # the kernel function
    stripped_sha256: str | None = None  # the body without debug information (as jax 0.11)
    locations: tuple[str, ...] = ()  # each distinct "file:line" of its debug locations
    unreadable: str | None = None  # why jaxlib could not read the body


@_pickled_by_values
@dataclass(frozen=True, slots=True)
class TpuSummary:
    """TPU executable facts (libtpu's layout, docs/format-tpu.md; xla/tpu.py)."""

    chip: str | None  # "TPU v5 lite": JAX's device_kind for the chip it was built for
    chip_version: int | None  # TpuVersionEnum (4: v5)
    chip_variant: str | None  # "lite"
    messages: tuple[int, ...]  # the size of each of libtpu's six messages
    program_size: int  # the machine code
    environment: str | None  # the compilation environment's type
    environment_size: int
    kernels: tuple[MosaicKernel, ...] = ()
    # the program digest with every kernel body masked: entries equal in it but not in their
    # program digest differ only in their kernels' bodies (scan then reads the bodies)
    masked_program_digest: str | None = None


@_pickled_by_values
@dataclass(frozen=True, slots=True)
class EntryInfo:
    """What a summary scan knows about one entry: plain data, no payloads."""

    key: str
    module: str | None
    path: str
    size: int
    mtime_ns: int
    compression: str | None = None  # "zstd" | "zlib"
    decompressed_size: int | None = None
    compile_time_s: int | None = None
    payload_format: str | None = None  # "pjrt" | "ifrt"
    ifrt_version: int | None = None
    runtime_name: str | None = None
    platform: str = "unknown"  # cpu | gpu | tpu | unknown
    pjrt_client_name: str | None = None
    cpu_triple: str | None = None
    cpu_name: str | None = None
    num_replicas: int | None = None
    num_partitions: int | None = None
    use_spmd_partitioning: bool | None = None
    use_shardy: bool | None = None
    process_index: int | None = None
    process_count: int | None = None
    host_device_count: int | None = None
    autotune_dir: str | None = None
    kernel_cache_file: str | None = None
    autotune_mode: str | None = None
    # the DebugOptions field numbers its compile options set, as ranges (compile_options.
    # number_ranges): numbers the installed jaxlib does not define show another jaxlib's entry
    debug_fields: str | None = None
    hlo: hlo_mod.HloSummary | None = None
    gpu: GpuSummary | None = None
    tpu: TpuSummary | None = None
    sections: tuple[Section, ...] = ()
    # sha256 of the payload after the compile-time prefix; None with ``hlo_deferred`` (tiers.py)
    executable_digest: str | None = None
    program_digest: str | None = None  # same program modulo volatile fields (see hlo.canonicalize)
    volatile: tuple[hlo_mod.VolatileField, ...] = ()
    problems: tuple[Problem, ...] = ()
    # The tiers (cache/tiers.py); neither is written to JSON. A first-tier decode leaves
    # ``hlo``, ``program_digest`` and ``volatile`` out (``hlo_deferred``); the signature is
    # always computed: equal program digests imply equal signatures.
    program_signature: str | None = None
    hlo_deferred: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def format_label(self) -> str:
        """A short name for the on-disk layout, e.g. ``ifrt-v3`` or ``pjrt``."""
        label = self.payload_format or "unknown"
        if self.payload_format == "ifrt":  # the version is unknown when the header is damaged
            label = "ifrt" if self.ifrt_version is None else f"ifrt-v{self.ifrt_version}"
        if self.gpu is not None and self.gpu.payload_split:
            label += "+split"
        return label


# String fields whose values repeat across entries (module names, digests of copies, paths of
# the sub-caches, platform facts); a key and a path are each entry's own.
_SHARED_STRINGS: tuple[Any, ...] = tuple(
    getattr(EntryInfo, f.name)
    for f in fields(EntryInfo)
    if f.type in ("str", "str | None") and f.name not in ("key", "path")
)
_KEY_SLOT: Any = getattr(EntryInfo, "key")  # noqa: B009 (the slot's descriptor)


_ENTRY_FIELDS = tuple(f.name for f in fields(EntryInfo))
_ALL_ENTRY_FIELDS = operator.attrgetter(*_ENTRY_FIELDS)
_ENTRY_SETTER = {name: getattr(EntryInfo, name).__set__ for name in _ENTRY_FIELDS}
_FILLED_ENTRY = slot_filler(EntryInfo, _ENTRY_FIELDS)


def updated(info: EntryInfo, **changes: Any) -> EntryInfo:
    """``dataclasses.replace(info, **changes)`` at about half its cost, for the scan's hot path
    (a copy of an executable already decoded takes the first's facts): the slots are copied
    and set directly, where ``replace`` goes through ``__init__`` (EntryInfo has no
    ``__post_init__`` to skip). Not checked by mypy as ``replace`` is: elsewhere use that."""
    new = _FILLED_ENTRY(*_ALL_ENTRY_FIELDS(info))
    for name, value in changes.items():
        if name not in _ENTRY_SETTER:
            raise TypeError(f"EntryInfo has no field {name!r}")
        _ENTRY_SETTER[name](new, value)
    return new


def share_strings(info: EntryInfo, strings: dict[str, str], key: str | None = None) -> EntryInfo:
    """``info`` with each repeated string field pointing at the one object in ``strings`` (added
    there when new), and its key at ``key`` when equal, in place: entries unpickled from workers
    or read from index rows otherwise hold a copy each (~25 MB at 50k entries).

    Only for a fresh ``info`` that nothing else holds yet: the values stay equal, the object is
    frozen to everyone else.
    """
    for slot in _SHARED_STRINGS:
        value = slot.__get__(info)
        if value is not None:
            slot.__set__(info, strings.setdefault(value, value))
    if key is not None and info.key == key:
        _KEY_SLOT.__set__(info, key)
    return info


@dataclass(frozen=True)
class FieldDigest:
    """One top-level field of the serialized executable: size and SHA-256 (``diff`` compares them
    to say which sections differ without holding large sections in memory)."""

    number: int
    size: int  # bytes of a LEN field; 0 for a scalar
    sha256: str
    value: int | None = None  # a scalar field's value


@dataclass(frozen=True)
class EntryDetail:
    """An entry decoded for ``show`` and ``diff``: the summary plus the parts worth comparing."""

    info: EntryInfo
    hlo_module: bytes | None
    hlo_config: bytes | None
    compile_options: bytes | None
    ifrt_header: bytes | None
    small_fields: tuple[tuple[int, bytes], ...]  # executable sub-fields small enough to keep
    executable_fields: tuple[FieldDigest, ...] = ()  # every executable sub-field, in order
    original_module: bytes | None = None  # TPU: the module before optimisation
