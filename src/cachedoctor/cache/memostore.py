"""What the scan memo keeps in the index file: the report, and the text of its JSON document.

The scan memo (``core/scan/memo.py``) keeps a scan's report under a digest of everything the
scan read (``inputs``); a scan that computes the same digest is served it. The report is
stored without its entries: ``scan --json`` would build every ``EntryInfo`` from its index row
and serialise it again (at 10,000 entries ~90 % of a repeated ``scan --json``). So the text of
the document's long parts (``modules``, ``entries``, ``findings``, ``files``), exactly as the
JSON renderer wrote them, is kept beside the report (table ``memo_text``) under the same
digest, each one zstd frame (the 26 MB ``entries`` array of ``cache-10k`` is 0.7 MB), and a
served ``scan --json`` writes it as it is.

Every row carries a BLAKE2b checksum of its inputs and body, checked before anything is served:
a damaged row is a miss, never part of a document. Failures to write are ignored (the memo is
only a shortcut).
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cachedoctor.cache import index_file

try:
    import zstandard
except ImportError:  # pragma: no cover - a dependency; without it nothing is kept
    zstandard = None  # type: ignore[assignment]

_LEVEL = 3  # zstd level: ~40 x on cache-10k's entries, 26 MB in ~0.1 s
# Decompressed a little at a time: pieces of 128 KiB stay in the CPU's caches and in memory the
# process already has; 1 MiB pieces made a fresh process decompress cache-10k's entries 2-3 x
# slower (~90 against ~35 ms, page faults on new memory), so much that `scan --json` took 1.2 x
# the text scan instead of ~1.05 x.
_FEED = 1 << 12  # compressed bytes read at a time (~40 x that of text, at most, on copies)
_WRITE = 1 << 17  # the most text one piece holds


@dataclass(frozen=True)
class KeptText:
    """Parts of a scan document (``entries``, ``files``...) as the renderer wrote them, each
    one zstd frame, checked when read (``read_text``); ``text`` gives one back in pieces."""

    parts: tuple[tuple[str, bytes], ...]  # name, frame

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.parts)

    def without(self, name: str) -> KeptText:
        return KeptText(tuple(p for p in self.parts if p[0] != name))

    def text(self, name: str) -> Iterator[str]:
        """The part ``name`` as the renderer wrote it, in pieces of at most ``_WRITE``."""
        return (piece.decode("ascii") for piece in self.ascii(name))

    def ascii(self, name: str) -> Iterator[bytes]:
        """``text`` as the ASCII bytes it is (a writer of bytes spares decoding them)."""
        body = dict(self.parts)[name]
        assert zstandard is not None  # nothing is kept without it
        stream = zstandard.ZstdDecompressor()
        for piece in stream.read_to_iter(body, read_size=_FEED, write_size=_WRITE):
            if piece:
                yield piece


def compressed(pieces: Iterable[str]) -> bytes | None:
    """The text of ``pieces`` as one zstd frame (with its content checksum), or None when it is
    not ASCII (the JSON renderer escapes every other character) or zstandard is missing."""
    if zstandard is None:
        return None
    stream = zstandard.ZstdCompressor(level=_LEVEL, write_checksum=True).compressobj()
    out = []
    try:
        for piece in pieces:
            out.append(stream.compress(piece.encode("ascii")))
    except UnicodeEncodeError:
        return None
    out.append(stream.flush())
    return b"".join(out)


def read_memo(
    cache: str, options: tuple[object, ...], inputs: str, *, remote: bool = False
) -> str | None:
    """The body stored by ``write_memo`` for exactly these ``inputs`` (a digest of everything
    the body was made from), or None."""
    db = index_file.open_checked(cache, options, remote=remote)
    if db is None:
        return None
    try:
        with contextlib.closing(db):
            row = db.execute("SELECT inputs, body, checksum FROM memo WHERE k = 'scan'").fetchone()
    except sqlite3.Error:
        return None
    if row is None or row[0] != inputs or not isinstance(row[1], str):
        return None
    return (
        row[1]
        if row[2] == _checksum(inputs, "scan", row[1].encode("utf-8", "surrogatepass"))
        else None
    )


def write_memo(
    cache: str, options: tuple[object, ...], inputs: str, body: str, *, remote: bool = False
) -> None:
    """Keep ``body`` for the next scan that sees the same ``inputs``, and drop text kept for
    other inputs; only into an index this scan could use (the scan writes it first), and
    failures are ignored (only a shortcut)."""
    db = index_file.open_checked(cache, options, remote=remote)
    if db is None:
        return
    with contextlib.suppress(sqlite3.Error), contextlib.closing(db), db:
        checksum = _checksum(inputs, "scan", body.encode("utf-8", "surrogatepass"))
        db.execute("INSERT OR REPLACE INTO memo VALUES ('scan', ?, ?, ?)", (inputs, body, checksum))
        db.execute("DELETE FROM memo_text WHERE inputs != ?", (inputs,))


def read_text(
    cache: str,
    options: tuple[object, ...],
    inputs: str,
    names: tuple[str, ...],
    *,
    remote: bool = False,
) -> KeptText | None:
    """The parts ``names`` stored by ``write_text`` for exactly these ``inputs``, each checked
    against its checksum; None when one is missing, of other inputs or damaged."""
    if zstandard is None:
        return None
    db = index_file.open_checked(cache, options, remote=remote)
    if db is None:
        return None
    try:
        with contextlib.closing(db):
            rows = db.execute("SELECT k, inputs, body, checksum FROM memo_text").fetchall()
    except sqlite3.Error:
        return None
    bodies = {}
    for name, stored_inputs, body, checksum in rows:
        ours = stored_inputs == inputs and isinstance(body, bytes)
        if ours and checksum == _checksum(inputs, name, body):
            bodies[name] = body
    if not set(names) <= set(bodies):
        return None
    return KeptText(tuple((name, bodies[name]) for name in names))


def write_text(
    cache: str, options: tuple[object, ...], inputs: str, kept: KeptText, *, remote: bool = False
) -> bool:
    """Keep ``kept`` beside the memo of these ``inputs``, in place of any kept before; whether
    it was (no index to write to, or a failure: not kept, nothing said)."""
    db = index_file.open_checked(cache, options, remote=remote)
    if db is None:
        return False
    rows = [(name, inputs, body, _checksum(inputs, name, body)) for name, body in kept.parts]
    try:
        with contextlib.closing(db), db:
            db.execute("DELETE FROM memo_text")
            db.executemany("INSERT INTO memo_text VALUES (?, ?, ?, ?)", rows)
    except sqlite3.Error:
        return False
    return True


def _checksum(inputs: str, name: str, body: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update((inputs + "\0" + name + "\0").encode("utf-8", "surrogatepass"))
    h.update(body)
    return h.digest()
