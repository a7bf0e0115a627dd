"""The installed jaxlib's option schema, kept on disk once read (issue 57).

Reading the schema maps jaxlib's largest library (300 MB on 0.10) and parses the descriptors
embedded in it: about 0.2 to 0.4 s, and as many file pages, on every first scan of a cache (a
CI runner's restored cache, a new index). The names depend only on that library's bytes, so
they are read once per library and kept in ``<user cache dir>/option-schema/``, one JSON file
named by the library's identity (real path, size, modification time, inode, and this format):
a reinstalled or upgraded jaxlib is another file, read afresh.

A kept file is only a shortcut: one that is unreadable, damaged or of another format is read
as missing, and a failure to write is ignored. ``CACHEDOCTOR_NO_SCHEMA_MEMO`` turns it off.

A fresh machine (a CI runner that restored its cache) has no kept file, and there the library is
cold: mapping it took 2 s. So the package also ships the tables of the jaxlib wheels it is
tested with (``schemas/``, made by ``tools/ship_schemas.py``), each named by the SHA-256 that
its wheel's ``RECORD`` gives the library. A shipped table stands for an installed library only
when the installed ``RECORD`` names that digest and the file still has the size it records.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

FORMAT = "cachedoctor-option-schema-v1"
DISABLE_ENV = "CACHEDOCTOR_NO_SCHEMA_MEMO"
KEEP_FILES = 8  # one per jaxlib a user has had; the oldest go beyond this
_MAX_RECORD = 16 << 20  # a wheel's RECORD: a line per file
_MAX_KEPT = 16 << 20  # a kept schema is 36 KB; a larger file is not one of ours
SHIPPED = Path(__file__).with_name("schemas")  # <RECORD digest>.json.zst, one per jaxlib wheel


def folder() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("cachedoctor", appauthor=False)) / "option-schema"


def identity(library: Path) -> str | None:
    """What names one library's bytes here; None when it cannot be stat'ed."""
    try:
        real = os.path.realpath(library)
        st = os.stat(real)
    except OSError:
        return None
    text = f"{FORMAT}\0{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
    return hashlib.sha256(text.encode()).hexdigest()


def load(library: Path) -> dict[str, Any] | None:
    """The document kept for ``library`` (``optionschema`` makes the schema of it, and says
    whether it reads whole); None when there is none of this format for this library."""
    if os.environ.get(DISABLE_ENV):
        return None
    name = identity(library)
    if name is None:
        return None
    try:
        data = _read_small(str(folder() / f"{name}.json"), _MAX_KEPT)
        doc = json.loads(data or b"")
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("library") != name:
        return None
    return doc


def _read_small(path: str, limit: int) -> bytes | None:
    """The bytes of the regular file at ``path`` when at most ``limit`` long (else None). A
    FIFO or device there is refused at once (``O_NONBLOCK``, then ``fstat``), never waited on
    (``storage.files.open_regular`` does the same for the cache; this layer sits beneath it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return fh.read(limit + 1) if st.st_size <= limit else None


def recorded_digest(library: Path) -> str | None:
    """The SHA-256 (``RECORD``'s URL-safe base64) that the installed wheel's ``RECORD`` gives
    ``library``; None when no ``RECORD`` names it, or the file no longer has its size."""
    try:
        size = os.stat(library).st_size
    except OSError:
        return None
    for parent in library.parents:
        dists = sorted(parent.glob("jaxlib-*.dist-info"))
        if not dists:
            continue
        name = library.relative_to(parent).as_posix()
        try:  # a FIFO or device named RECORD is refused, never waited on
            data = _read_small(str(dists[0] / "RECORD"), _MAX_RECORD)
            for row in csv.reader(io.StringIO((data or b"").decode("utf-8"), newline="")):
                if len(row) == 3 and row[0] == name and row[1].startswith("sha256="):
                    return row[1].removeprefix("sha256=") if row[2] == str(size) else None
        except (OSError, UnicodeDecodeError, csv.Error):
            return None
        return None
    return None


def shipped(library: Path) -> dict[str, Any] | None:
    """The table shipped for ``library``'s bytes (:func:`recorded_digest`), or None."""
    digest = recorded_digest(library)
    if digest is None or not digest.replace("-", "").replace("_", "").isalnum():
        return None
    import zstandard

    try:
        data = zstandard.ZstdDecompressor().decompress(
            (SHIPPED / f"{digest}.json.zst").read_bytes()
        )
        doc = json.loads(data)
    except (OSError, ValueError, zstandard.ZstdError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("record") != digest:
        return None
    return doc


def save(library: Path, doc: dict[str, Any]) -> None:
    """Keep ``doc`` for ``library`` (atomically; errors ignored: it is only a shortcut)."""
    if os.environ.get(DISABLE_ENV):
        return
    name = identity(library)
    if name is None:
        return
    with contextlib.suppress(OSError):
        where = folder()
        where.mkdir(parents=True, exist_ok=True)
        data = json.dumps(
            {"format": FORMAT, "library": name, **doc}, separators=(",", ":")
        ).encode()
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, where / f"{name}.json")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        _tidy(where)


def _tidy(where: Path) -> None:
    kept = sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in kept[KEEP_FILES:]:
        with contextlib.suppress(OSError):
            old.unlink()
