"""Local files, safely: open only regular files, replace a file atomically.

``open_regular`` never blocks on a FIFO or device and never follows a link. ``atomic_file`` is
the one way cachedoctor replaces a file by path: readers see the old file or the new one.

A unique temp file in the target's folder is written and fsynced, then ``os.replace``d over the
target, so concurrent writers each publish a complete file and a crash leaves no half-written
one. The config file, the scan index, reports (``-o``, ``--junit``, ``--html``), baselines and
extracted payloads (``show --extract``) go through here. Every write inside a cache directory
(manifests, stats records, a local store's files, the hook's re-keyed entries, prune's and
rekey's changes) goes through ``fsops.CacheDir`` instead, relative to a folder opened without
following a link (``write_new``, ``write_replacing``, ``link_noreplace``, ``link_replacing``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

StrPath = str | os.PathLike[str]


@contextlib.contextmanager
def atomic_file(
    path: StrPath,
    *,
    mode: int | None = None,
    temp_prefix: str | None = None,
    create: bool = False,
) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` when the block ends, and vanishes if it raises.

    ``mode`` sets the permissions (default: mkstemp's 0o600, private); the temp name is
    ``<temp_prefix><random>.tmp`` (default prefix ``.<name>.``), a name JAX ignores.
    ``create``: publish only if ``path`` does not exist yet (a hard link, which the kernel
    refuses over an existing name), else raise FileExistsError: the first of several
    concurrent writers wins and nobody's file is replaced.
    """
    folder, name = os.path.split(os.fspath(path))
    fd, tmp = tempfile.mkstemp(
        prefix=temp_prefix if temp_prefix is not None else f".{name}.",
        suffix=".tmp",
        dir=folder or ".",
    )
    with _removed_on_failure(tmp):
        with os.fdopen(fd, "w+b") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        if create:
            _publish_new(tmp, path)
        else:
            os.replace(tmp, path)


def _publish_new(tmp: str, path: StrPath) -> None:
    """Give the whole file ``tmp`` the name ``path`` unless that name exists."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (some network and FAT file systems)
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "File exists", os.fspath(path)) from None
        os.rename(tmp, path)
        return
    os.unlink(tmp)


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the umask (reports, extracted files)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def replacing(path: StrPath, *, temp_prefix: str, suffix: str = ".tmp") -> Iterator[str]:
    """A new empty temp file's path beside ``path``, renamed over ``path`` when the block ends
    and removed if it raises: :func:`atomic_file` for writers that need a path rather than a
    file (sqlite builds the scan index at a path). No fsync: for files that are only a
    shortcut, where a crash may lose the new file but never leaves half of it."""
    folder = os.path.dirname(os.fspath(path))
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix, suffix=suffix, dir=folder or ".")
    os.close(fd)
    with _removed_on_failure(tmp):
        yield tmp
        os.replace(tmp, path)


def write_atomic(
    path: StrPath, data: bytes, *, mode: int | None = None, create: bool = False
) -> None:
    """Replace ``path`` with ``data`` whole (see :func:`atomic_file`, also for ``create``)."""
    with atomic_file(path, mode=mode, create=create) as fh:
        fh.write(data)


@contextlib.contextmanager
def _removed_on_failure(tmp: str) -> Iterator[None]:
    """Remove the temp file ``tmp`` if the block raises (it was never published)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_NOATIME = getattr(os, "O_NOATIME", 0)  # Linux only


def open_regular(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> BinaryIO:
    """Open a regular file for reading; anything else is refused without blocking.

    A FIFO, socket or device named like a cache file would block ``open`` or ``read`` forever;
    ``O_NONBLOCK`` makes the open return at once and ``fstat`` then refuses what is not a regular
    file (EINVAL, "not a regular file"). Links are never followed (ELOOP).

    ``O_NOATIME`` keeps the file's access time as JAX's reads left it: whether an entry was
    read since it was written is evidence of use (``storage/mounts``), and a scan must not
    make every entry look used. The kernel allows it only to the file's owner (or root):
    for anyone else the open is made again without it (EPERM).
    """
    fd, _ = _open_regular_fd(path, dir_fd)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, limit: int) -> tuple[bytes | None, os.stat_result]:
    """The bytes of the regular file at ``path`` (refused as ``open_regular`` refuses), read
    whole when it is at most ``limit`` bytes long (else None), and its ``fstat``: one open, one
    stat and one read for the scan's small entries, without a file object. Raises OSError."""
    fd, st = _open_regular_fd(path, None)
    try:
        if st.st_size > limit:
            return None, st
        data = os.read(fd, st.st_size + 1)
        while len(data) <= st.st_size and (more := os.read(fd, st.st_size + 1 - len(data))):
            data += more
        return data, st
    finally:
        os.close(fd)


def _open_regular_fd(
    path: str | os.PathLike[str], dir_fd: int | None
) -> tuple[int, os.stat_result]:
    """A blocking descriptor of the regular file at ``path`` and its ``fstat`` (see
    ``open_regular``). Raises OSError."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | _NOATIME, dir_fd=dir_fd)
    except PermissionError:
        if not _NOATIME:
            raise
        fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
            raise OSError(code, kind, os.fspath(path))
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise
