"""The diff's vocabulary: the verdict and each section of evidence behind it, frozen."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cachedoctor.plaindata import ToDict
from cachedoctor.storage.location import Location
from cachedoctor.xla import mosaic, optiondiff

DEFAULT_CONTEXT = 3


MAX_EXAMPLES = 50  # removed-value differences kept per kind (the count is always exact)


NO_MANIFEST = (
    "no manifest: the pre-compilation module is not recorded; "
    "this diff uses only what the entries hold"
)


ENABLE_ADVICE = "`cachedoctor enable` keys entries by a stable hash of what the program does"


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
    cache_dir: Location  # written as its spelling (``to_dict``, ``--json``)
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
    fields: tuple[optiondiff.FieldDiff, ...] = ()  # for compile_options: which fields


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
    # each side's key is the hook's stable key: its manifest is stable mode, not a fallback to
    # JAX's key (known even when the other side has no manifest)
    hooked: tuple[bool, bool] = (False, False)


@dataclass(frozen=True)
class OptionsSection:
    compile_options: tuple[optiondiff.FieldDiff, ...]
    module_config: tuple[optiondiff.FieldDiff, ...]  # the executable's effective config
    ifrt_header: tuple[optiondiff.FieldDiff, ...]
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
class KernelSection:
    """The Pallas TPU kernels of both entries, their bodies read with jaxlib's MLIR."""

    pairs: tuple[mosaic.KernelPair, ...]
    # the modules are equal once the kernels' debug information is stripped: True, False, or
    # None when it cannot be told (``note`` says why)
    only_debug_info: bool | None
    note: str | None = None


@dataclass(frozen=True)
class DiffReport(ToDict):
    verdict: Verdict
    a: EntrySide
    b: EntrySide
    manifest: ManifestSection
    options: OptionsSection
    hlo: HloSection
    executable: BytesSection
    kernels: KernelSection | None = None

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
