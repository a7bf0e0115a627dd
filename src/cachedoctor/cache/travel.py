"""The scan index that travels with the cache: where it lives, and what identifies an entry's bytes.

A CI runner restores the JAX cache (``actions/cache``, a tarball, ``cp -r``) at a new path, with
new inodes, mtimes and ctimes, and an empty user cache dir: an index kept in the user cache dir,
its rows known by each file's ``(size, mtime_ns, inode, ctime_ns)``, is never found there, nor
would one of its rows be trusted. So the index of a local cache is kept inside it, in
``<cache>/cachedoctor-index/index.sqlite`` (``layout.INDEX_DIRNAME``), beside the key
manifests and stats records, and each row also carries a content digest of the entry file's
bytes (XXH3-128 of the compressed file, ``digest``): a row whose file has another identity is
served only when the file's bytes hash to the row's digest, read once by the scan.

When a scan writes into the cache (``usable``): the cache directory is ours (owned by this
user) and writable, and the folder is absent or a directory of ours (never a link), and the
scan found at least one entry (a folder named by mistake, an empty cache: nothing written).
``CACHEDOCTOR_INDEX_IN_CACHE=0`` and a read-only run (``CACHEDOCTOR_READ_ONLY``) keep the index in
the user cache dir, where a read-only cache,
another user's cache and a bucket (``gs://``, ``s3://``: objects are known by generation or ETag,
a restore changes nothing there) keep theirs. ``CACHEDOCTOR_NO_INDEX=1`` turns indexing off.

What sees the folder:

- JAX's LRU eviction does not: it globs ``*-cache`` in the cache directory, not below it
  (``jax/_src/lru_cache.py``, ``LRUCache._evict_if_needed``, line 178 in jax 0.10.2:
  ``for cache_path in self.path.glob(f"*{_CACHE_SUFFIX}")``; the same in 0.4.38), and the
  folder's name does not end in ``-cache`` (a name that did would be stat'ed as an entry and
  its ``-atime`` read: JAX's write then fails, tests/cache/test_travel.py saw it).
- cachedoctor's own listing does not (``listdir.read_dir``): a scan with the index reports what a
  scan without it does, ``prune`` never names the folder (it is not in the listing, so neither
  foreign nor counted in ``--max-size``), and the scan memo does not see the index's own writes.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import zlib
from pathlib import Path

from cachedoctor import layout
from cachedoctor.cache import decompress, reader
from cachedoctor.cache.model import EntryInfo
from cachedoctor.storage.files import read_regular

IN_CACHE_ENV = "CACHEDOCTOR_INDEX_IN_CACHE"  # "0": keep the index in the user cache dir
WHOLE_READ_MAX = 64 << 20  # entry files up to this size are read whole, then hashed and decoded
_CHUNK = 1 << 20


# the one fast content digest (cache/decompress.py): XXH3-128, BLAKE2b-128 without xxhash; an
# index says which its rows hold
new_hasher = decompress.fast_hasher
DIGEST_NAME = decompress.FAST_DIGEST_NAME


# Read-only use (the Action's ``read-only: true``) writes nothing into the cache, the index
# included: it goes to the user cache dir. The variable is read as ``stablekeys.settings.
# read_only`` reads it: anything but a false value (a typo too) means read-only.
READ_ONLY_ENV = "CACHEDOCTOR_READ_ONLY"
_FALSE = ("0", "false", "no", "off", "")


def in_cache_enabled() -> bool:
    """Whether the index may live inside the cache: not turned off, not a read-only run."""
    read_only = os.environ.get(READ_ONLY_ENV)
    if read_only is not None and read_only.strip().lower() not in _FALSE:
        return False
    return os.environ.get(IN_CACHE_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def index_file(cache_root: str) -> Path:
    """Where the index of ``cache_root`` is kept when it travels with the cache."""
    return Path(os.path.realpath(cache_root)) / layout.INDEX_DIRNAME / layout.INDEX_FILENAME


def usable(cache_root: str) -> bool:
    """Whether the index may be read from and written into ``cache_root`` itself: the
    directory is this user's and writable, the folder absent or a directory of this user's."""
    if not in_cache_enabled():
        return False
    root = os.path.realpath(cache_root)
    me = os.getuid()
    try:
        st = os.stat(root)
        if st.st_uid != me or not stat.S_ISDIR(st.st_mode):
            return False
        if not os.access(root, os.W_OK | os.X_OK):
            return False
        folder = os.lstat(os.path.join(root, layout.INDEX_DIRNAME))
    except FileNotFoundError:
        return True  # no folder yet: the first save creates it
    except OSError:
        return False
    return stat.S_ISDIR(folder.st_mode) and folder.st_uid == me


def place(cache_root: str) -> str:
    """What a file's ``(size, mtime_ns, inode, ctime_ns)`` identity is only valid within: the
    cache directory's real path, device and inode. A restored copy has another place, so its
    rows are served only by their digests (a fresh file system may hand out the same inode
    numbers again)."""
    root = os.path.realpath(cache_root)
    try:
        st = os.stat(root)
    except OSError:
        return ""
    return f"{root}\0{st.st_dev}\0{st.st_ino}"


def file_digest(path: str, size: int) -> str | None:
    """The digest of the bytes of the entry file at ``path`` (links not followed, nothing but a
    regular file read), or None when it cannot be read or is no longer ``size`` bytes long (a
    write in progress)."""
    seen = _hash_file(path)
    return seen[4] if seen is not None and seen[0] == size else None


# one file read at a time into one buffer per process: no allocation per entry (cf. R's floor)
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_NOATIME = getattr(os, "O_NOATIME", 0)  # a scan leaves access times (usage evidence) as they are
_BUFFER: list[memoryview] = []


def _buffer(size: int) -> memoryview:
    """This process's read buffer: room for a whole entry of ``size`` bytes and one more (the
    end of the file seen in one read), up to ``_CHUNK``."""
    want = min(size + 1, _CHUNK)
    if not _BUFFER or len(_BUFFER[0]) < want:
        _BUFFER[:] = [memoryview(bytearray(max(want, 64 << 10)))]
    return _BUFFER[0]


# what a worker that hashed a file saw of it: size, mtime_ns, inode, ctime_ns, and the digest
Hashed = tuple[int, int, int, int, str]


def hash_entries_of_dir(root: str, part: int = 0, parts: int = 1) -> dict[str, Hashed]:
    """The digests of the entry files in ``root`` (every ``parts``-th name, from ``part``),
    each with the identity its file had while it was read (``fstat`` before and after, the
    same: else left out), for a restored copy's scan to start before it has listed the
    directory (``parallel.start_hashing_dir``). The scan serves a row by such a digest only
    when its own ``lstat`` of the file shows the same identity; a file changed since is
    hashed again, after that ``lstat``, as any other."""
    from cachedoctor.cache.listdir import FileKind, classify

    found: dict[str, Hashed] = {}
    try:
        names = os.listdir(root)
    except OSError:
        return found
    for name in names:
        if zlib.crc32(os.fsencode(name)) % parts != part:
            continue
        if classify(name, is_dir=False)[0] is not FileKind.ENTRY:
            continue
        seen = _hash_file(os.path.join(root, name))
        if seen is not None:
            found[name] = seen
    return found


def _hash_file(path: str) -> Hashed | None:
    """What a read of the regular file at ``path`` saw (links not followed), or None when it
    cannot be read or was written to while it was read."""
    try:
        fd = os.open(path, _OPEN_FLAGS | _NOATIME)
    except PermissionError:  # O_NOATIME: only for the file's owner
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            return None
    except OSError:
        return None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return None
        h = new_hasher()
        buf = _buffer(before.st_size)
        total = 0
        while n := os.readv(fd, [buf]):
            h.update(buf[:n])
            total += n
        after = os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    seen = (before.st_size, before.st_mtime_ns, before.st_ino, before.st_ctime_ns)
    if total != before.st_size or seen != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ino,
        after.st_ctime_ns,
    ):
        return None  # written to while it was read
    return (*seen, h.hexdigest())


def decode_digested(
    path: str,
    key: str | None,
    max_decompressed: int,
    defer_hlo: bool = False,
    *,
    hash_big: bool = True,
) -> tuple[EntryInfo, str | None]:
    """``reader.decode_entry`` of a local file, and the digest of the bytes it decoded, from one
    read: the file is read whole (up to ``WHOLE_READ_MAX``), hashed, and decoded from memory
    (the reader serves a file equal to one it decoded already without decoding it again). A
    bigger file is decoded from disk, then hashed in a second pass unless not ``hash_big``;
    a file that cannot be opened or read is decoded from its path (the reader names the
    problem), without digest."""
    try:
        data, st = read_regular(path, WHOLE_READ_MAX)
    except OSError:
        data, st = None, None
    if data is None or st is None or len(data) != st.st_size:
        info = reader.decode_entry(
            path, key=key, max_decompressed=max_decompressed, defer_hlo=defer_hlo
        )
        assert isinstance(info, EntryInfo)
        if st is None or info.problems or not hash_big:
            return info, None
        return info, file_digest(path, info.size) if info.size == st.st_size else None
    h = new_hasher()
    h.update(data)
    digest = h.hexdigest()
    copy = reader.copy_of_file(
        f"{DIGEST_NAME}:{digest}", path, key, st.st_size, st.st_mtime_ns, max_decompressed
    )
    if copy is not None:
        return copy, digest
    with contextlib.closing(io.BytesIO(data)) as fileobj:
        info = reader.decode_entry(
            path,
            key=key,
            max_decompressed=max_decompressed,
            defer_hlo=defer_hlo,
            fileobj=fileobj,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            file_digest=f"{DIGEST_NAME}:{digest}",
        )
    assert isinstance(info, EntryInfo)
    return info, digest
