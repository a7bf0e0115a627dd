"""The one place that reads JAX's persistent compilation cache: the directory and its entries.

Layout (see docs/format.md): ``<module>-<sha256 hex>-cache`` files, each zstd or zlib of
``[4-byte big-endian compile seconds][payload]``; the payload is an ``ExecutableAndOptionsProto``,
preceded from jax 0.9.1 by a varint-length ``pjrt_ifrt`` metadata header, and on GPU from 0.9.1 a
Riegeli "split proto". Every function here returns data; a bad entry comes back with
``problems`` set, it never raises.

Entries are decoded as a stream: large fields (object code, cubins) are hashed and skipped, only
the HLO module and compile options are held, so memory does not grow with entry size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import hashlib
import io
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

try:
    import zstandard
except ImportError:  # a declared dependency, but JAX itself runs without it (zlib entries)
    zstandard = None  # type: ignore[assignment]

from cachedoctor.formats import wire
from cachedoctor.formats.errors import FormatError
from cachedoctor.storage.stores import Store, StoreItem, local_version
from cachedoctor.xla import gpu
from cachedoctor.xla import hlo as hlo_mod

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
LOCKFILE = ".lockfile"
AUTOTUNE_DIR = "xla_gpu_per_fusion_autotune_cache_dir"
KERNEL_CACHE_FILE = "xla_gpu_kernel_cache_file"
CACHEDOCTOR_PREFIX = "cachedoctor"  # our own files and folders (manifests, index) start with it

ZstdError: type[Exception] = zstandard.ZstdError if zstandard is not None else zlib.error
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
RIEGELI_MAGIC = b"\x83\xaf\x70\xd1\x0d\x88\x4a\x3f"

DEFAULT_MAX_DECOMPRESSED = 8 << 30  # a bigger entry is reported, not decoded
MAX_HLO_BYTES = 1 << 30
MAX_OPTIONS_BYTES = 64 << 20
MAX_HEADER_BYTES = 64 << 20
SMALL_FIELD = 64 << 10  # executable sub-fields kept whole for interpretation

_KEY_RE = re.compile(r"^(?:(?P<module>.+)-)?(?P<hash>[0-9a-f]{64})$")
_JAX_TEMP_RE = re.compile(r"^_temp_|\.tmp$|^tmp[._]")
_HASH_RE = re.compile(r"[0-9a-f]{64}")

# DebugOptions field numbers (xla/xla.proto), see FORMATS.md §4.
DEBUG_DEVICE_COUNT = 102
DEBUG_DUMP_TO = 109
DEBUG_KERNEL_CACHE_FILE = 306
DEBUG_AUTOTUNE_DIR = 310
DEBUG_AUTOTUNE_MODE = 324
DEBUG_AUTOTUNER_CACHE_DIR = 407
AUTOTUNE_MODES = {0: "unspecified", 1: "update", 2: "read"}


class FileKind(enum.StrEnum):
    ENTRY = "entry"
    ATIME = "atime"
    LOCKFILE = "lockfile"
    TEMP = "temp"
    AUTOTUNE_SUBCACHE = "autotune-subcache"
    KERNEL_SUBCACHE = "kernel-subcache"
    CACHEDOCTOR = "cachedoctor"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class DirItem:
    """One name in the cache directory, classified, with its lstat facts (links not followed)."""

    name: str
    kind: FileKind
    key: str | None
    size: int
    mtime_ns: int
    mode: int
    uid: int
    is_symlink: bool
    is_dir: bool
    version: str | None = None  # a store's generation/ETag, for conditional deletes
    ino: int = 0  # with ctime_ns: the file's identity for the scan index (see index.py)
    ctime_ns: int = 0


@dataclass(frozen=True)
class CacheListing:
    root: str
    items: tuple[DirItem, ...]
    root_mode: int
    root_uid: int
    remote: bool = False  # a bucket: no POSIX modes or owners, sub-cache sizes are totals

    def of_kind(self, kind: FileKind) -> list[DirItem]:
        return [i for i in self.items if i.kind is kind]

    @property
    def entries(self) -> list[DirItem]:
        return self.of_kind(FileKind.ENTRY)

    def path(self, item: DirItem) -> Path:
        return Path(self.root) / item.name


def module_of(key: str) -> str | None:
    """The module name in a key (``jit_f`` of ``jit_f-<hex>``), or None."""
    parsed = parse_key(key)
    return parsed[1] if parsed else None


def parse_key(name: str) -> tuple[str, str | None] | None:
    """``jit_f-<64hex>`` -> (key, module); None when the name is not a JAX cache key."""
    if (
        len(name) > 65
        and name[-65] == "-"
        and "\n" not in name
        and _HASH_RE.fullmatch(name, -64 + len(name))
    ):
        return name, name[:-65]  # the common case, without the backtracking of _KEY_RE
    m = _KEY_RE.match(name)
    if not m:
        return None
    return name, m.group("module")


def classify(name: str, is_dir: bool) -> tuple[FileKind, str | None]:
    """Kind of a directory member, and its cache key when it belongs to an entry."""
    if name.startswith(CACHEDOCTOR_PREFIX) or name.startswith("." + CACHEDOCTOR_PREFIX):
        return FileKind.CACHEDOCTOR, None
    if name == AUTOTUNE_DIR:
        return FileKind.AUTOTUNE_SUBCACHE, None
    if name.startswith(KERNEL_CACHE_FILE):
        return FileKind.KERNEL_SUBCACHE, None
    if is_dir:
        return FileKind.UNKNOWN, None
    if name == LOCKFILE:
        return FileKind.LOCKFILE, None
    if name.startswith(("_temp_", "tmp.", "tmp_")) or name.endswith(".tmp"):  # _JAX_TEMP_RE
        return FileKind.TEMP, None
    for suffix, kind in ((CACHE_SUFFIX, FileKind.ENTRY), (ATIME_SUFFIX, FileKind.ATIME)):
        if name.endswith(suffix):
            parsed = parse_key(name[: -len(suffix)])
            if parsed:
                return kind, parsed[0]
    parsed = parse_key(name)
    if parsed:  # jax <= 0.4.29 wrote entries without a suffix
        return FileKind.ENTRY, parsed[0]
    return FileKind.UNKNOWN, None


def list_cache(root: str | os.PathLike[str] | Store) -> CacheListing:
    """List and classify a cache directory. Raises OSError when the directory cannot be read.

    ``root`` may also be a ``storage.Store`` (a bucket prefix): its listing is classified the
    same way; items get the store's version (generation/ETag) and no mode or owner.
    """
    if not isinstance(root, (str, os.PathLike)):
        if not root.is_local:
            return _list_store(root)
        root = root.url  # a LocalStore: the directory listing below, with modes and owners
    root_path = Path(root)
    root_stat = root_path.stat()
    if not stat.S_ISDIR(root_stat.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(root))
    items = []
    with os.scandir(root_path) as it:
        for de in it:
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished between listing and stat (a concurrent JAX eviction)
            is_link = stat.S_ISLNK(st.st_mode)
            is_dir = stat.S_ISDIR(st.st_mode)
            kind, key = classify(de.name, is_dir)
            items.append(
                DirItem(
                    name=de.name,
                    kind=kind,
                    key=key,
                    size=st.st_size,
                    mtime_ns=st.st_mtime_ns,
                    mode=st.st_mode,
                    uid=st.st_uid,
                    is_symlink=is_link,
                    is_dir=is_dir,
                    version=local_version(st),
                    ino=st.st_ino,
                    ctime_ns=st.st_ctime_ns,
                )
            )
    items.sort(key=lambda i: i.name)
    return CacheListing(str(root_path), tuple(items), root_stat.st_mode, root_stat.st_uid)


def store_item(si: StoreItem) -> DirItem:
    """Classify one member of a store's listing (no mode or owner: uid -1)."""
    kind, key = classify(si.name, si.is_dir)
    return DirItem(
        name=si.name,
        kind=kind,
        key=key,
        size=si.size,
        mtime_ns=si.mtime_ns,
        mode=stat.S_IFDIR if si.is_dir else stat.S_IFREG,
        uid=-1,
        is_symlink=False,
        is_dir=si.is_dir,
        version=si.version,
    )


def _list_store(store: Store) -> CacheListing:
    items = sorted((store_item(si) for si in store.list()), key=lambda i: i.name)
    return CacheListing(store.url, tuple(items), stat.S_IFDIR, -1, remote=not store.is_local)


def read_atime(path: str | os.PathLike[str]) -> int | None:
    """The nanosecond timestamp in a ``-atime`` file (8 bytes, little-endian), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(9)
    return int.from_bytes(data, "little") if len(data) == 8 else None


# --- entries -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """Why an entry could not be (fully) decoded. ``kind`` is a stable slug."""

    kind: str  # unreadable | symlink | not-compressed | truncated | decompress | too-large |
    #            header | protobuf | unsupported
    message: str


@dataclass(frozen=True, slots=True)
class Section:
    """A part of the serialized executable, by size (object code, PTX, cubin, thunks...)."""

    name: str
    size: int


@dataclass(frozen=True, slots=True)
class GpuSummary:
    """GPU executable facts (FORMATS.md §2); see gpu.py for the layouts."""

    layout: str
    payload_split: bool  # the PjRt payload was a Riegeli split proto (jax >= 0.9.1)
    executable_split: bool  # the GPU executable itself was split (jax >= 0.10.1)
    compute_capability: str | None
    ptx_size: int
    cubin_size: int
    cudnn_graphs: int
    thunks: int


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
    hlo: hlo_mod.HloSummary | None = None
    gpu: GpuSummary | None = None
    sections: tuple[Section, ...] = ()
    executable_digest: str | None = None  # sha256 of the payload after the compile-time prefix
    program_digest: str | None = None  # same program modulo volatile fields (see hlo.canonicalize)
    volatile: tuple[hlo_mod.VolatileField, ...] = ()
    problems: tuple[Problem, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def format_label(self) -> str:
        """A short name for the on-disk layout, e.g. ``ifrt-v3`` or ``pjrt``."""
        label = self.payload_format or "unknown"
        if self.payload_format == "ifrt":
            label = f"ifrt-v{self.ifrt_version}"
        if self.gpu is not None and self.gpu.payload_split:
            label += "+split"
        return label


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


class _DecodeFailure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.problem = Problem(kind, message)


class _Decompressor:
    """A bounded, hashing, read()-able view of a zstd or zlib stream.

    Output beyond ``cap`` raises; truncation is detected at the end (zstd's declared content
    size, zlib's end-of-stream marker) because python-zstandard's stream reader hides it.
    """

    def __init__(self, fh: BinaryIO, compression: str, cap: int, hash_from: int) -> None:
        self.compression = compression
        self.cap = cap
        self.produced = 0
        self._hash_from = hash_from
        self.hasher = hashlib.sha256()
        self._fh = fh
        self._zlib = zlib.decompressobj() if compression == "zlib" else None
        self._zlib_buf = b""
        self.declared_size: int | None = None
        self._zstd: IO[bytes] | None = None
        if compression == "zstd":
            if zstandard is None:
                raise _DecodeFailure(
                    "unsupported", "a zstd entry, but the zstandard package is not installed"
                )
            head = fh.read(18)
            try:
                params = zstandard.get_frame_parameters(head)
            except zstandard.ZstdError as exc:
                raise _DecodeFailure("decompress", f"bad zstd frame header: {exc}") from exc
            if params.content_size != zstandard.CONTENTSIZE_UNKNOWN:
                self.declared_size = params.content_size
                if params.content_size > cap:
                    raise _DecodeFailure(
                        "too-large",
                        f"zstd frame declares {params.content_size} bytes, over the {cap}-byte"
                        " cap; not decoded",
                    )
            fh.seek(0)
            self._zstd = zstandard.ZstdDecompressor().stream_reader(
                fh, read_size=1 << 20, read_across_frames=False
            )

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = 1 << 20
        try:
            data = self._zstd.read(n) if self._zstd is not None else self._read_zlib(n)
        except (ZstdError, zlib.error) as exc:
            raise _DecodeFailure(
                "decompress", f"{self.compression} data is damaged: {exc}"
            ) from exc
        if data:
            start = self.produced
            self.produced += len(data)
            if self.produced > self.cap:
                raise _DecodeFailure(
                    "too-large",
                    f"decompresses to more than {self.cap} bytes (the cap); not decoded",
                )
            if self.produced > self._hash_from:
                skip = max(0, self._hash_from - start)
                self.hasher.update(memoryview(data)[skip:])
        return data

    def _read_zlib(self, n: int) -> bytes:
        assert self._zlib is not None
        while True:
            if self._zlib.unconsumed_tail:
                return self._zlib.decompress(self._zlib.unconsumed_tail, n)
            if self._zlib.eof:
                return b""
            chunk = self._fh.read(1 << 16)
            if not chunk:
                return self._zlib.flush(n) if not self._zlib.eof else b""
            out = self._zlib.decompress(chunk, n)
            if out:
                return out

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def check_complete(self) -> None:
        if self.compression == "zlib":
            assert self._zlib is not None
            if not self._zlib.eof:
                raise _DecodeFailure("truncated", "zlib stream ends early (file cut short)")
        elif self.declared_size is not None and self.produced != self.declared_size:
            raise _DecodeFailure(
                "truncated",
                f"zstd frame declares {self.declared_size} bytes but holds {self.produced}"
                " (file cut short, or a forged size)",
            )


def detect_compression(head: bytes) -> str | None:
    """'zstd' or 'zlib' from the magic bytes, else None."""
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return None


def _open_nofollow(path: str) -> BinaryIO:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    return os.fdopen(fd, "rb")


def _decode_debug_options(buf: wire.Buffer, out: dict[str, object]) -> None:
    f = wire.fields_by_number(buf)
    out["host_device_count"] = wire.as_int(wire.first(f, DEBUG_DEVICE_COUNT))
    out["autotune_dir"] = wire.as_str(wire.first(f, DEBUG_AUTOTUNE_DIR)) or None
    out["kernel_cache_file"] = wire.as_str(wire.first(f, DEBUG_KERNEL_CACHE_FILE)) or None
    mode = wire.as_int(wire.first(f, DEBUG_AUTOTUNE_MODE))
    out["autotune_mode"] = AUTOTUNE_MODES.get(mode, str(mode)) if mode is not None else None


def decode_compile_options(buf: wire.Buffer) -> dict[str, object]:
    """The fields of CompileOptionsProto that matter to findings (FORMATS.md §1)."""
    out: dict[str, object] = {}
    f = wire.fields_by_number(buf)
    ebo = wire.first(f, 3)
    if ebo is None or isinstance(ebo, int):
        return out
    ef = wire.fields_by_number(ebo)
    out["num_replicas"] = wire.as_int(wire.first(ef, 4))
    out["num_partitions"] = wire.as_int(wire.first(ef, 5))
    spmd = wire.as_int(wire.first(ef, 6))
    out["use_spmd_partitioning"] = bool(spmd) if spmd is not None else None
    shardy = wire.as_int(wire.first(ef, 19))
    out["use_shardy"] = bool(shardy) if shardy is not None else None
    out["process_index"] = wire.as_int(wire.first(ef, 22))
    out["process_count"] = wire.as_int(wire.first(ef, 23))
    debug = wire.first(ef, 3)
    if debug is not None and not isinstance(debug, int):
        _decode_debug_options(debug, out)
    return out


def canonical_compile_options(buf: wire.Buffer) -> bytes:
    """Compile options with cache-dir-derived paths reduced to their last component.

    This is what makes a relocated entry compare equal to the original in ``program_digest``.
    """
    f_out = bytearray()
    for number, wt, value in wire.iter_fields(buf):
        if number == 3 and wt == wire.LEN and not isinstance(value, int):
            inner = bytearray()
            for n2, wt2, v2 in wire.iter_fields(value):
                if n2 == 3 and wt2 == wire.LEN and not isinstance(v2, int):
                    v2 = memoryview(_canonical_debug_options(v2))
                inner += wire.encode_field(n2, wt2, v2)
            value = memoryview(bytes(inner))
        f_out += wire.encode_field(number, wt, value)
    return bytes(f_out)


def _canonical_debug_options(buf: wire.Buffer) -> bytes:
    """DebugOptions in a canonical encoding: map entries sorted, cache paths reduced.

    Map fields (e.g. 357, latency-estimator options) serialize in hash order, so two runs of
    the same program can differ only in map order (seen with jax 0.6.2).
    """
    grouped: dict[int, list[tuple[int, wire.FieldValue]]] = {}
    for number, wt, value in wire.iter_fields(buf):
        if number in (DEBUG_DUMP_TO, DEBUG_AUTOTUNE_MODE):
            continue  # JAX clears these before hashing too
        if number in (DEBUG_AUTOTUNE_DIR, DEBUG_KERNEL_CACHE_FILE, DEBUG_AUTOTUNER_CACHE_DIR) and (
            not isinstance(value, int)
        ):
            value = memoryview(os.path.basename(bytes(value).rstrip(b"/")))
        grouped.setdefault(number, []).append((wt, value))
    out = bytearray()
    for number in sorted(grouped):
        values = grouped[number]
        if len(values) > 1 and all(wt == wire.LEN for wt, _ in values):
            values = sorted(values, key=lambda item: bytes(item[1]))
        for wt, value in values:
            out += wire.encode_field(number, wt, value)
    return bytes(out)


@dataclass
class _Walk:
    """Mutable state of one streaming decode."""

    fields: dict[str, object] = field(default_factory=dict)
    hlo_module: bytes | None = None
    hlo_config: bytes | None = None
    compile_options: bytes | None = None
    ifrt_header: bytes | None = None
    small: list[tuple[int, bytes]] = field(default_factory=list)
    scalars: list[tuple[int, int]] = field(default_factory=list)
    sections: list[tuple[int, int, bytes]] = field(default_factory=list)  # number, size, head
    gpu_executable: gpu.GpuExecutable | None = None
    payload_split: bool = False
    hash_fields: bool = False  # detail decodes hash every executable field (FieldDigest)
    digests: list[FieldDigest] = field(default_factory=list)


def _walk_executable(fld: wire.StreamField, walk: _Walk) -> None:
    """Walk ``serialized_executable`` (CPU or GPU CompilationResultProto and successors).

    A GPU executable written as a Riegeli split proto (jax >= 0.10.1) is read whole and handed
    to ``gpu.decode_gpu_executable``; everything else is walked as a stream.
    """
    if fld.length and fld._stream.peek_byte() == RIEGELI_MAGIC[0]:
        data = fld.read(MAX_HLO_BYTES)
        try:
            decoded = gpu.decode_gpu_executable(data, max_bytes=MAX_HLO_BYTES)
        except FormatError as exc:
            raise _DecodeFailure(_format_problem_kind(exc), f"GPU executable: {exc}") from exc
        walk.gpu_executable = decoded
        walk.hlo_module = decoded.hlo_module
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
            hf = wire.fields_by_number(data)
            module = wire.first(hf, 1)
            config = wire.first(hf, 2)
            walk.hlo_module = (
                bytes(module) if module is not None and not isinstance(module, int) else None
            )
            walk.hlo_config = (
                bytes(config) if config is not None and not isinstance(config, int) else None
            )
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


def _infer_platform(walk: _Walk) -> str:
    client = str(walk.fields.get("pjrt_client_name") or "").lower()
    if client:
        if "tpu" in client:
            return "tpu"
        if any(s in client for s in ("streamexecutor", "gpu", "cuda", "rocm")):
            return "gpu"
        if "cpu" in client:
            return "cpu"
    numbers = {n for n, _ in walk.small} | {n for n, _, _ in walk.sections}
    heads = [(n, d[:64]) for n, d in walk.small] + [(n, h) for n, _, h in walk.sections]
    for n, head in heads:
        if head.startswith(b"\x7fELF") and len(head) >= 20:
            machine = int.from_bytes(head[18:20], "little")
            return "gpu" if machine == 190 else "cpu"  # EM_CUDA = 190
        if n == 3 and head.lstrip().startswith((b"//", b".version")):
            return "gpu"
    if 9 in numbers or 7 in numbers:
        return "cpu"
    return "unknown"


_CPU_SECTIONS = {4: "object code", 8: "object files", 6: "thunk sequence", 2: "buffer assignment"}
_GPU_SECTIONS = {
    3: "PTX",
    4: "cubin",
    5: "cuDNN graphs",
    2: "buffer assignment",
    13: "thunks",
    12: "constants",
}


def _interpret_executable(walk: _Walk, platform: str, out: dict[str, object]) -> list[Section]:
    names = _GPU_SECTIONS if platform == "gpu" else _CPU_SECTIONS
    sizes: dict[str, int] = {}
    for n, size, _ in walk.sections:
        label = names.get(n, f"field {n}")
        sizes[label] = sizes.get(label, 0) + size
    for n, data in walk.small:
        if n in names and isinstance(data, bytes):
            label = names[n]
            sizes[label] = sizes.get(label, 0) + len(data)
        if platform == "cpu" and n == 9:
            try:
                tf = wire.fields_by_number(data)
                out["cpu_triple"] = wire.as_str(wire.first(tf, 1))
                out["cpu_name"] = wire.as_str(wire.first(tf, 2))
            except wire.WireError:
                pass
    return [Section(k, v) for k, v in sorted(sizes.items())]


def decode_entry(
    path: str | os.PathLike[str],
    *,
    key: str | None = None,
    detail: bool = False,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    fileobj: BinaryIO | None = None,
    size: int = 0,
    mtime_ns: int = 0,
) -> EntryInfo | EntryDetail:
    """Decode one ``-cache`` file. Never raises for bad content: see ``EntryInfo.problems``.

    With ``fileobj`` (an open, seekable binary file: an object in a bucket), ``path`` is only
    the name to report and ``size``/``mtime_ns`` come from the caller's listing; the caller
    closes it.
    """
    path = os.fspath(path)
    name = path.rstrip("/").rsplit("/", 1)[-1] if fileobj is not None else os.path.basename(path)
    if key is None:
        base = name[: -len(CACHE_SUFFIX)] if name.endswith(CACHE_SUFFIX) else name
        parsed = parse_key(base)
        key = parsed[0] if parsed else base
    parsed_key = parse_key(key)
    module = parsed_key[1] if parsed_key else None
    walk = _Walk(hash_fields=detail)
    info = EntryInfo(key=key, module=module, path=path, size=0, mtime_ns=0)
    problems: list[Problem] = []
    if fileobj is not None:
        info = replace(info, size=size, mtime_ns=mtime_ns)
        info = _decode_open_file(fileobj, info, walk, problems, max_decompressed)
    else:
        try:
            fh = _open_nofollow(path)
        except OSError as exc:
            kind = "symlink" if exc.errno == errno.ELOOP else "unreadable"
            msg = "is a symbolic link; not followed" if kind == "symlink" else exc.strerror
            problems.append(Problem(kind, str(msg)))
        else:
            with fh:
                st = os.fstat(fh.fileno())
                info = replace(info, size=st.st_size, mtime_ns=st.st_mtime_ns)
                info = _decode_open_file(fh, info, walk, problems, max_decompressed)
    info = _finish(info, walk, problems)
    if not detail:
        return info
    return EntryDetail(
        info=info,
        hlo_module=walk.hlo_module,
        hlo_config=walk.hlo_config,
        compile_options=walk.compile_options,
        ifrt_header=walk.ifrt_header,
        small_fields=tuple(walk.small),
        executable_fields=tuple(walk.digests),
    )


def _decode_open_file(
    fh: BinaryIO, info: EntryInfo, walk: _Walk, problems: list[Problem], cap: int
) -> EntryInfo:
    """Decode an open entry file into ``walk``; problems are appended, never raised."""
    dec: _Decompressor | None = None
    found: dict[str, Any] = {}  # applied once at the end: each replace() costs ~20 us
    try:
        head = fh.read(4)
        fh.seek(0)
        if not head:
            raise _DecodeFailure("truncated", "empty file")
        compression = detect_compression(head)
        if compression is None:
            raise _DecodeFailure("not-compressed", "neither zstd nor zlib (bad magic bytes)")
        found["compression"] = compression
        dec = _Decompressor(fh, compression, cap, hash_from=4)
        stream = wire.ByteStream(dec)
        try:
            prefix = stream.read_exact(4)
        except wire.StreamEnd as exc:
            raise _DecodeFailure(
                "truncated", "shorter than the 4-byte compile-time prefix"
            ) from exc
        found["compile_time_s"] = int.from_bytes(prefix, "big")
        _walk_payload(stream, walk)
        dec.drain()
        dec.check_complete()
    except _DecodeFailure as failure:
        problems.append(failure.problem)
    except wire.StreamEnd as exc:
        problems.append(Problem("truncated", f"payload ends early: {exc}"))
    except wire.WireError as exc:
        problems.append(Problem("protobuf", f"malformed protobuf: {exc}"))
    except OSError as exc:
        problems.append(Problem("unreadable", exc.strerror or str(exc)))
    if dec is None:
        return replace(info, **found)
    if problems and problems[0].kind in ("protobuf", "truncated", "header"):
        try:  # a malformed payload is often a file cut short: say so when it is
            dec.drain()
            dec.check_complete()
        except _DecodeFailure as failure:
            if failure.problem.kind != problems[0].kind or len(problems) == 1:
                problems.insert(0, failure.problem)
        except (OSError, ValueError):
            pass
    found["decompressed_size"] = dec.produced
    if not problems:
        found["executable_digest"] = dec.hasher.hexdigest()
    return replace(info, **found)


def _walk_payload(stream: wire.ByteStream, walk: _Walk) -> None:
    first = stream.peek_byte()
    if first is None:
        raise _DecodeFailure("truncated", "no executable after the compile-time prefix")
    fmt = "pjrt"
    if first != 0x0A and first != RIEGELI_MAGIC[0]:
        length = stream.read_varint()
        if length > MAX_HEADER_BYTES:
            raise _DecodeFailure("header", f"pjrt_ifrt header claims {length} bytes")
        header = stream.read_exact(length)
        hf = wire.fields_by_number(header)
        walk.ifrt_header = header
        walk.fields["ifrt_version"] = wire.as_int(wire.first(hf, 1))
        walk.fields["runtime_name"] = wire.as_str(wire.first(hf, 2))
        fmt = "ifrt"
        first = stream.peek_byte()
    if first == RIEGELI_MAGIC[0]:
        stream = _unsplit_payload(stream, walk)
    walk.fields["payload_format"] = fmt
    for number, _wt, value in wire.iter_stream_fields(stream):
        if not isinstance(value, wire.StreamField):
            continue
        if number == 1:
            try:
                _walk_executable(value, walk)
            except wire.StreamEnd as exc:
                raise value._runaway() from exc
            except wire.WireError as exc:
                # not a proto we know (e.g. TPU's opaque payload): skip it, keep the rest
                walk.fields["opaque_executable"] = str(exc)
                value.skip_rest()
        elif number == 2:
            walk.compile_options = value.read(MAX_OPTIONS_BYTES)
        elif number == 3:
            walk.fields["pjrt_client_name"] = value.read(4096).decode("utf-8", "replace")


_HLO_MEMO: dict[bytes, tuple[hlo_mod.HloSummary, str, tuple[hlo_mod.VolatileField, ...]]] = {}
_HLO_MEMO_MAX = 1024


def hlo_facts(
    module: bytes,
) -> tuple[hlo_mod.HloSummary, str, tuple[hlo_mod.VolatileField, ...]]:
    """Summary, canonical digest and volatile configs of an HLO module, memoised by its sha256.

    Caches hold the same module under many keys (unstable keys, relocated copies); walking it
    once per process instead of once per entry is most of a scan's work. Raises WireError.
    """
    digest = hashlib.sha256(module).digest()
    found = _HLO_MEMO.get(digest)
    if found is None:
        summary = hlo_mod.summarize(module)
        canon = hlo_mod.canonicalize(module)
        volatile = tuple(v for v in canon.volatile if v.category == "backend_config-pointer")
        if len(_HLO_MEMO) >= _HLO_MEMO_MAX:
            _HLO_MEMO.clear()
        found = _HLO_MEMO[digest] = (summary, canon.digest, volatile)
    return found


_OPTIONS_MEMO: dict[bytes, tuple[dict[str, object], bytes]] = {}


def options_facts(options: bytes) -> tuple[dict[str, object], bytes]:
    """``decode_compile_options`` and ``canonical_compile_options``, memoised by content.

    Entries of one cache mostly share their compile options byte for byte. Raises WireError.
    """
    digest = hashlib.sha256(options).digest()
    found = _OPTIONS_MEMO.get(digest)
    if found is None:
        found = (decode_compile_options(options), canonical_compile_options(options))
        if len(_OPTIONS_MEMO) >= _HLO_MEMO_MAX:
            _OPTIONS_MEMO.clear()
        _OPTIONS_MEMO[digest] = found
    return dict(found[0]), found[1]


def _format_problem_kind(exc: FormatError) -> str:
    from cachedoctor.formats.errors import TooLarge, UnsupportedFormat

    if isinstance(exc, TooLarge):
        return "too-large"
    return "unsupported" if isinstance(exc, UnsupportedFormat) else "protobuf"


def _unsplit_payload(stream: wire.ByteStream, walk: _Walk) -> wire.ByteStream:
    """A GPU payload written as a Riegeli split proto: reassemble it, walk the result."""
    parts = []
    total = 0
    while chunk := stream.read_some(1 << 20):
        parts.append(chunk)
        total += len(chunk)
    try:
        unwrapped = gpu.unwrap_pjrt_payload(b"".join(parts), max_bytes=DEFAULT_MAX_DECOMPRESSED)
    except FormatError as exc:
        raise _DecodeFailure(_format_problem_kind(exc), f"split-proto payload: {exc}") from exc
    walk.payload_split = True
    return wire.ByteStream(io.BytesIO(unwrapped.executable_and_options))


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


def _finish(info: EntryInfo, walk: _Walk, problems: list[Problem]) -> EntryInfo:
    fields: dict[str, object] = dict(walk.fields)
    platform = "gpu" if walk.gpu_executable is not None else _infer_platform(walk)
    sections = _interpret_executable(walk, platform, fields)
    gpu_summary = _gpu_summary(walk) if platform == "gpu" else None
    summary = None
    program = hashlib.sha256(platform.encode())
    volatile: tuple[hlo_mod.VolatileField, ...] = ()
    if walk.hlo_module is not None:
        try:
            summary, canon_digest, volatile = hlo_facts(walk.hlo_module)
            program.update(canon_digest.encode())
        except wire.WireError as exc:
            problems.append(Problem("protobuf", f"HLO module is malformed: {exc}"))
    elif not problems and "opaque_executable" not in fields:
        problems.append(Problem("protobuf", "no HLO module in the serialized executable"))
    if walk.compile_options is not None:
        try:
            decoded, canonical = options_facts(walk.compile_options)
            fields.update(decoded)
            program.update(canonical)
        except wire.WireError as exc:
            problems.append(Problem("protobuf", f"compile options are malformed: {exc}"))
    known = {f.name for f in dataclasses.fields(EntryInfo)}
    updates = {k: v for k, v in fields.items() if k in known}
    return replace(
        info,
        **updates,  # type: ignore[arg-type]
        platform=platform
        if not (platform == "unknown" and "opaque_executable" in fields)
        else "unknown",
        hlo=summary,
        gpu=gpu_summary,
        sections=tuple(sections),
        program_digest=program.hexdigest() if summary is not None and not problems else None,
        volatile=volatile,
        problems=tuple(problems),
    )


def iter_entries(listing: CacheListing, **kwargs: object) -> Iterator[EntryInfo]:
    """Decode every entry of a listing, in name order."""
    for item in listing.entries:
        result = decode_entry(listing.path(item), key=item.key, **kwargs)  # type: ignore[arg-type]
        assert isinstance(result, EntryInfo)
        yield result


def extract_payload(
    path: str | os.PathLike[str],
    out: BinaryIO,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    fileobj: BinaryIO | None = None,
) -> int:
    """Write the decompressed serialized executable (after the time prefix) to ``out``.

    Returns the byte count. Raises ValueError with a one-line reason for a bad entry. With
    ``fileobj`` the entry is read from it (the caller closes it) instead of opening ``path``.
    """
    try:
        opened: contextlib.AbstractContextManager[BinaryIO] = (
            contextlib.nullcontext(fileobj)
            if fileobj is not None
            else _open_nofollow(os.fspath(path))
        )
        with opened as fh:
            compression = detect_compression(fh.read(4))
            fh.seek(0)
            if compression is None:
                raise ValueError("neither zstd nor zlib (bad magic bytes)")
            dec = _Decompressor(fh, compression, max_decompressed, hash_from=4)
            prefix = dec.read(4)
            while len(prefix) < 4:
                more = dec.read(4 - len(prefix))
                if not more:
                    raise ValueError("shorter than the 4-byte compile-time prefix")
                prefix += more
            written = 0
            if len(prefix) > 4:
                out.write(prefix[4:])
                written += len(prefix) - 4
            while chunk := dec.read(1 << 20):
                out.write(chunk)
                written += len(chunk)
            dec.check_complete()
            return written
    except _DecodeFailure as failure:
        raise ValueError(failure.problem.message) from failure


# --- the reader over a store -----------------------------------------------------------------


def decode_item(
    store: Store, item: DirItem, *, detail: bool = False, **kwargs: Any
) -> EntryInfo | EntryDetail:
    """Decode one listed entry through the store: the reader's decoder, a store's bytes."""
    fh = store.open_read(item.name)
    try:
        return decode_entry(
            store.url_of(item.name),
            key=item.key,
            detail=detail,
            fileobj=fh,
            size=item.size,
            mtime_ns=item.mtime_ns,
            **kwargs,
        )
    finally:
        fh.close()


def decode_store_entries(
    store: Store,
    items: Iterable[DirItem],
    *,
    progress: Callable[[int, int], None] | None = None,
    **kwargs: Any,
) -> list[EntryInfo]:
    """Decode entries concurrently (bounded by the store's pool), in listing order."""
    todo = list(items)
    done = 0
    lock = threading.Lock()

    def one(item: DirItem) -> EntryInfo:
        nonlocal done
        result = decode_item(store, item, **kwargs)
        if progress is not None:
            with lock:
                done += 1
                progress(done, len(todo))
        return cast("EntryInfo", result)

    return store.map(one, todo)
