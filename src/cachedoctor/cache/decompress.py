"""Streaming decompression of an entry: zstd or zlib by magic bytes, capped, truncation-aware."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import zlib
from collections.abc import Iterable
from typing import IO, BinaryIO, Protocol

try:
    import xxhash
except ImportError:  # a declared dependency
    xxhash = None  # type: ignore[assignment]
try:
    import zstandard
except ImportError:  # a declared dependency, but JAX itself runs without it (zlib entries)
    zstandard = None  # type: ignore[assignment]

from cachedoctor.cache.model import Problem
from cachedoctor.storage.files import open_regular

ZstdError: type[Exception] = zstandard.ZstdError if zstandard is not None else zlib.error


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class DecodeFailure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.problem = Problem(kind, message)


class Decompressor:
    """A bounded, hashing, read()-able view of a zstd or zlib stream.

    Output beyond ``cap`` raises; truncation is detected at the end (zstd's declared content
    size, zlib's end-of-stream marker) because python-zstandard's stream reader hides it.
    """

    def __init__(self, fh: BinaryIO, compression: str, cap: int, hash_from: int | None) -> None:
        self.compression = compression
        self.cap = cap
        self.produced = 0
        self._hash_from = hash_from  # None: nothing hashed
        self.hasher = hashlib.sha256()
        self._fh = fh
        self._zlib = zlib.decompressobj() if compression == "zlib" else None
        self.declared_size: int | None = None
        self._zstd: IO[bytes] | None = None
        if compression == "zstd":
            if zstandard is None:
                raise DecodeFailure(
                    "unsupported", "a zstd entry, but the zstandard package is not installed"
                )
            head = fh.read(18)
            try:
                params = zstandard.get_frame_parameters(head)
            except zstandard.ZstdError as exc:
                raise DecodeFailure("decompress", f"bad zstd frame header: {exc}") from exc
            if params.content_size != zstandard.CONTENTSIZE_UNKNOWN:
                self.declared_size = params.content_size
                if params.content_size > cap:
                    raise DecodeFailure(
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
            raise DecodeFailure("decompress", f"{self.compression} data is damaged: {exc}") from exc
        if data:
            start = self.produced
            self.produced += len(data)
            if self.produced > self.cap:
                raise DecodeFailure(
                    "too-large",
                    f"decompresses to more than {self.cap} bytes (the cap); not decoded",
                )
            if self._hash_from is not None and self.produced > self._hash_from:
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
                raise DecodeFailure("truncated", "zlib stream ends early (file cut short)")
        elif self.declared_size is not None and self.produced != self.declared_size:
            raise DecodeFailure(
                "truncated",
                f"zstd frame declares {self.declared_size} bytes but holds {self.produced}"
                " (file cut short, or a forged size)",
            )


# Entries up to this size (decompressed) are decompressed whole into memory, so their digest is
# known before the walk and copies of one executable are walked once (reader.decode_entry).
# Bigger ones stream.
WHOLE_DECODE_MAX = 64 << 20


def decompress_whole(fh: BinaryIO, cap: int) -> tuple[bytes, str] | None:
    """The whole decompressed entry and its compression, for an entry of at most
    ``WHOLE_DECODE_MAX`` decompressed bytes (and ``cap``). None otherwise, and for anything
    amiss (damaged, cut short, trailing bytes, a read that fails): the caller then decodes it
    as a stream, which names the problem. The checks are the stream decoder's own; a zstd
    frame's declared size, where there is one, rules out a bigger entry before anything is read
    (zlib and an unsized frame are read until the limit)."""
    try:
        compression = detect_compression(fh.read(4))
        fh.seek(0)
    except OSError:  # the stream decoder reads again and reports the entry unreadable
        return None
    if compression is None:
        return None
    limit = min(cap, WHOLE_DECODE_MAX)
    if compression == "zstd":
        whole = _zstd_sized_whole(fh, limit)
        if whole is not None:
            return whole, compression
    try:
        dec = Decompressor(fh, compression, cap, hash_from=None)
        if dec.declared_size is not None and dec.declared_size > limit:
            return None
        parts = []
        while chunk := dec.read(1 << 20):
            parts.append(chunk)
            if dec.produced > limit:
                return None
        dec.check_complete()
    except (DecodeFailure, OSError):
        return None
    finally:
        _rewind(fh)
    return b"".join(parts), compression


class FastHasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


# The one fast content digest (the reader's memos, the travelling index's digests): XXH3-128, or
# BLAKE2b-128 without ``xxhash`` (a declared dependency). Not evidence: the executable digest
# shown to users is SHA-256.
FAST_DIGEST_NAME = "xxh3-128" if xxhash is not None else "blake2b-128"


def fast_hasher() -> FastHasher:
    if xxhash is not None:
        return xxhash.xxh3_128()
    return hashlib.blake2b(digest_size=16)


def content_key(data: bytes | memoryview) -> str:
    """The fast digest of ``data`` in one call: what tells payloads apart within this process
    (the reader's memo of payloads, HLO modules and compile options)."""
    if xxhash is not None:
        return xxhash.xxh3_128_hexdigest(data)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


_ONE_READ = 1 << 20  # what Decompressor.read returns at most


def _rewind(fh: BinaryIO) -> None:
    """Back to the start for the next reader; a failing seek is that reader's to report."""
    with contextlib.suppress(OSError):
        fh.seek(0)


_THREAD = threading.local()


def _one_shot_zstd() -> zstandard.ZstdDecompressor:
    """This thread's decompressor for one-shot calls. A fresh one per entry cost ~30 us (its
    context allocated and first used again; most entries of a large cache are tens of KB).
    One per thread: a context is not to be shared by concurrent calls (bucket scans decode
    on threads). Each ``decompress`` call starts a new frame, so nothing carries over, and a
    one-shot call keeps no window buffer (the context stays ~100 KB)."""
    found: zstandard.ZstdDecompressor | None = getattr(_THREAD, "zstd", None)
    if found is None:
        found = _THREAD.zstd = zstandard.ZstdDecompressor()
    return found


def _zstd_sized_whole(fh: BinaryIO, limit: int) -> bytes | None:
    """A zstd frame that declares its size (at most ``limit``, in a file no bigger than such a
    frame can be; over 1 MiB, only at least 4 x the file), decompressed in one call: no reads
    joined, one allocation of the declared size. None for anything else (no declared size,
    damage, fewer bytes than declared, any byte after the frame), for ``Decompressor`` to read
    and name."""
    if zstandard is None:
        return None
    try:
        params = zstandard.get_frame_parameters(fh.read(18))
        size = params.content_size
        if size == zstandard.CONTENTSIZE_UNKNOWN or size > limit:
            return None
        stored = fh.seek(0, 2)
        if stored > _compress_bound(size):
            return None  # more bytes than any frame of that size holds: damaged or forged
        if size > _ONE_READ and size < 4 * stored:
            return None  # large and barely compressed: reading it whole first costs more
        fh.seek(0)
        whole = _one_shot_zstd().decompress(
            fh.read(), read_across_frames=False, allow_extra_data=False
        )
    except (zstandard.ZstdError, OSError):
        return None
    finally:
        _rewind(fh)
    return whole if len(whole) == size else None


def _compress_bound(size: int) -> int:
    """More than a zstd frame of ``size`` content bytes can take (ZSTD_compressBound is
    size + size/256 + a few hundred bytes), with room for a skippable frame or two."""
    return size + (size >> 7) + (64 << 10)


def declared_total(paths: Iterable[str]) -> int:
    """The decompressed bytes the zstd frames of the files at ``paths`` declare, in all (0 for
    a file that declares none or cannot be read): a few entries of large programs compress
    50 x, and whether a pool is worth starting for them shows only here. One small read each,
    for the few entries it is asked of."""
    total = 0
    for path in paths:
        try:
            with open_regular(path) as fh:
                head = fh.read(18)
        except OSError:
            continue
        if zstandard is None or not head.startswith(ZSTD_MAGIC):
            continue
        with contextlib.suppress(zstandard.ZstdError):
            size = zstandard.get_frame_parameters(head).content_size
            if size != zstandard.CONTENTSIZE_UNKNOWN:
                total += size
    return total


def detect_compression(head: bytes) -> str | None:
    """'zstd' or 'zlib' from the magic bytes, else None."""
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return None
