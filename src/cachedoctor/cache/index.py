"""A small, self-invalidating index of decoded entries, so a repeated scan reads nothing new.

Decoding an entry means decompressing and walking all of it; an unchanged cache does not need
that twice. The index maps each entry's file name and identity ``(size, mtime_ns, inode,
ctime_ns)`` to the ``EntryInfo`` decoded last time. A file that was rewritten, touched, replaced
or renamed over has another identity (``ctime`` cannot be set back by ``touch`` or ``utime``) and
is decoded again. Entries changed in the last seconds are never stored (a write may still be in
flight within one timestamp tick), nor are entries that could not be read.

Where: ``${XDG_CACHE_HOME:-~/.cache}/cachedoctor/index/<sha256 of the cache's real path>.idx``,
never inside the JAX cache directory. A scan stays read-only on the cache: it may be shared
with other users or hosts, mounted read-only, or watched by tests and sync tools, and JAX's LRU
eviction must never see our files (it only globs ``*-cache``, but a copy or rsync of the cache
would carry a foreign index along). The least recently written index files go when the folder
outgrows ``MAX_TOTAL_BYTES``.

Safety: the file is a pickle, so it is only unpickled after its HMAC-SHA256 checks out under a
per-user random key (``index.key``, mode 0600, in the same folder), and the unpickler accepts
only cachedoctor's own result classes. An index whose key, HMAC, format, code fingerprint or
options do not match is ignored, never trusted, and rewritten after the scan. A reader change
invalidates every index: the fingerprint hashes the source of the modules that decode entries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import os
import pickle
import secrets
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from cachedoctor.cache.listdir import DirItem
from cachedoctor.cache.model import EntryInfo
from cachedoctor.storage.atomic import atomic_file

FORMAT = b"cachedoctor-index-v1\n"
KEY_FILE = "index.key"
SUFFIX = ".idx"
RACY_S = 2.0  # entries changed this recently are decoded every time (git's "racily clean")
MAX_TOTAL_BYTES = 256 << 20
DISABLE_ENV = "CACHEDOCTOR_NO_INDEX"

Identity = tuple[int, int, int, int]  # size, mtime_ns, inode, ctime_ns

_ALLOWED = {
    ("cachedoctor.cache.model", "EntryInfo"),
    ("cachedoctor.cache.model", "Problem"),
    ("cachedoctor.cache.model", "Section"),
    ("cachedoctor.xla.hlo", "HloSummary"),
    ("cachedoctor.xla.hlo", "CustomCall"),
    ("cachedoctor.xla.hlo", "VolatileField"),
}


def index_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cachedoctor" / "index"


def index_path(cache_dir: str | os.PathLike[str]) -> Path:
    real = os.path.realpath(os.fspath(cache_dir))
    return index_root() / (hashlib.sha256(os.fsencode(real)).hexdigest()[:32] + SUFFIX)


def index_locations(cache_dir: str | os.PathLike[str]) -> list[Path]:
    """Every place an index for ``cache_dir`` may live (for tools that want it gone)."""
    return [index_path(cache_dir)]


def enabled() -> bool:
    return not os.environ.get(DISABLE_ENV)


def _code_fingerprint() -> bytes:
    """Hash of every module that can shape an EntryInfo: the cache, xla and formats layers."""
    from cachedoctor import __version__

    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(__version__.encode())
    for layer in ("cache", "xla", "formats"):
        for path in sorted((package / layer).glob("*.py")):
            try:
                h.update(path.name.encode() + b"\0" + path.read_bytes())
            except OSError:
                h.update(os.urandom(16))  # cannot tell: never match
    h.update((package / "layout.py").read_bytes())
    return h.digest()


_FINGERPRINT: bytes | None = None


def code_fingerprint() -> bytes:
    global _FINGERPRINT
    if _FINGERPRINT is None:
        _FINGERPRINT = _code_fingerprint()
    return _FINGERPRINT


def _load_key(create: bool) -> bytes | None:
    """The per-user HMAC key; None when it is missing (and not created) or not private."""
    root = index_root()
    path = root / KEY_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        if not create:
            return None
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return _load_key(create=False)  # a concurrent scan made it first
        except OSError:
            return None
        key = secrets.token_bytes(32)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
        return key
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_uid != os.getuid() or st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            return None  # someone else could read or write it: forging would be possible
        key = fh.read(64)
    return key if len(key) == 32 else None


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in an index")
        return super().find_class(module, name)


class _HashingReader:
    """The index file as the unpickler reads it, with a MAC of every byte read."""

    def __init__(self, fh: BinaryIO, mac: hmac.HMAC) -> None:
        self._fh = fh
        self.mac = mac

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self.mac.update(data)
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        n = self._fh.readinto(buf)  # type: ignore[attr-defined]
        self.mac.update(memoryview(buf)[:n])
        return int(n)

    def readline(self) -> bytes:
        data = self._fh.readline()
        self.mac.update(data)
        return data


class _HashingWriter:
    """The index file as the pickler writes it, with a MAC of every byte written."""

    def __init__(self, fh: BinaryIO, mac: hmac.HMAC) -> None:
        self._fh = fh
        self.mac = mac

    def write(self, data: bytes) -> int:
        self.mac.update(data)
        return self._fh.write(data)


@dataclass
class ScanIndex:
    """The index of one cache directory, loaded (or empty), updated by the scan, then saved."""

    cache_dir: str
    options: tuple[object, ...]
    entries: dict[str, tuple[Identity, EntryInfo]]
    path: Path
    dirty: bool = False
    hits: int = 0
    loaded: bool = False

    def get(self, item: DirItem) -> EntryInfo | None:
        """The stored result for this exact file, or None (changed, new or never stored)."""
        found = self.entries.get(item.name)
        if found is None or found[0] != identity(item):
            return None
        info = found[1]
        expected = os.path.join(self.cache_dir, item.name)
        if info.path != expected:  # the same cache reached by another spelling of its path
            info = replace(info, path=expected)
        self.hits += 1
        return info

    def update(self, items: Iterable[DirItem], decoded: dict[str, EntryInfo], now: float) -> None:
        """Keep exactly the current, storable entries: drop vanished names, add decoded ones."""
        current = {i.name: i for i in items}
        for name in list(self.entries):
            if name not in current:
                del self.entries[name]
                self.dirty = True
        racy_ns = int((now - RACY_S) * 1e9)
        for name, info in decoded.items():
            item = current.get(name)
            if item is None:
                continue
            if max(item.mtime_ns, item.ctime_ns) >= racy_ns or not _storable(info):
                if self.entries.pop(name, None) is not None:
                    self.dirty = True
                continue
            self.entries[name] = (identity(item), info)
            self.dirty = True

    def save(self) -> None:
        """Write the index atomically; failures are ignored (the index is only a shortcut)."""
        if not self.dirty:
            return
        with contextlib.suppress(OSError, pickle.PicklingError, RecursionError):
            _write(self)


def identity(item: DirItem) -> Identity:
    return (item.size, item.mtime_ns, item.ino, item.ctime_ns)


def _storable(info: EntryInfo) -> bool:
    return not any(p.kind in ("unreadable", "symlink") for p in info.problems)


def load(cache_dir: str, options: tuple[object, ...] = ()) -> ScanIndex:
    """The index for ``cache_dir``, or an empty one when there is none we can trust."""
    path = index_path(cache_dir)
    empty = ScanIndex(cache_dir, options, {}, path)
    if not enabled():
        return empty
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return empty
    key = _load_key(create=False)
    if key is None:
        return empty
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
            return empty
        if fh.read(len(FORMAT)) != FORMAT:
            return empty
        mac = fh.read(32)
        start = fh.tell()
        # Authenticate first, streaming (the file may be tens of MB: never held whole) ...
        check = hmac.new(key, digestmod=hashlib.sha256)
        while chunk := fh.read(1 << 20):
            check.update(chunk)
        if not hmac.compare_digest(mac, check.digest()):
            return empty
        # ... then parse, hashing again what is parsed: a file changed in between is refused.
        fh.seek(start)
        reader = _HashingReader(fh, hmac.new(key, digestmod=hashlib.sha256))
        try:
            header, rows = _Unpickler(reader).load()
            if reader.read(1) or not hmac.compare_digest(mac, reader.mac.digest()):
                return empty
            if header != _header(cache_dir, options):
                return empty
            entries = {name: (ident, _unpack(values)) for name, ident, values in rows}
        except Exception:  # authenticated yet unreadable: cannot happen; be safe anyway
            return empty
    return ScanIndex(cache_dir, options, entries, path, loaded=True)


def _header(cache_dir: str, options: tuple[object, ...]) -> tuple[object, ...]:
    return (code_fingerprint(), _FIELDS, os.path.realpath(cache_dir), options)


def _write(index: ScanIndex) -> None:
    key = _load_key(create=True)
    if key is None:
        return
    root = index.path.parent
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    with atomic_file(index.path, temp_prefix=".tmp-") as fh:
        fh.write(FORMAT)
        fh.write(bytes(32))  # the MAC goes here once the body is written
        writer = _HashingWriter(fh, hmac.new(key, digestmod=hashlib.sha256))
        pickle.dump(  # streamed: the pickle is never held whole in memory
            (_header(index.cache_dir, index.options), _packed(index.entries)),
            writer,
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        fh.seek(len(FORMAT))
        fh.write(writer.mac.digest())
    index.dirty = False
    _tidy(root, keep=index.path)


_FIELDS = tuple(f.name for f in dataclasses.fields(EntryInfo))
_SHARED = frozenset({"hlo", "sections", "volatile", "problems"})
_SLOTS = tuple(getattr(EntryInfo, name, None) for name in _FIELDS)
_FAST = all(type(s).__name__ == "member_descriptor" for s in _SLOTS)  # slotted EntryInfo
_SETTERS = tuple(s.__set__ for s in _SLOTS) if _FAST else ()  # type: ignore[union-attr]


def _packed(entries: dict[str, tuple[Identity, EntryInfo]]) -> list[tuple[str, Identity, tuple]]:  # type: ignore[type-arg]
    """Entries as plain rows of field values, with equal summaries shared (duplicates are
    common): a smaller pickle that loads without a ``__setstate__`` call per entry."""
    by_id: dict[int, object] = {}
    by_value: dict[object, object] = {}
    rows = []
    for name, (ident, info) in entries.items():
        values = []
        for attr in _FIELDS:
            value = getattr(info, attr)
            if attr in _SHARED:
                shared = by_id.get(id(value))
                if shared is None:
                    try:
                        shared = by_value.setdefault(value, value)
                    except TypeError:
                        shared = value
                    by_id[id(value)] = shared
                value = shared
            values.append(value)
        rows.append((name, ident, tuple(values)))
    return rows


def _unpack(values: tuple) -> EntryInfo:  # type: ignore[type-arg]
    if len(values) != len(_FIELDS):
        raise ValueError("index row of another shape")
    if not _FAST:
        return EntryInfo(*values)
    info = object.__new__(EntryInfo)  # frozen: fill the slots directly, ~3x faster than init
    for setter, value in zip(_SETTERS, values):  # noqa: B905 (lengths checked above)
        setter(info, value)
    return info


def _tidy(root: Path, keep: Path) -> None:
    """Remove leftovers and keep the folder under MAX_TOTAL_BYTES (oldest indexes go first)."""
    now = time.time()
    files = []
    with contextlib.suppress(OSError), os.scandir(root) as it:
        for de in it:
            with contextlib.suppress(OSError):
                st = de.stat(follow_symlinks=False)
                if de.name.startswith(".tmp-") and now - st.st_mtime > 3600:
                    os.unlink(de.path)
                elif de.name.endswith(SUFFIX) and de.path != str(keep):
                    files.append((st.st_mtime, st.st_size, de.path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= MAX_TOTAL_BYTES:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
        total -= size
