"""The scan index's file: where it lives, what it says of itself, how it is opened.

Kept apart from ``index.py`` (which rows a scan trusts, serving and saving them): this is the
file that the scan index, the scan memo (``memostore.py``) and the stats records' index
(``record_index.py``) share, and the two others use nothing else of the scan index.

Where (``index_path``): inside a local cache that is this user's and writable, in
``<cache>/cachedoctor-index/index.sqlite``, so that the index travels with the cache (CI caches,
copies; ``travel.py`` says when a scan writes there and what never sees the folder); else, and
for buckets, in ``<user cache dir>/index/<sha256 of the cache's real path or URL>.sqlite``, the
user cache dir being the one ``platformdirs`` names (``${XDG_CACHE_HOME:-~/.cache}/cachedoctor``
on Linux). The least recently written index files there go when the folder outgrows
``MAX_TOTAL_BYTES`` (``tidy``). ``CACHEDOCTOR_NO_INDEX`` turns every index off (``enabled``).

Two scans at once: sqlite's rollback journal and ``BUSY_TIMEOUT_S``, then a scan goes without
(the index is only a shortcut). No WAL: its shared-memory file needs a local file system, and a
JAX cache is often on NFS.

What it says of itself (``header``, in its ``meta`` table): this format, the code that wrote it
(the fingerprint hashes every module that shapes a decoded entry), the options and the cache it
describes. An index written by other code, for other options or another cache, or owned by
someone else, is never opened (``open_checked``, ``open_own``): the scan ignores and rewrites
it. The same file holds the scan memo's tables (``memo``, ``memo_text``: ``SCHEMA``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from cachedoctor import layout
from cachedoctor.cache import travel
from cachedoctor.cache.index_rows import FIELDS

FORMAT = "cachedoctor-index-v8"  # 8: typed own values, parts stored once by id
SUFFIX = ".sqlite"
MAX_TOTAL_BYTES = 256 << 20
DISABLE_ENV = "CACHEDOCTOR_NO_INDEX"
BUSY_TIMEOUT_S = 2.0  # another scan writing the same index: wait this long, then go without

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hlo (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS parts (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
  name BLOB PRIMARY KEY, identity TEXT NOT NULL, digest TEXT, compile_time,
  compression TEXT, parts TEXT NOT NULL, hlo TEXT, checksum TEXT
);
CREATE TABLE IF NOT EXISTS memo (
  k TEXT PRIMARY KEY, inputs TEXT NOT NULL, body TEXT NOT NULL, checksum BLOB
);
CREATE TABLE IF NOT EXISTS memo_text (
  k TEXT PRIMARY KEY, inputs TEXT NOT NULL, body BLOB NOT NULL, checksum BLOB
);
"""


def index_root() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("cachedoctor", appauthor=False)) / "index"


def cache_id(cache: str | os.PathLike[str], *, remote: bool = False) -> str:
    """What names a cache for its index: the real path of a directory, or a bucket's URL
    (``remote``: the caller knows which; nothing here parses the spelling)."""
    text = os.fspath(cache)
    return text.rstrip("/") if remote else os.path.realpath(text)


def fallback_path(cache: str | os.PathLike[str], *, remote: bool = False) -> Path:
    """The index of ``cache`` in the user cache dir (buckets, read-only and others' caches)."""
    digest = hashlib.sha256(os.fsencode(cache_id(cache, remote=remote))).hexdigest()[:32]
    return index_root() / (digest + SUFFIX)


def _travels(cache: str | os.PathLike[str], remote: bool) -> bool:
    return not remote and travel.usable(os.fspath(cache))


def index_path(
    cache: str | os.PathLike[str], *, entries: bool = False, remote: bool = False
) -> Path:
    """Where the index of ``cache`` is read and written now: inside the cache when it may
    travel with it (``travel.usable``) and either holds one already or the scan found
    ``entries`` (a folder without entries gets nothing written into it), else in the user
    cache dir."""
    if _travels(cache, remote):
        path = travel.index_file(os.fspath(cache))
        if entries or os.path.lexists(path):
            return path
    return fallback_path(cache, remote=remote)


def side_path(cache: str | os.PathLike[str], part: str, *, remote: bool = False) -> Path:
    """Where a table kept beside the scan index lives (the stats records' index,
    ``cache/record_index.py``): its own file next to the user-cache-dir index, of the same
    digest, so that a scan rewriting its file whole (other options, other code) never drops it.
    It stays in the user cache dir: only the scan index travels with the cache."""
    path = fallback_path(cache, remote=remote)
    return path.with_name(f"{path.stem}.{part}{SUFFIX}")


SIDE_PARTS = ("records",)  # the side files there are (see side_path)


def index_locations(cache: str | os.PathLike[str], *, remote: bool = False) -> list[Path]:
    """Every place an index for ``cache`` may live (for tools that want it gone)."""
    sides = (side_path(cache, part, remote=remote) for part in SIDE_PARTS)
    paths = [fallback_path(cache, remote=remote), *sides]
    if not remote:
        paths.insert(0, travel.index_file(os.fspath(cache)))
    return [p for path in paths for p in (path, path.with_name(path.name + "-journal"))]


def enabled() -> bool:
    return not os.environ.get(DISABLE_ENV)


def _sources_digest(select: Callable[[Path], Iterable[Path]]) -> bytes:
    """SHA-256 of the version and of the package's modules that ``select`` names (given the
    package folder), each with its path in the package; an unreadable one never matches."""
    from cachedoctor._version import __version__

    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(__version__.encode())
    for path in sorted(select(package)):
        try:
            h.update(os.fsencode(path.relative_to(package)) + b"\0" + path.read_bytes())
        except OSError:
            h.update(os.urandom(16))
    return h.digest()


def _code_fingerprint() -> bytes:
    """Every module that can shape an EntryInfo: the cache, xla and formats layers, layout."""
    return _sources_digest(
        lambda package: [
            *(p for layer in ("cache", "xla", "formats") for p in (package / layer).glob("*.py")),
            package / "layout.py",
        ]
    )


def _package_fingerprint() -> bytes:
    """Every module of the package: a whole report depends on all of them."""
    return _sources_digest(lambda package: package.rglob("*.py"))


_FINGERPRINT: bytes | None = None
_PACKAGE_FINGERPRINT: bytes | None = None


def package_fingerprint() -> bytes:
    global _PACKAGE_FINGERPRINT
    if _PACKAGE_FINGERPRINT is None:
        _PACKAGE_FINGERPRINT = _package_fingerprint()
    return _PACKAGE_FINGERPRINT


def code_fingerprint() -> bytes:
    global _FINGERPRINT
    if _FINGERPRINT is None:
        _FINGERPRINT = _code_fingerprint()
    return _FINGERPRINT


def open_checked(
    cache: str, options: tuple[object, ...], path: Path | None = None, *, remote: bool = False
) -> sqlite3.Connection | None:
    """The index file of ``cache`` (a bucket URL when ``remote``), open, when it is ours, of
    this code and these options."""
    if not enabled():
        return None
    path = index_path(cache, remote=remote) if path is None else path
    return open_own(path, header_of(cache, options, path, remote))


def open_own(path: Path, header: dict[str, str]) -> sqlite3.Connection | None:
    """The sqlite file at ``path``, open, when it is this user's regular file (never a link or
    another user's) and its ``meta`` table holds ``header``; else None. The scan index and the
    records index (``record_index.py``) both open theirs so."""
    try:
        st = os.lstat(path)
        if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
            return None  # another user's file (or a link to one): never read it
        db = connect(path)
    except (OSError, sqlite3.Error):
        return None
    try:
        meta = dict(db.execute("SELECT k, v FROM meta"))
        if all(meta.get(k) == v for k, v in header.items()):
            return db
    except (sqlite3.Error, TypeError, ValueError):  # damaged, truncated or not ours
        pass
    db.close()
    return None


def connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)
    db.execute("PRAGMA synchronous = OFF")  # a lost index is only a slower next scan
    return db


def header_of(
    cache: str, options: tuple[object, ...], path: Path, remote: bool = False
) -> dict[str, str]:
    """What an index must say of itself to be used: this format, code and options, and the
    cache it describes (one that travels describes the folder it is in, wherever that is)."""
    travelling = path.parent.name == layout.INDEX_DIRNAME and path.name == layout.INDEX_FILENAME
    return {
        "format": FORMAT,
        "code": code_fingerprint().hex(),
        "fields": ",".join(FIELDS),
        "cache": "" if travelling else cache_id(cache, remote=remote),
        "options": json.dumps(list(options)),
        "digest": travel.DIGEST_NAME,
    }


def tidy(root: Path, keep: Path) -> None:
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
