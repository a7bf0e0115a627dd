"""The bundle's file: what ``pack`` writes and ``unpack`` reads, and the checks every member
passes before anything is staged (core/bundle.py is what the two commands do with it).

A bundle is an uncompressed tar whose first member is a JSON header (:data:`HEADER`) naming
every other member with its size and SHA-256: ``entries/<key>-cache``, key manifests and stats
records. Kept apart from ``bundle.py`` because it is the format alone: a tar written whole
(:func:`write_tar`), one read checked member by member (:func:`opened`, :func:`stage`), the
chunked copy both sides hash through (:func:`copy_hashed`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from cachedoctor import layout
from cachedoctor.errors import CachedoctorError

FORMAT = "cachedoctor-bundle/1"
HEADER = "cachedoctor-bundle.json"
MAX_HEADER = 64 << 20  # a header larger than this is no bundle's
ENTRY_PREFIX = "entries/"
CHUNK = 1 << 20  # what pack and unpack hold of a member at a time
_SHA256 = re.compile(r"[0-9a-f]{64}")
KEY = re.compile(r"[A-Za-z0-9_.\-]{1,200}-[0-9a-f]{64}")
COMPANION = re.compile(
    # a file name in one of the two folders: never "." or "..", never hidden
    rf"({re.escape(layout.MANIFEST_DIRNAME)}|{re.escape(layout.STATS_DIRNAME)})"
    r"/[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}"
)


class BundleError(CachedoctorError):
    slug = "bundle"


class ReadError(Exception):
    """A source that could not be read while it was copied (not the copy's destination)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def copy_hashed(src: IO[bytes], dst: IO[bytes]) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` a chunk at a time: (bytes copied, their SHA-256). A failed read
    raises :class:`ReadError`; a failed write, its own OSError."""
    digest, size = hashlib.sha256(), 0
    while True:
        try:
            chunk = src.read(CHUNK)
        except OSError as exc:
            raise ReadError(exc) from None
        if not chunk:
            return size, digest.hexdigest()
        digest.update(chunk)
        dst.write(chunk)
        size += len(chunk)


def refuse_inside(root: str | None, bundle: Path) -> None:
    """A bundle written inside the cache it packs (at ``root``, None for a bucket) would be a
    foreign file there (and its spool, a temp file JAX's writers never clean): refused."""
    if root is None:
        return
    cache = os.path.realpath(root)
    parent = os.path.realpath(bundle.parent)
    if parent == cache or parent.startswith(cache.rstrip(os.sep) + os.sep):
        raise BundleError(f"{bundle} is inside the cache it packs ({root}): write it elsewhere")


@contextmanager
def spool(bundle: Path) -> Iterator[IO[bytes]]:
    """A nameless temp file beside ``bundle`` (``O_TMPFILE`` where the system has it: nothing
    is left behind even when the process is killed), holding the members until the header is
    known."""
    try:
        bundle.parent.mkdir(parents=True, exist_ok=True)
        spooled = tempfile.TemporaryFile(dir=bundle.parent)  # noqa: SIM115 (closed below)
    except OSError as exc:  # named by the bundle, not by its folder
        raise OSError(exc.errno, exc.strerror, str(bundle)) from None
    with spooled:
        yield spooled


def spool_one(store: Any, name: str, spooled: IO[bytes]) -> tuple[int, str] | OSError:
    """``name`` copied to the end of ``spooled``: (size, SHA-256), or the OSError that kept it
    from being read, with nothing of it left in the spool. The spool's own errors are raised."""
    start = spooled.tell()
    try:  # a link or a special file named like a cache file is never followed or read
        source = store.open_read(name)
    except OSError as exc:
        return exc
    with source:
        try:
            return copy_hashed(source, spooled)
        except ReadError as exc:
            spooled.seek(start)
            spooled.truncate()
            return exc.error


def write_tar(bundle: Path, members: list[tuple[str, int, IO[bytes]]]) -> None:
    """The tar of ``members`` (name, size, the file to read that many bytes from, in order)
    at ``bundle``: written to a temp file beside it (its folder made by :func:`spool`), synced,
    renamed into place."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{bundle.name}.", dir=bundle.parent)
    except OSError as exc:  # named by the bundle, not by its temp file
        raise OSError(exc.errno, exc.strerror, str(bundle)) from None
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name, size, source in members:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = size, 0o644, int(time.time())
                tar.addfile(info, source)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, bundle)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # named by the bundle, not by its temp file
            raise OSError(exc.errno, exc.strerror, str(bundle)) from None
        raise


@contextmanager
def opened(bundle: Path) -> Iterator[tuple[dict[str, Any], tarfile.TarFile]]:
    """The bundle's header, checked, and its tar; BundleError for anything else (a FIFO, a
    device or a folder is refused before it is opened: opening a FIFO with no writer waits)."""
    try:
        if not stat.S_ISREG(os.stat(bundle).st_mode):
            raise BundleError(f"{bundle} is not a regular file, so not a bundle")
    except OSError:
        pass  # tarfile says what is wrong with it, below
    try:
        tar = tarfile.open(bundle, mode="r:")  # noqa: SIM115 (the with below closes it)
    except (tarfile.TarError, EOFError) as exc:
        raise BundleError(f"{bundle} is not a cachedoctor bundle ({exc})") from None
    with tar:
        first = tar.next()
        if first is None or first.name != HEADER or not first.isfile() or first.size > MAX_HEADER:
            raise BundleError(f"{bundle} is not a cachedoctor bundle (no {HEADER} first)")
        try:
            text = read_member(tar, first)
        except (tarfile.TarError, EOFError) as exc:  # the header member itself cut short
            raise BundleError(f"{bundle}: its header is truncated or damaged ({exc})") from None
        try:  # NaN and Infinity are no JSON (a report echoing them would be none either)
            header = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than a header is
            raise BundleError(f"{bundle}: its header is not a bundle's JSON") from None
        if not isinstance(header, dict):
            raise BundleError(
                f"{bundle}: its header is a JSON {type(header).__name__}, not an object"
            )
        if header.get("format") != FORMAT:
            raise BundleError(f"{bundle}: format {str(header.get('format'))[:80]!r}, not {FORMAT}")
        check_header(header)
        yield header, tar


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


MAX_MEMBER = 1 << 40  # a member larger than this is no entry's


def check_header(header: dict[str, Any]) -> None:
    """The whole header checked before anything is staged or written: every entry and file a
    JSON object with a name of a cache's own, named once, a size in range and a SHA-256; the
    fields a report shows (source, packed_by) text; BundleError names the first that is not."""
    for part in ("entries", "files"):
        if not isinstance(header.get(part), list):
            raise BundleError(f"the bundle's header has no list of {part}")
    _check_shown(header)
    for e in header["entries"]:
        if not isinstance(e, dict) or not isinstance(e.get("key"), str):
            raise BundleError(f"the bundle's header names an entry that is not one: {str(e)[:80]}")
        if not KEY.fullmatch(e["key"]):
            raise BundleError(f"bundle names an entry {e['key'][:80]!r}: not a JAX key")
        _check_member(e, e["key"])
        if e.get("module") is not None and not isinstance(e["module"], str):
            raise BundleError(f"the bundle's header: entry {e['key'][:80]}'s module is not a name")
    for f in header["files"]:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise BundleError(f"the bundle's header names a file that is not one: {str(f)[:80]}")
        if not COMPANION.fullmatch(f["name"]):
            raise BundleError(f"bundle names a file {f['name'][:80]!r} outside a cache's own")
        _check_member(f, f["name"])
    _check_once([e["key"] for e in header["entries"]] + [f["name"] for f in header["files"]])


def _check_shown(header: dict[str, Any]) -> None:
    """What the report echoes of the header is text (or absent): ``source``, and ``packed_by``
    an object of versions."""
    if header.get("source") is not None and not isinstance(header["source"], str):
        raise BundleError("the bundle's header: its source is not a path or URL")
    packed = header.get("packed_by")
    if packed is None:
        return
    if not isinstance(packed, dict) or not all(
        v is None or isinstance(v, str) for v in packed.values()
    ):
        raise BundleError("the bundle's header: packed_by is not an object of versions")


def _check_once(names: list[str]) -> None:
    """No entry or file named twice: one member each, one line each in the report."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise BundleError(f"the bundle's header names {name[:80]} twice")
        seen.add(name)


def _check_member(member: dict[str, Any], name: str) -> None:
    size, digest = member.get("size"), member.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_MEMBER:
        raise BundleError(
            f"the bundle's header: {name[:80]}'s size {str(size)[:40]} is out of range"
        )
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise BundleError(f"the bundle's header: {name[:80]}'s sha256 is not one")


def open_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    f = tar.extractfile(member)
    if f is None:
        raise BundleError(f"bundle member {member.name} is not a file")
    return f


def read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    return open_member(tar, member).read()


def expected(header: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Member name -> (size, sha256) for every member the header names; a name that is not a
    cache's own (an entry, a manifest, a record) is refused."""
    out: dict[str, tuple[int, str]] = {}
    try:
        for e in header["entries"]:
            if not KEY.fullmatch(str(e["key"])):
                raise BundleError(f"bundle names an entry {str(e['key'])[:80]!r}: not a JAX key")
            out[f"{ENTRY_PREFIX}{e['key']}-cache"] = (int(e["size"]), str(e["sha256"]))
        for f in header["files"]:
            if not COMPANION.fullmatch(str(f["name"])):
                raise BundleError(
                    f"bundle names a file {str(f['name'])[:80]!r} outside a cache's own"
                )
            out[str(f["name"])] = (int(f["size"]), str(f["sha256"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"the bundle's header is incomplete ({exc})") from None
    return out


def stage(tar: tarfile.TarFile, header: dict[str, Any], folder: Path) -> None:
    """Every member the header names, checked, into ``folder`` laid out as a cache."""
    try:
        stage_members(tar, header, folder)
    except (tarfile.TarError, EOFError) as exc:
        raise BundleError(f"the bundle is truncated or damaged ({exc})") from None


def stage_members(tar: tarfile.TarFile, header: dict[str, Any], stage: Path) -> None:
    named = expected(header)
    seen = set()
    for member in tar:
        want = named.get(member.name)
        if want is None or member.name in seen:
            continue  # not named by the header (or named twice): never read
        if not member.isfile() or member.issparse() or member.size != want[0]:
            raise BundleError(f"bundle member {member.name}: not the file its header describes")
        source = open_member(tar, member)
        name = member.name.removeprefix(ENTRY_PREFIX)
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        with open(stage / name, "wb") as staged:  # a chunk at a time, whatever its size
            try:
                _, digest = copy_hashed(source, staged)
            except ReadError as exc:
                raise exc.error from None
        if digest != want[1]:
            raise BundleError(f"bundle member {member.name}: its bytes differ from its digest")
        seen.add(member.name)
    missing = sorted(set(named) - seen)
    if missing:
        raise BundleError(f"the bundle lacks {len(missing)} members its header names: {missing[0]}")
