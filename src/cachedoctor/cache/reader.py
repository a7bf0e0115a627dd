"""The one place that decodes JAX's cache entries (cache/listdir.py lists the directory).

Layout (see docs/format.md): ``<module>-<sha256 hex>-cache`` files, each zstd or zlib of
``[4-byte big-endian compile seconds][payload]``; the payload is an ``ExecutableAndOptionsProto``,
preceded from jax 0.9.1 by a varint-length ``pjrt_ifrt`` metadata header, and on GPU from 0.9.1 a
Riegeli "split proto". Every function here returns data; a bad entry comes back with
``problems`` set, it never raises.

Two walks of one format, sharing every step but the reading. An entry of at most 64 MiB
decompressed is decompressed whole and its payload walked by slicing (``_walk_payload_buffer``);
a copy of a payload already decoded in this process is not walked again. Bigger entries, detail
decodes (``show``/``diff`` hash every field) and any entry the in-memory walk cannot finish
are walked as a stream (``_walk_payload``): large fields (object code, cubins) are hashed and
skipped, only the HLO module and compile options are held, so memory does not grow with entry
size, and a problem is named with its offset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO, cast

try:
    import zstandard
except ImportError:  # a declared dependency, but JAX itself runs without it (zlib entries)
    zstandard = None  # type: ignore[assignment]

from cachedoctor.cache.decompress import (
    DecodeFailure,
    Decompressor,
    decompress_whole,
    detect_compression,
)
from cachedoctor.cache.listdir import CacheListing, DirItem, parse_key
from cachedoctor.cache.model import (
    EntryDetail,
    EntryInfo,
    FieldDigest,
    GpuSummary,
    Problem,
    Section,
    updated,
)
from cachedoctor.errors import os_reason
from cachedoctor.formats import wire
from cachedoctor.formats.errors import FormatError
from cachedoctor.layout import (
    CACHE_SUFFIX,
)
from cachedoctor.storage.files import open_regular
from cachedoctor.storage.stores import Store
from cachedoctor.xla import gpu
from cachedoctor.xla import hlo as hlo_mod
from cachedoctor.xla import hlo_facts as hlo_facts_mod
from cachedoctor.xla.compile_options import canonical_compile_options, decode_compile_options
from cachedoctor.xla.executable import (
    CPU_SIZE_SECTIONS,
    CPU_TARGET_MACHINE_FIELD,
    GPU_SIZE_SECTIONS,
    cpu_target_machine,
)

RIEGELI_MAGIC = b"\x83\xaf\x70\xd1\x0d\x88\x4a\x3f"

DEFAULT_MAX_DECOMPRESSED = 8 << 30  # a bigger entry is reported, not decoded
MAX_HLO_BYTES = 1 << 30
MAX_OPTIONS_BYTES = 64 << 20
MAX_HEADER_BYTES = 64 << 20
SMALL_FIELD = 64 << 10  # executable sub-fields kept whole for interpretation


# --- entries -------------------------------------------------------------------------------


@dataclass
class _Walk:
    """Mutable state of one streaming decode."""

    fields: dict[str, object] = field(default_factory=dict)
    hlo_module: bytes | None = None
    hlo_config: bytes | None = None
    compile_options: bytes | None = None
    ifrt_header: bytes | None = None
    small: list[tuple[int, bytes | memoryview]] = field(default_factory=list)  # <= SMALL_FIELD
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
        _note_gpu_executable(walk, fld.read(MAX_HLO_BYTES))
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
            _note_hlo_proto(walk, data)
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


def _note_gpu_executable(walk: _Walk, data: bytes) -> None:
    """A GPU executable written as a Riegeli split proto: decoded whole by ``gpu``."""
    try:
        decoded = gpu.decode_gpu_executable(data, max_bytes=MAX_HLO_BYTES)
    except FormatError as exc:
        raise DecodeFailure(_format_problem_kind(exc), f"GPU executable: {exc}") from exc
    walk.gpu_executable = decoded
    walk.hlo_module = decoded.hlo_module


def _note_hlo_proto(walk: _Walk, data: wire.Buffer) -> None:
    """The executable's ``HloProto``: keep its module and config. Raises WireError."""
    hf = wire.fields_by_number(data)
    module = wire.first(hf, 1)
    config = wire.first(hf, 2)
    walk.hlo_module = bytes(module) if module is not None and not isinstance(module, int) else None
    walk.hlo_config = bytes(config) if config is not None and not isinstance(config, int) else None


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
    heads = [(n, bytes(d[:64])) for n, d in walk.small] + [(n, h) for n, _, h in walk.sections]
    for n, head in heads:
        if head.startswith(b"\x7fELF") and len(head) >= 20:
            machine = int.from_bytes(head[18:20], "little")
            return "gpu" if machine == 190 else "cpu"  # EM_CUDA = 190
        if n == 3 and head.lstrip().startswith((b"//", b".version")):
            return "gpu"
    if 9 in numbers or 7 in numbers:
        return "cpu"
    return "unknown"


def _interpret_executable(walk: _Walk, platform: str, out: dict[str, object]) -> list[Section]:
    names = GPU_SIZE_SECTIONS if platform == "gpu" else CPU_SIZE_SECTIONS
    sizes: dict[str, int] = {}
    for n, size, _ in walk.sections:
        label = names.get(n, f"field {n}")
        sizes[label] = sizes.get(label, 0) + size
    for n, data in walk.small:
        if n in names:
            label = names[n]
            sizes[label] = sizes.get(label, 0) + len(data)
        if platform == "cpu" and n == CPU_TARGET_MACHINE_FIELD:
            target = cpu_target_machine(bytes(data))
            if target is not None:
                out["cpu_triple"], out["cpu_name"] = target[0], target[1]
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
    info = EntryInfo(key=key, module=module, path=path, size=size, mtime_ns=mtime_ns)
    problems: list[Problem] = []
    if fileobj is not None:
        whole = None if detail else _decode_in_memory(fileobj, info, max_decompressed)
        if whole is not None:
            return whole
        info = _decode_open_file(fileobj, info, walk, problems, max_decompressed)
    else:
        try:
            fh = open_regular(path)
        except OSError as exc:
            kind = "symlink" if exc.errno == errno.ELOOP else "unreadable"
            msg = "is a symbolic link; not followed" if kind == "symlink" else os_reason(exc)
            problems.append(Problem(kind, str(msg)))
        else:
            with fh:
                st = os.fstat(fh.fileno())
                info = EntryInfo(
                    key=key, module=module, path=path, size=st.st_size, mtime_ns=st.st_mtime_ns
                )
                whole = None if detail else _decode_in_memory(fh, info, max_decompressed)
                if whole is not None:
                    return whole
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
        small_fields=tuple((n, bytes(d)) for n, d in walk.small),
        executable_fields=tuple(walk.digests),
    )


_PAYLOAD_MEMO: dict[str, EntryInfo] = {}
_PAYLOAD_MEMO_MAX = 4096


def _decode_in_memory(fh: BinaryIO, info: EntryInfo, cap: int) -> EntryInfo | None:
    """Decode an entry decompressed whole into memory, or None to let the stream decoder do it.

    The digest of the payload is known before the walk, so an executable already decoded in
    this process (copies under other keys: unstable keys write the same executable again and
    again, differing only in the compile-time prefix) is not walked again: what the payload
    shows is a function of its bytes. A payload the walk cannot finish (damaged bytes) is
    decoded again by the stream decoder, which names the problem and where; problems found
    after the walk (a malformed HLO module) are the same from either decoder and are returned.
    """
    whole = decompress_whole(fh, cap)
    if whole is None or len(whole[0]) < 5:
        return None
    raw, compression, digest = whole
    per_entry = {"compile_time_s": int.from_bytes(raw[:4], "big"), "compression": compression}
    known = _PAYLOAD_MEMO.get(digest)
    if known is not None:
        return updated(
            known,
            key=info.key,
            module=info.module,
            path=info.path,
            size=info.size,
            mtime_ns=info.mtime_ns,
            **per_entry,
        )
    walk = _Walk()
    try:
        _walk_payload_buffer(memoryview(raw)[4:], walk)
    except (DecodeFailure, wire.WireError):
        return None
    problems: list[Problem] = []
    info = replace(
        info,
        decompressed_size=len(raw),
        executable_digest=digest,
        **per_entry,  # type: ignore[arg-type]
    )
    info = _finish(info, walk, problems)
    if info.problems:
        return info  # not memoised: only clean decodes are served to copies
    if len(_PAYLOAD_MEMO) >= _PAYLOAD_MEMO_MAX:
        _PAYLOAD_MEMO.clear()
    _PAYLOAD_MEMO[digest] = info
    return info


def _decode_open_file(
    fh: BinaryIO, info: EntryInfo, walk: _Walk, problems: list[Problem], cap: int
) -> EntryInfo:
    """Decode an open entry file into ``walk``; problems are appended, never raised."""
    dec: Decompressor | None = None
    found: dict[str, Any] = {}  # applied once at the end: each replace() costs ~20 us
    try:
        head = fh.read(4)
        fh.seek(0)
        if not head:
            raise DecodeFailure("truncated", "empty file")
        compression = detect_compression(head)
        if compression is None:
            raise DecodeFailure("not-compressed", "neither zstd nor zlib (bad magic bytes)")
        found["compression"] = compression
        dec = Decompressor(fh, compression, cap, hash_from=4)
        stream = wire.ByteStream(dec)
        try:
            prefix = stream.read_exact(4)
        except wire.StreamEnd as exc:
            raise DecodeFailure("truncated", "shorter than the 4-byte compile-time prefix") from exc
        found["compile_time_s"] = int.from_bytes(prefix, "big")
        _walk_payload(stream, walk)
        dec.drain()
        dec.check_complete()
    except DecodeFailure as failure:
        problems.append(failure.problem)
    except wire.StreamEnd as exc:
        problems.append(Problem("truncated", f"payload ends early: {exc}"))
    except wire.WireError as exc:
        problems.append(Problem("protobuf", f"malformed protobuf: {exc}"))
    except OSError as exc:
        problems.append(Problem("unreadable", os_reason(exc)))
    if dec is None:
        return replace(info, **found)
    if problems and problems[0].kind in ("protobuf", "truncated", "header"):
        try:  # a malformed payload is often a file cut short: say so when it is
            dec.drain()
            dec.check_complete()
        except DecodeFailure as failure:
            if failure.problem.kind != problems[0].kind or len(problems) == 1:
                problems.insert(0, failure.problem)
        except (OSError, ValueError):
            pass
    found["decompressed_size"] = dec.produced
    if not problems:
        found["executable_digest"] = dec.hasher.hexdigest()
    return replace(info, **found)


def _ifrt_header_at(window: bytes) -> tuple[int, bytes] | None:
    """``(prefix length, header)`` when ``window`` starts with a ``pjrt_ifrt`` header, else None.

    Evidence, not one byte: the varint length must parse, the header must decode as a
    ``SerializedXlaExecutableMetadata`` (field 1 a version number, field 2 if present a runtime
    name), and what follows must open an ``ExecutableAndOptionsProto`` (field 1) or a Riegeli
    file. A bare proto's first bytes (``0a`` + length; field 1 is then not a number) and a
    header of 131 bytes (``83 01``) pass or fail on these grounds, not on their first byte.
    """
    try:
        length, start = wire.read_varint(window, 0, len(window))
    except wire.WireError:
        return None
    end = start + length
    if length == 0 or end >= len(window):
        return None
    header = window[start:end]
    try:
        fields = wire.fields_by_number(header)
    except wire.WireError:
        return None
    version, runtime = wire.first(fields, 1), wire.first(fields, 2)
    if not isinstance(version, int) or isinstance(runtime, int):
        return None
    try:
        bytes(runtime or b"").decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not _opens_payload(window[end:]):
        return None
    return start, header


def _opens_payload(data: bytes) -> bool:
    """Whether ``data`` can start an ``ExecutableAndOptionsProto``: plain (field 1) or Riegeli."""
    if data.startswith(RIEGELI_MAGIC):
        return True
    if data[:1] != b"\x0a":
        return False
    try:
        wire.read_varint(data, 1, len(data))
    except wire.WireError:
        return False
    return True


def _payload_prefix(peek: Callable[[int], bytes]) -> tuple[int, bytes] | None:
    """``(prefix length, header)`` when the payload opens with a ``pjrt_ifrt`` header; None
    when it opens an ``ExecutableAndOptionsProto`` or a Riegeli file. ``peek(n)`` shows up to
    ``n`` bytes of the payload. Raises DecodeFailure when the payload opens none of these."""
    head = peek(wire.MAX_VARINT_BYTES + len(RIEGELI_MAGIC))
    if not head:
        raise DecodeFailure("truncated", "no executable after the compile-time prefix")
    if head.startswith(RIEGELI_MAGIC):
        return None
    try:
        claimed, start = wire.read_varint(head, 0, len(head))
    except wire.WireError:
        claimed, start = -1, 0
    found = None
    if 0 < claimed <= MAX_HEADER_BYTES:
        found = _ifrt_header_at(peek(start + claimed + wire.MAX_VARINT_BYTES + 8))
    if found is None and not _opens_payload(head):
        raise DecodeFailure(
            "header",
            "payload is neither an ExecutableAndOptionsProto, a Riegeli file, nor a"
            f" pjrt_ifrt header followed by one (starts {head[:8].hex(' ')})",
        )
    return found


def _note_ifrt_header(walk: _Walk, header: bytes) -> None:
    hf = wire.fields_by_number(header)
    walk.ifrt_header = header
    walk.fields["ifrt_version"] = wire.as_int(wire.first(hf, 1))
    walk.fields["runtime_name"] = wire.as_str(wire.first(hf, 2))


def _walk_payload(stream: wire.ByteStream, walk: _Walk) -> None:
    found = _payload_prefix(stream.peek)
    if found is not None:
        prefix, header = found
        stream.skip(prefix + len(header))
        _note_ifrt_header(walk, header)
    if stream.peek(len(RIEGELI_MAGIC)) == RIEGELI_MAGIC:
        stream = _unsplit_payload(stream, walk)
    walk.fields["payload_format"] = "pjrt" if found is None else "ifrt"
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


def _walk_payload_buffer(payload: memoryview, walk: _Walk) -> None:
    """``_walk_payload`` over a payload held in memory: the same steps, with fields sliced out
    of the buffer by ``wire.field_list`` instead of read from a stream one by one (a CPU
    executable holds hundreds of small object files; streaming them cost a quarter of a large
    program's decode).

    Raises WireError or DecodeFailure wherever the stream walk would note or report something
    (an executable that is not a proto we know, a field over its limit): the caller then lets
    the stream decoder say it, in its words and offsets.
    """
    found = _payload_prefix(lambda n: bytes(payload[:n]))
    if found is not None:
        prefix, header = found
        payload = payload[prefix + len(header) :]
        _note_ifrt_header(walk, header)
    if payload[: len(RIEGELI_MAGIC)] == RIEGELI_MAGIC:
        payload = memoryview(_unsplit(bytes(payload), walk))
    walk.fields["payload_format"] = "pjrt" if found is None else "ifrt"
    for number, wt, value in wire.field_list(payload):
        if wt != wire.LEN:
            continue
        assert isinstance(value, memoryview)
        if number == 1:
            _walk_executable_buffer(value, walk)
        elif number == 2:
            walk.compile_options = bytes(_capped(value, MAX_OPTIONS_BYTES))
        elif number == 3:
            walk.fields["pjrt_client_name"] = bytes(_capped(value, 4096)).decode("utf-8", "replace")


def _capped(value: memoryview, cap: int) -> memoryview:
    if len(value) > cap:
        raise wire.WireError(f"a field is {len(value)} bytes, over the {cap}-byte limit", 0)
    return value


def _walk_executable_buffer(executable: memoryview, walk: _Walk) -> None:
    """``_walk_executable`` over an executable held in memory (see ``_walk_payload_buffer``)."""
    if len(executable) and executable[0] == RIEGELI_MAGIC[0]:
        _note_gpu_executable(walk, bytes(_capped(executable, MAX_HLO_BYTES)))
        return
    for number, _wt, value in wire.field_list(executable):
        if isinstance(value, int):
            walk.scalars.append((number, value))
        elif number == 1:
            _note_hlo_proto(walk, _capped(value, MAX_HLO_BYTES))
        elif len(value) <= SMALL_FIELD:
            walk.small.append((number, value))  # a slice: no copy of each object file
        else:
            walk.sections.append((number, len(value), bytes(value[:64])))


# What the stored HLO shows of key inputs that change from run to run (evidence of an unstable key)
KEY_VOLATILE_CATEGORIES = frozenset({"backend_config-pointer", "custom-partitioning"})

_HLO_MEMO: dict[bytes, hlo_facts_mod.ScanFacts] = {}
_HLO_MEMO_MAX = 1024


def hlo_facts(module: bytes) -> hlo_facts_mod.ScanFacts:
    """Summary, program digest and key-volatile fields of an HLO module, memoised by its sha256.

    Caches hold the same module under many keys (unstable keys, relocated copies); reading it
    once per process instead of once per entry saves most of a scan's work. Raises WireError.
    """
    digest = hashlib.sha256(module).digest()
    found = _HLO_MEMO.get(digest)
    if found is None:
        if len(_HLO_MEMO) >= _HLO_MEMO_MAX:
            _HLO_MEMO.clear()
        found = _HLO_MEMO[digest] = hlo_facts_mod.scan_facts(module)
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
    while chunk := stream.read_some(1 << 20):
        parts.append(chunk)
    return wire.ByteStream(io.BytesIO(_unsplit(b"".join(parts), walk)))


def _unsplit(data: bytes, walk: _Walk) -> bytes:
    try:
        unwrapped = gpu.unwrap_pjrt_payload(data, max_bytes=DEFAULT_MAX_DECOMPRESSED)
    except FormatError as exc:
        raise DecodeFailure(_format_problem_kind(exc), f"split-proto payload: {exc}") from exc
    walk.payload_split = True
    return unwrapped.executable_and_options


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
            facts = hlo_facts(walk.hlo_module)
            summary, volatile = facts.summary, facts.volatile
            program.update(facts.program_digest.encode())
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
            else open_regular(os.fspath(path))
        )
        with opened as fh:
            compression = detect_compression(fh.read(4))
            fh.seek(0)
            if compression is None:
                raise ValueError("neither zstd nor zlib (bad magic bytes)")
            dec = Decompressor(fh, compression, max_decompressed, hash_from=4)
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
    except DecodeFailure as failure:
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
