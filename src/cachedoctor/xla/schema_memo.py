"""The installed jaxlib's option schema, kept on disk once read (issue 57).

Reading the schema maps jaxlib's largest library (300 MB on 0.10) and parses the descriptors
embedded in it: about 0.2 to 0.4 s, and as many file pages, on every first scan of a cache (a
CI runner's restored cache, a new index). The names depend only on that library's bytes, so
they are read once per library and kept in ``<user cache dir>/option-schema/``, one JSON file
named by the library's identity (real path, size, modification time, inode, and this format):
a reinstalled or upgraded jaxlib is another file, read afresh.

A kept file is only a shortcut: one that is unreadable, damaged or of another format is read
as missing, and a failure to write is ignored. ``CACHEDOCTOR_NO_SCHEMA_MEMO`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from cachedoctor.xla.optionschema import FieldInfo, MessageInfo, Schema

FORMAT = "cachedoctor-option-schema-v1"
DISABLE_ENV = "CACHEDOCTOR_NO_SCHEMA_MEMO"
KEEP_FILES = 8  # one per jaxlib a user has had; the oldest go beyond this


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


def load(library: Path) -> Schema | None:
    """The schema kept for ``library``; None when there is none that reads whole."""
    if os.environ.get(DISABLE_ENV):
        return None
    name = identity(library)
    if name is None:
        return None
    try:
        doc = json.loads((folder() / f"{name}.json").read_bytes())
        return _schema_of(doc, name)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def save(library: Path, schema: Schema) -> None:
    """Keep ``schema`` for ``library`` (atomically; errors ignored: it is only a shortcut)."""
    if os.environ.get(DISABLE_ENV):
        return
    name = identity(library)
    if name is None:
        return
    with contextlib.suppress(OSError):
        where = folder()
        where.mkdir(parents=True, exist_ok=True)
        data = json.dumps(_doc_of(schema, name), separators=(",", ":")).encode()
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


def _doc_of(schema: Schema, name: str) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "library": name,
        "source": schema.source,
        "messages": {
            m.name: [
                m.map_entry,
                [[f.number, f.name, f.type, f.type_name, f.repeated] for f in m.fields.values()],
            ]
            for m in schema.messages.values()
        },
        "enums": {e: sorted(values.items()) for e, values in schema.enums.items()},
    }


def _schema_of(doc: dict[str, Any], name: str) -> Schema | None:
    if doc.get("format") != FORMAT or doc.get("library") != name:
        return None
    messages = {}
    for message, (map_entry, fields) in doc["messages"].items():
        infos = {
            int(n): FieldInfo(int(n), str(fname), int(ftype), tname, bool(rep))
            for n, fname, ftype, tname, rep in fields
        }
        messages[str(message)] = MessageInfo(str(message), infos, bool(map_entry))
    enums = {str(e): {int(v): str(n) for v, n in values} for e, values in doc["enums"].items()}
    return Schema(messages, enums, str(doc["source"]))
