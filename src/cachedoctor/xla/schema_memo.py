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
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

FORMAT = "cachedoctor-option-schema-v1"
DISABLE_ENV = "CACHEDOCTOR_NO_SCHEMA_MEMO"
KEEP_FILES = 8  # one per jaxlib a user has had; the oldest go beyond this
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
        doc = json.loads((folder() / f"{name}.json").read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("library") != name:
        return None
    return doc


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
        try:
            with open(dists[0] / "RECORD", newline="", encoding="utf-8") as fh:
                for row in csv.reader(fh):
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
