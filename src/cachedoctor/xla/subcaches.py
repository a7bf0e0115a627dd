"""XLA's GPU sub-caches inside a JAX cache directory (docs/format-gpu.md, Sub-caches).

* ``xla_gpu_per_fusion_autotune_cache_dir/``: one ``<43-char url-safe base64>.textproto`` per
  fused op, holding the text format of one ``xla.AutotuneResult``; writes go through
  ``tmp/tmp_per_fusion_cache_<hash>_<ns>.textproto`` and a rename, so files left in ``tmp/``
  are interrupted writes. XLA writes only the result: the model string and the fusion HLO are in
  the hashed key, not in the file. We report them only when a file holds an ``AutotuneResults``
  entry (``device``/``hlo``/``result``), e.g. one written by hand or by another tool.
* ``xla_gpu_kernel_cache_file``: one binary ``xla.gpu.CompilationCacheProto``
  {1 entries map<name, Entry>, 2 compatibility_version}; Entry {1 fingerprint,
  2 launch_dimensions, 3 cluster_dim, 4 shmem_bytes, 5 binary}. Read streaming, so large cubins
  are skipped rather than held.

Everything returns frozen dataclasses with a list of problems; nothing here raises for bad data.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cachedoctor.errors import os_reason
from cachedoctor.formats import textproto
from cachedoctor.formats.errors import FormatError
from cachedoctor.formats.wire import (
    LEN,
    VARINT,
    ByteStream,
    StreamEnd,
    StreamField,
    WireError,
    fields_by_number,
    iter_stream_fields,
)
from cachedoctor.layout import AUTOTUNE_DIR, KERNEL_CACHE_FILE

MAX_AUTOTUNE_FILE_BYTES = 4 << 20
MAX_AUTOTUNE_FILES = 200_000
MAX_KERNEL_ENTRIES = 1_000_000

# SHA-256 is 256 bits: 42 full base64 characters and a 43rd that carries 4 bits and two zero
# bits, so its alphabet index is a multiple of 4.
_NAME = re.compile(r"[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]\.textproto")
_TMP_NAME = re.compile(r"tmp_per_fusion_cache_[A-Za-z0-9_-]{43}_\d+\.textproto")

_KIND_OF_KEY = {
    "gemm": "gemm",
    "triton": "triton",
    "conv": "conv",
    "cuda_conv_plan": "conv",
    "algorithm": "conv",  # stream_executor.dnn.AlgorithmProto: a cuDNN engine
    "custom_kernel_fusion": "custom",
    "other": "other",
}


# --- autotune results ------------------------------------------------------------------------


@dataclass(frozen=True)
class AutotuneResultInfo:
    """One ``AutotuneResult``: kind is gemm, triton, conv, custom, other, failure or none."""

    kind: str
    run_time_ns: int | None
    scratch_bytes: int | None
    detail: str | None  # the chosen config, e.g. "block_m=64 block_n=32 ..." or "algorithm=-1"
    failure: str | None  # "WRONG_RESULT: message" when the result records a failure
    model: str | None  # only when the file holds an AutotuneResults entry
    hlo: str | None
    version: int | None
    result_count: int  # >1 only for a whole AutotuneResults file


@dataclass(frozen=True)
class AutotuneEntry:
    name: str
    size: int
    name_ok: bool
    result: AutotuneResultInfo | None
    problems: tuple[str, ...]


@dataclass(frozen=True)
class AutotuneDirReport:
    path: Path
    exists: bool
    entries: tuple[AutotuneEntry, ...]
    tmp_leftovers: tuple[str, ...]  # names under tmp/: interrupted or concurrent writes
    other_files: tuple[str, ...]  # files that are neither entries nor tmp/
    total_bytes: int
    kind_counts: tuple[tuple[str, int], ...]  # sorted by kind
    models: tuple[str, ...]  # distinct model strings found in contents (usually none)
    problems: tuple[str, ...]


def is_autotune_tmp_name(name: str) -> bool:
    """XLA's in-flight autotune write, ``tmp/tmp_per_fusion_cache_<hash>_<ns>.textproto``: what
    ``prune --xla-subcaches`` removes from ``tmp/`` (once older than ``--stale-after``)."""
    return name.startswith("tmp_per_fusion_cache_") and name.endswith(".textproto")


def is_autotune_file_name(name: str) -> bool:
    """A canonical name: unpadded url-safe base64 of a SHA-256 digest, then ``.textproto``."""
    return _NAME.fullmatch(name) is not None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _describe(msg: textproto.TextMessage) -> str:
    parts = []
    for key, values in msg.items():
        for v in values:
            if isinstance(v, dict):
                parts.append(f"{key}{{{_describe(v)}}}")
            else:
                shown = _str(v) if isinstance(v, bytes) else v
                parts.append(f"{key}={shown}")
    return " ".join(parts)


def _result_info(
    result: textproto.TextMessage,
    model: str | None,
    hlo: str | None,
    version: int | None,
    count: int,
) -> AutotuneResultInfo:
    run_time = textproto.first_message(result, "run_time")
    run_time_ns = None
    if run_time is not None:
        seconds = _int(textproto.first_scalar(run_time, "seconds")) or 0
        nanos = _int(textproto.first_scalar(run_time, "nanos")) or 0
        run_time_ns = seconds * 1_000_000_000 + nanos
    kind, detail = "none", None
    for key, name in _KIND_OF_KEY.items():
        sub = textproto.first_message(result, key)
        if sub is not None:
            kind, detail = name, _describe(sub) or "(defaults)"
    failure_msg = None
    failure = textproto.first_message(result, "failure")
    if failure is not None:
        kind_value = textproto.first_scalar(failure, "kind")
        # The name, or the number of a value the printer's schema lacked; absent is UNKNOWN (0).
        reason = _str(kind_value) or (
            str(kind_value) if _int(kind_value) is not None else "UNKNOWN"
        )
        text = _str(textproto.first_scalar(failure, "msg"))
        failure_msg = f"{reason}: {text}" if text else reason
        kind = "failure"
    return AutotuneResultInfo(
        kind=kind,
        run_time_ns=run_time_ns,
        scratch_bytes=_int(textproto.first_scalar(result, "scratch_bytes")),
        detail=detail,
        failure=failure_msg,
        model=model,
        hlo=hlo,
        version=version,
        result_count=count,
    )


def parse_autotune_text(text: str) -> AutotuneResultInfo:
    """Interpret a per-fusion file: a bare ``AutotuneResult`` (what XLA writes), an
    ``AutotuneResults.Entry`` or a whole ``AutotuneResults``. Raises a FormatError if the text
    does not parse."""
    msg = textproto.parse(text)
    results = [v for v in msg.get("results", []) if isinstance(v, dict)]
    if results:  # AutotuneResults: describe the first entry
        entry = results[0]
        count = len(results)
    else:
        entry = msg
        count = 1
    if results or "result" in entry or "device" in entry or "hlo" in entry:
        inner = textproto.first_message(entry, "result") or {}
        return _result_info(
            inner,
            _str(textproto.first_scalar(entry, "device")),
            _str(textproto.first_scalar(entry, "hlo")),
            _int(textproto.first_scalar(entry, "version")),
            count,
        )
    return _result_info(entry, None, None, None, count)


def _open_file(path: Path) -> tuple[BinaryIO, int]:
    """``path`` open for reading and its size, when it is a regular file: a symbolic link is
    refused (ELOOP), never followed, and a FIFO or device is refused without blocking (this
    layer reads no cache file: ``storage/files.open_regular`` is not for it to import)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_autotune_file(path: Path, *, max_bytes: int = MAX_AUTOTUNE_FILE_BYTES) -> AutotuneEntry:
    """Read and interpret one per-fusion file; problems are returned, never raised."""
    problems: list[str] = []
    name_ok = is_autotune_file_name(path.name)
    if not name_ok:
        problems.append("name is not a 43-character url-safe base64 SHA-256 + .textproto")
    try:
        fh, size = _open_file(path)
        with fh:
            if size > max_bytes:
                problems.append(f"{size} bytes, over the {max_bytes}-byte limit: not parsed")
                return AutotuneEntry(path.name, size, name_ok, None, tuple(problems))
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        problems.append(f"cannot read: {os_reason(exc)}")
        return AutotuneEntry(path.name, 0, name_ok, None, tuple(problems))
    result = None
    if not raw.strip():
        problems.append("empty file")
    else:
        try:
            result = parse_autotune_text(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problems.append(f"not UTF-8 text (byte {exc.start})")
        except FormatError as exc:
            problems.append(f"does not parse: {exc}")
    return AutotuneEntry(path.name, len(raw), name_ok, result, tuple(problems))


def scan_autotune_dir(
    path: Path,
    *,
    max_files: int = MAX_AUTOTUNE_FILES,
    max_file_bytes: int = MAX_AUTOTUNE_FILE_BYTES,
) -> AutotuneDirReport:
    """Summarise a per-fusion autotune directory; a missing directory is not a problem."""
    problems: list[str] = []
    entries: list[AutotuneEntry] = []
    tmp: list[str] = []
    other: list[str] = []
    total = 0
    if path.is_symlink():  # never entered: its files are outside the cache
        return AutotuneDirReport(
            path, True, (), (), (), 0, (), (), ("a symbolic link; not followed",)
        )
    if not path.is_dir():
        return AutotuneDirReport(path, False, (), (), (), 0, (), (), ())
    try:
        children = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:
        problems.append(f"cannot list: {os_reason(exc)}")
        children = []
    for child in children:
        if len(entries) >= max_files:
            problems.append(f"more than {max_files} files; the rest were not read")
            break
        try:
            if child.is_dir(follow_symlinks=False):
                if child.name == "tmp":  # a folder itself (not a link): listed, never read
                    for sub in sorted(os.scandir(child.path), key=lambda e: e.name):
                        tmp.append(sub.name)
                        total += sub.stat(follow_symlinks=False).st_size
                else:
                    other.append(child.name + "/")
                continue
            if not child.name.endswith(".textproto") or not child.is_file(follow_symlinks=False):
                other.append(child.name)
                total += child.stat(follow_symlinks=False).st_size
                continue
        except OSError as exc:
            problems.append(f"{child.name}: {os_reason(exc)}")
            continue
        entry = read_autotune_file(Path(child.path), max_bytes=max_file_bytes)
        entries.append(entry)
        total += entry.size
    if tmp:
        odd = [n for n in tmp if not _TMP_NAME.fullmatch(n)]
        problems.append(
            f"{len(tmp)} file(s) left in tmp/ (interrupted or in-flight writes)"
            + (f", {len(odd)} not named like XLA's temp files" if odd else "")
        )
    bad = sum(1 for e in entries if e.problems)
    if bad:
        problems.append(f"{bad} entr{'y' if bad == 1 else 'ies'} with problems")
    counts: dict[str, int] = {}
    models: set[str] = set()
    for e in entries:
        if e.result is not None:
            counts[e.result.kind] = counts.get(e.result.kind, 0) + 1
            if e.result.model:
                models.add(e.result.model)
    if len(models) > 1:
        problems.append(f"entries written by {len(models)} different GPU models")
    return AutotuneDirReport(
        path=path,
        exists=True,
        entries=tuple(entries),
        tmp_leftovers=tuple(tmp),
        other_files=tuple(other),
        total_bytes=total,
        kind_counts=tuple(sorted(counts.items())),
        models=tuple(sorted(models)),
        problems=tuple(problems),
    )


# --- kernel cache ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelCacheEntry:
    name: str
    fingerprint: str | None
    num_blocks: tuple[int, int, int] | None  # (x, y, z); a scalar count is (n, 1, 1)
    threads_per_block: tuple[int, int, int] | None
    cluster_dim: tuple[int, int, int] | None
    shmem_bytes: int | None
    binary_size: int


@dataclass(frozen=True)
class KernelCacheReport:
    path: Path | None
    size: int
    parsed: bool  # False: the file (or its tail) does not parse; entries are those before
    compatibility_version: int | None
    entries: tuple[KernelCacheEntry, ...]
    total_binary_bytes: int
    problems: tuple[str, ...]


_SMALL = 1 << 16  # names, fingerprints, launch dimensions: never large


def _dims(raw: bytes | memoryview) -> tuple[int, int, int]:
    f = fields_by_number(raw)
    out = []
    for n in (1, 2, 3):
        v = f.get(n, [0])[-1]
        out.append(v if isinstance(v, int) else 0)
    return (out[0], out[1], out[2])


def _dim_field(value: int | StreamField) -> tuple[int, int, int]:
    if isinstance(value, int):
        return (value, 1, 1)
    return _dims(value.read(_SMALL))


def _kernel_entry(field: StreamField) -> KernelCacheEntry:
    name = ""
    fingerprint = None
    blocks = threads = cluster = None
    shmem = None
    binary_size = 0
    for number, wire_type, value in field.sub():
        if number == 1 and isinstance(value, StreamField):
            name = value.read(_SMALL).decode("utf-8", "replace")
        elif number == 2 and isinstance(value, StreamField):
            for enumber, _ewt, evalue in value.sub():
                if enumber == 1 and isinstance(evalue, StreamField):
                    fingerprint = evalue.read(_SMALL).decode("utf-8", "replace")
                elif enumber == 2 and isinstance(evalue, StreamField):
                    launch = fields_by_number(evalue.read(_SMALL))
                    b, t = launch.get(1, [None])[-1], launch.get(2, [None])[-1]
                    blocks = None if b is None else (b, 1, 1) if isinstance(b, int) else _dims(b)
                    threads = None if t is None else (t, 1, 1) if isinstance(t, int) else _dims(t)
                elif enumber == 3 and isinstance(evalue, StreamField):
                    cluster = _dim_field(evalue)
                elif enumber == 4 and isinstance(evalue, int):
                    shmem = evalue
                elif enumber == 5 and isinstance(evalue, StreamField):
                    binary_size = evalue.length
                    evalue.skip()
        del wire_type
    return KernelCacheEntry(name, fingerprint, blocks, threads, cluster, shmem, binary_size)


def read_kernel_cache(path: Path, *, max_entries: int = MAX_KERNEL_ENTRIES) -> KernelCacheReport:
    """Read the kernel cache file streaming; a missing or damaged file gives problems."""
    try:
        fh, size = _open_file(path)
    except OSError as exc:
        return KernelCacheReport(path, 0, False, None, (), 0, (f"cannot read: {os_reason(exc)}",))
    with fh:
        return _kernel_cache(ByteStream(fh), path, size, max_entries)


def parse_kernel_cache(data: bytes, *, max_entries: int = MAX_KERNEL_ENTRIES) -> KernelCacheReport:
    """Same as ``read_kernel_cache`` for bytes already in memory."""
    import io

    return _kernel_cache(ByteStream(io.BytesIO(data)), None, len(data), max_entries)


def _kernel_cache(
    stream: ByteStream, path: Path | None, size: int, max_entries: int
) -> KernelCacheReport:
    entries: list[KernelCacheEntry] = []
    version: int | None = None
    problems: list[str] = []
    parsed = True
    try:
        for number, wire_type, value in iter_stream_fields(stream):
            if number == 1 and wire_type == LEN and isinstance(value, StreamField):
                if len(entries) >= max_entries:
                    problems.append(f"more than {max_entries} entries; the rest were not read")
                    break
                entries.append(_kernel_entry(value))
            elif number == 2 and wire_type == VARINT and isinstance(value, int):
                version = value
    except (WireError, StreamEnd) as exc:
        parsed = False
        problems.append(f"does not parse as CompilationCacheProto: {exc}")
    if size == 0:
        problems.append("empty file")
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        problems.append("kernel names repeat (a map key written twice)")
    return KernelCacheReport(
        path=path,
        size=size,
        parsed=parsed,
        compatibility_version=version,
        entries=tuple(entries),
        total_binary_bytes=sum(e.binary_size for e in entries),
        problems=tuple(problems),
    )


# --- both ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubcacheReport:
    """The sub-caches of one JAX cache directory; ``kernel_cache`` is None when absent."""

    autotune: AutotuneDirReport
    kernel_cache: KernelCacheReport | None

    @property
    def paths(self) -> tuple[Path, ...]:
        """What exists on disk: the paths ``prune --xla-subcaches`` would remove."""
        found = [self.autotune.path] if self.autotune.exists else []
        if self.kernel_cache is not None and self.kernel_cache.path is not None:
            found.append(self.kernel_cache.path)
        return tuple(found)


def scan_subcaches(cache_dir: Path) -> SubcacheReport:
    """Read both sub-caches at their JAX default places inside ``cache_dir``."""
    kernel = cache_dir / KERNEL_CACHE_FILE
    return SubcacheReport(
        autotune=scan_autotune_dir(cache_dir / AUTOTUNE_DIR),
        kernel_cache=read_kernel_cache(kernel) if kernel.is_file() or kernel.is_symlink() else None,
    )
