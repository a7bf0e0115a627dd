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

The steps live in two private modules that only this one imports: ``_payload`` (the framing:
the ``pjrt_ifrt`` header, the split payload, the walk of the payload's fields) and
``_executable_walk`` (the executable's fields and what they show). This module holds the entry
files, their decompression, the memos and the API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, BinaryIO, cast

try:
    import zstandard
except ImportError:  # a declared dependency, but JAX itself runs without it (zlib entries)
    zstandard = None  # type: ignore[assignment]

from cachedoctor.cache._executable_walk import (
    _gpu_summary,
    _infer_platform,
    _interpret_executable,
    _tpu_summary,
    _Walk,
)
from cachedoctor.cache._payload import _walk_payload, _walk_payload_buffer
from cachedoctor.cache.decompress import (
    DecodeFailure,
    Decompressor,
    content_key,
    decompress_whole,
    detect_compression,
)
from cachedoctor.cache.listdir import CacheListing, DirItem, parse_key
from cachedoctor.cache.model import (
    EntryDetail,
    EntryInfo,
    Problem,
    TpuSummary,
    updated,
)
from cachedoctor.errors import os_reason
from cachedoctor.formats import wire
from cachedoctor.layout import (
    CACHE_SUFFIX,
)
from cachedoctor.storage.files import open_regular
from cachedoctor.storage.stores import Store
from cachedoctor.xla import hlo as hlo_mod
from cachedoctor.xla import hlo_facts as hlo_facts_mod
from cachedoctor.xla import mosaic
from cachedoctor.xla.compile_options import canonical_compile_options, decode_compile_options

DEFAULT_MAX_DECOMPRESSED = 8 << 30  # a bigger entry is reported, not decoded


# --- entries -------------------------------------------------------------------------------


def decode_entry(
    path: str | os.PathLike[str],
    *,
    key: str | None = None,
    detail: bool = False,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    fileobj: BinaryIO | None = None,
    size: int = 0,
    mtime_ns: int = 0,
    defer_hlo: bool = False,
    file_digest: str | None = None,
) -> EntryInfo | EntryDetail:
    """Decode one ``-cache`` file. Never raises for bad content: see ``EntryInfo.problems``.

    With ``fileobj`` (an open, seekable binary file: an object in a bucket), ``path`` is only
    the name to report and ``size``/``mtime_ns`` come from the caller's listing; the caller
    closes it. ``file_digest``, with ``fileobj``: a digest of the whole of its bytes
    (``travel.decode_digested``, which first asks ``copy_of_file``), under which the entry is
    remembered (``_FILE_MEMO``).

    ``defer_hlo``: the first tier only (see ``tiers.py``): the HLO module's summary, program
    digest and volatile fields are left out (``hlo_deferred``) and only its signature is
    computed. A detail decode ignores it.
    """
    path = os.fspath(path)
    key, module = _key_and_module(path, key, fileobj is not None)
    defer_hlo = defer_hlo and not detail
    walk = _Walk(hash_fields=detail)
    info = EntryInfo(key=key, module=module, path=path, size=size, mtime_ns=mtime_ns)
    problems: list[Problem] = []
    if fileobj is not None:
        whole = None if detail else _decode_in_memory(fileobj, info, max_decompressed, defer_hlo)
        if whole is not None:
            if file_digest is not None:
                _remember_file(file_digest, whole)
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
                whole = None if detail else _decode_in_memory(fh, info, max_decompressed, defer_hlo)
                if whole is not None:
                    return whole
                info = _decode_open_file(fh, info, walk, problems, max_decompressed)
    info = _finish(info, walk, problems, defer_hlo)
    if info.hlo_deferred:  # as a decode in memory leaves it: the second tier's evidence
        info = replace(info, executable_digest=None)
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
        original_module=walk.tpu_executable.original_module if walk.tpu_executable else None,
    )


def _key_and_module(path: str, key: str | None, url: bool) -> tuple[str, str | None]:
    """The entry's key (given, or from its file name) and the module it names, if any."""
    if key is None:
        name = path.rstrip("/").rsplit("/", 1)[-1] if url else os.path.basename(path)
        base = name[: -len(CACHE_SUFFIX)] if name.endswith(CACHE_SUFFIX) else name
        parsed = parse_key(base)
        key = parsed[0] if parsed else base
    parsed_key = parse_key(key)
    return key, parsed_key[1] if parsed_key else None


def copy_of_file(
    file_digest: str, path: str, key: str | None, size: int, mtime_ns: int, cap: int
) -> EntryInfo | None:
    """The entry of the file at ``path`` when its bytes (``file_digest``) equal those of one
    this process decoded with every tier and it decompresses to at most ``cap`` bytes, else
    None. Unstable keys write one executable again and again; where the compile time is the
    same too, the files are equal byte for byte (the bench's copies corpora, ``cache-NNk``):
    such a copy is neither decompressed nor hashed again, what a file shows is a function of
    its bytes, and only the name, size and mtime are its own. A file decoded with the first
    tier only is not served (as in ``_decode_in_memory``: its second copy is decoded with every
    tier, and that one is served to the rest)."""
    known = _FILE_MEMO.get(file_digest)
    if known is None or known.hlo_deferred or (known.decompressed_size or 0) > cap:
        return None
    key, module = _key_and_module(path, key, False)
    return updated(known, key=key, module=module, path=path, size=size, mtime_ns=mtime_ns)


_PAYLOAD_MEMO: dict[str, EntryInfo] = {}
_PAYLOAD_MEMO_MAX = 4096
_FILE_MEMO: dict[str, EntryInfo] = {}


def _remember_file(file_digest: str, info: EntryInfo) -> None:
    if info.problems:
        return  # as the payload memo: only clean decodes are served to copies
    if len(_FILE_MEMO) >= _PAYLOAD_MEMO_MAX:
        _FILE_MEMO.clear()
    _FILE_MEMO[file_digest] = info


def clear_memos() -> None:
    """Forget what this process decoded (benchmarks measuring a first scan, tests)."""
    _PAYLOAD_MEMO.clear()
    _FILE_MEMO.clear()
    _HLO_MEMO.clear()
    _OPTIONS_MEMO.clear()


def _decode_in_memory(
    fh: BinaryIO, info: EntryInfo, cap: int, defer_hlo: bool = False
) -> EntryInfo | None:
    """Decode an entry decompressed whole into memory, or None to let the stream decoder do it.

    The digest of the payload is known before the walk, so an executable already decoded in
    this process (copies under other keys: unstable keys write the same executable again and
    again, differing only in the compile-time prefix) is not walked again: what the payload
    shows is a function of its bytes. A payload the walk cannot finish (damaged bytes) is
    decoded again by the stream decoder, which names the problem and where; problems found
    after the walk (a malformed HLO module) are the same from either decoder and are returned.
    A payload decoded with all tiers serves a first-tier decode too, not the other way round;
    a second entry of a payload decoded with the first tier only gets every tier, from the
    bytes in hand: copies of a payload under one module tie (``tiers.py``), so their facts
    will be needed, and one walk here spares decoding them again later.
    """
    whole = decompress_whole(fh, cap)
    if whole is None or len(whole[0]) < 5:
        return None
    raw, compression = whole
    payload = memoryview(raw)[4:]
    memo_key = content_key(payload)
    per_entry = {"compile_time_s": int.from_bytes(raw[:4], "big"), "compression": compression}
    known = _PAYLOAD_MEMO.get(memo_key)
    if known is not None and known.hlo_deferred:
        known, defer_hlo = None, False
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
        _walk_payload_buffer(payload, walk)
    except (DecodeFailure, wire.WireError):
        return None
    problems: list[Problem] = []
    info = replace(
        info,
        decompressed_size=len(raw),
        executable_digest=None if defer_hlo else hashlib.sha256(payload).hexdigest(),
        **per_entry,  # type: ignore[arg-type]
    )
    info = _finish(info, walk, problems, defer_hlo)
    if info.executable_digest is None and not info.hlo_deferred:  # no module, or a bad one
        info = replace(info, executable_digest=hashlib.sha256(payload).hexdigest())
    if info.problems:
        return info  # not memoised: only clean decodes are served to copies
    if len(_PAYLOAD_MEMO) >= _PAYLOAD_MEMO_MAX:
        _PAYLOAD_MEMO.clear()
    _PAYLOAD_MEMO[memo_key] = info
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


# What the stored HLO shows of key inputs that change from run to run (evidence of an unstable key)
KEY_VOLATILE_CATEGORIES = frozenset({"backend_config-pointer", "custom-partitioning"})

_HLO_MEMO: dict[str, hlo_facts_mod.ScanFacts] = {}
_HLO_MEMO_MAX = 1024


def hlo_facts(module: bytes) -> hlo_facts_mod.ScanFacts:
    """Summary, program digest and key-volatile fields of an HLO module, memoised by content.

    Caches hold the same module under many keys (unstable keys, relocated copies); reading it
    once per process instead of once per entry saves most of a scan's work. Raises WireError.
    """
    digest = content_key(module)
    found = _HLO_MEMO.get(digest)
    if found is None:
        if len(_HLO_MEMO) >= _HLO_MEMO_MAX:
            _HLO_MEMO.clear()
        found = _HLO_MEMO[digest] = hlo_facts_mod.scan_facts(module)
    return found


_OPTIONS_MEMO: dict[str, tuple[dict[str, object], bytes]] = {}


def options_facts(options: bytes) -> tuple[dict[str, object], bytes]:
    """``decode_compile_options`` and ``canonical_compile_options``, memoised by content.

    Entries of one cache mostly share their compile options byte for byte. Raises WireError.
    """
    digest = content_key(options)
    found = _OPTIONS_MEMO.get(digest)
    if found is None:
        found = (decode_compile_options(options), canonical_compile_options(options))
        if len(_OPTIONS_MEMO) >= _HLO_MEMO_MAX:
            _OPTIONS_MEMO.clear()
        _OPTIONS_MEMO[digest] = found
    return dict(found[0]), found[1]


def _finish(
    info: EntryInfo, walk: _Walk, problems: list[Problem], defer_hlo: bool = False
) -> EntryInfo:
    fields: dict[str, object] = dict(walk.fields)
    if walk.tpu_executable is not None:
        platform = "tpu"
    else:
        platform = "gpu" if walk.gpu_executable is not None else _infer_platform(walk)
    sections = _interpret_executable(walk, platform, fields)
    gpu_summary = _gpu_summary(walk) if platform == "gpu" else None
    tpu_summary = _tpu_summary(walk.tpu_executable, problems)
    summary = None
    deferred = False
    program = hashlib.sha256(platform.encode())
    signed = hashlib.sha256(platform.encode())
    volatile: tuple[hlo_mod.VolatileField, ...] = ()
    module = walk.hlo_module
    if module is not None:
        try:
            if defer_hlo:
                signed.update(hlo_facts_mod.signature(module).encode())
                deferred = True
            else:
                facts = hlo_facts(module)
                summary, volatile = facts.summary, facts.volatile
                program.update(facts.program_digest.encode())
                signed.update(facts.signature.encode())
        except wire.WireError as exc:
            problems.append(Problem("protobuf", f"HLO module is malformed: {exc}"))
    elif not problems and "opaque_executable" not in fields:
        problems.append(Problem("protobuf", "no HLO module in the serialized executable"))
    if walk.compile_options is not None:
        try:
            decoded, canonical = options_facts(walk.compile_options)
            fields.update(decoded)
            program.update(canonical)
            signed.update(canonical)
        except wire.WireError as exc:
            problems.append(Problem("protobuf", f"compile options are malformed: {exc}"))
    if tpu_summary is not None and tpu_summary.kernels and walk.hlo_module is not None:
        tpu_summary = _with_masked_digest(tpu_summary, platform, walk, problems)
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
        tpu=tpu_summary,
        sections=tuple(sections),
        program_digest=program.hexdigest() if summary is not None and not problems else None,
        volatile=volatile,
        problems=tuple(problems),
        program_signature=(
            signed.hexdigest() if (summary is not None or deferred) and not problems else None
        ),
        hlo_deferred=deferred and not problems,
    )


def _with_masked_digest(
    summary: TpuSummary, platform: str, walk: _Walk, problems: list[Problem]
) -> TpuSummary:
    """``summary`` with the program digest of its module with the kernel bodies masked (as
    ``program_digest``, over the same compile options): what scan groups kernels by."""
    assert walk.hlo_module is not None
    try:
        masked = mosaic.with_bodies(walk.hlo_module, mosaic.masked)
        digest = hashlib.sha256(platform.encode())
        digest.update(hlo_facts(masked).program_digest.encode())
        if walk.compile_options is not None:
            digest.update(options_facts(walk.compile_options)[1])
    except wire.WireError as exc:
        problems.append(Problem("protobuf", f"HLO module is malformed: {exc}"))
        return summary
    return replace(summary, masked_program_digest=digest.hexdigest())


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
        found = decode_entry(
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
    info = found.info if isinstance(found, EntryDetail) else found
    if not info.problems or store.is_local or item.version is None:
        return found
    changed = _changed_since_listed(store, item)
    if changed is None:
        return found
    info = replace(info, problems=(changed,))
    return replace(found, info=info) if isinstance(found, EntryDetail) else info


def _changed_since_listed(store: Store, item: DirItem) -> Problem | None:
    """Why a bucket object's problems say nothing of it, when they do not: it was rewritten or
    deleted after the listing (a writer elsewhere), so its read was refused (S3's ``If-Match``)
    or took the listed size of other bytes (GCS). One request, for entries with problems only.
    """
    try:
        now = store.fresh_version(item.name)
    except Exception:  # the server cannot say: the problems stand
        return None
    if now == item.version:
        return None
    happened = "deleted" if now is None else f"rewritten (version {now})"
    return Problem(
        "unreadable",
        f"{happened} while this scan read it (listed as version {item.version}): scan again",
    )


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
