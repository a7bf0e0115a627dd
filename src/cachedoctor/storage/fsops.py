"""Safe filesystem primitives for commands that change a cache directory.

Everything works relative to one open directory descriptor (``CacheDir``) and never follows a
symbolic link: names are looked up with ``dir_fd`` + ``follow_symlinks=False`` / ``O_NOFOLLOW``,
so a link planted in the cache cannot redirect a write or a removal outside it.

Locking: JAX's LRU cache (``jax/_src/lru_cache.py``, jax 0.4.38 to 0.12) takes
``filelock.FileLock(<dir>/.lockfile)`` around every get/put when eviction is on. On Linux that is
``filelock.UnixFileLock``: ``fcntl.flock(fd, LOCK_EX | LOCK_NB)`` polled until a timeout, on a file
that stays in place. ``CacheDir.lock`` takes the same ``flock`` on the same file, so JAX and
cachedoctor exclude each other without depending on the ``filelock`` package. JAX waits at most
10 s for the lock (``lock_timeout_secs``), so callers hold it for one small unit of work at a time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, BinaryIO, Protocol

from cachedoctor.layout import LOCKFILE, OWN_LOCKFILE, TEMP_PREFIX
from cachedoctor.storage.files import open_regular

if TYPE_CHECKING:
    from cachedoctor.storage.fileid import FileId, Stat

LOCK_POLL_S = 0.05
COPY_CHUNK = 1 << 20  # what a copy holds of a file at a time
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV}  # no hard links here


class LockTimeout(OSError):
    """JAX's lock could not be taken in time (a JAX process holds it for long)."""


class Folder(Protocol):
    """What prune and rekey plan and apply with: a cache folder opened without following a
    link (``CacheDir``) or a bucket prefix (``store_dir.StoreDir``), both made by
    ``Location.open_dir``. Callers hold a ``Folder`` and ask it (``is_remote``, ``read_many``)
    rather than testing which of the two it is; its store is its Location's (``store()``)."""

    path: str
    is_remote: bool

    def close(self) -> None: ...
    def __enter__(self) -> Folder: ...
    def __exit__(self, *exc: object) -> None: ...
    def subdir(self, name: str, *, create: bool = False) -> Folder | None: ...
    def listdir(self) -> list[str]: ...
    def lstat(self, name: str) -> Stat | None: ...
    def regular(self, name: str) -> Stat | None: ...
    def read_small(self, name: str, limit: int = 1 << 20) -> bytes | None: ...
    def read_many(self, names: list[str], limit: int = 1 << 20) -> list[bytes | None]: ...
    def remember(self, items: Iterable[tuple[str, int, int, str | None, bool]]) -> None: ...
    def lock(self, timeout: float = 30.0) -> contextlib.AbstractContextManager[bool]: ...
    def unlink_if(self, expected: FileId | None, name: str | None = None) -> str: ...
    def write_new(
        self, name: str, data: bytes | os.PathLike[str], mode: int = 0o644, *, durable: bool = True
    ) -> bool: ...
    def link_noreplace(self, src: str, dst: str) -> bool: ...
    def chmod_nofollow(self, name: str, clear_bits: int, expected: FileId | None = None) -> str: ...
    def fsync(self) -> None: ...


class CacheDir:
    """An open cache directory (or a folder inside one) that refuses to follow links."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> CacheDir:
        """Open ``path`` (the user's argument; a link *to* the cache itself is their choice)."""
        real = os.path.realpath(path)
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return cls(fd, real)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> CacheDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subdir(self, name: str, *, create: bool = False) -> CacheDir | None:
        """A folder inside this one; None when absent, or when a link or file stands there."""
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=self.fd)
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return None  # a link or a file where a folder should be: not ours to enter
            raise
        return CacheDir(fd, os.path.join(self.path, name))

    def walk(self, relpath: str, *, create: bool = False) -> CacheDir:
        """The folder ``relpath`` (``a/b``) below this one, each part opened without following
        a link: the caller closes it. Raises FileNotFoundError when a part is absent (with
        ``create``: made, mode 0o755), and OSError ELOOP (a symbolic link; not followed) or
        ENOTDIR (a file) where a part is not a folder of its own."""
        here = CacheDir(os.dup(self.fd), self.path)
        for part in (p for p in relpath.split("/") if p):
            if part in (".", ".."):
                here.close()
                raise OSError(errno.EINVAL, "not a name inside the cache", relpath)
            try:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=here.fd)
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(part, flags, dir_fd=here.fd)
            except OSError as exc:
                path = os.path.join(here.path, part)
                try:
                    st = here.lstat(part) if exc.errno in (errno.ENOTDIR, errno.ELOOP) else None
                finally:
                    here.close()
                if st is not None and stat.S_ISLNK(st.st_mode):
                    raise OSError(errno.ELOOP, "a symbolic link; not followed", path) from None
                if exc.errno == errno.ENOTDIR:  # a file where the folder should be
                    raise NotADirectoryError(errno.ENOTDIR, "not a folder", path) from None
                raise OSError(exc.errno, exc.strerror, path) from None
            here.close()
            here = CacheDir(fd, os.path.join(here.path, part))
        return here

    # --- looking ------------------------------------------------------------------------------

    is_remote = False

    def listdir(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def regular(self, name: str) -> os.stat_result | None:
        """lstat of ``name`` when it is a regular file (not a link, not a folder), else None."""
        st = self.lstat(name)
        return st if st is not None and stat.S_ISREG(st.st_mode) else None

    def read_small(self, name: str, limit: int = 1 << 20) -> bytes | None:
        try:
            fh = open_regular(name, dir_fd=self.fd)
        except OSError:
            return None
        with fh:
            return fh.read(limit)

    def read_many(self, names: list[str], limit: int = 1 << 20) -> list[bytes | None]:
        """``read_small`` of each name, in order."""
        return [self.read_small(n, limit) for n in names]

    def remember(self, items: Iterable[tuple[str, int, int, str | None, bool]]) -> None:
        """A folder's metadata is read again at each ``lstat``: nothing to remember."""

    # --- locking ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, timeout: float = 30.0) -> Iterator[bool]:
        """Hold JAX's ``.lockfile`` flock; yields whether it exists (eviction in use).

        ``.lockfile`` is never created: JAX creates it when eviction is turned on, and its
        presence is what tells readers (``scan``) that eviction is in use. Our own
        ``.cachedoctor-lock`` is always taken first, so two cachedoctor runs exclude each other
        even where JAX takes no lock.
        """
        deadline = time.monotonic() + timeout
        own = self._acquire(OWN_LOCKFILE, deadline, timeout, create=True)
        try:
            jax = self._acquire(LOCKFILE, deadline, timeout, create=False)
            try:
                yield jax is not None
            finally:
                _release(jax)
        finally:
            _release(own)

    def _acquire(self, name: str, deadline: float, timeout: float, create: bool) -> int | None:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        if create:
            flags |= os.O_CREAT
        while True:
            try:
                fd = os.open(name, flags, 0o644, dir_fd=self.fd)
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() > deadline:
                    raise LockTimeout(
                        errno.ETIMEDOUT, f"{name} is held by another process for over {timeout} s"
                    ) from None
                time.sleep(LOCK_POLL_S)
                continue
            except BaseException:
                os.close(fd)
                raise
            # filelock does the same check: the file may have been replaced before flock won.
            held = os.fstat(fd)
            now = self.lstat(name)
            if held.st_nlink > 0 and now is not None and os.path.samestat(held, now):
                return fd
            os.close(fd)

    # --- changing -----------------------------------------------------------------------------

    def unlink_if(self, expected: FileId | None, name: str | None = None) -> str:
        """Remove a regular file if it is still what the plan saw.

        Returns ``"removed"``, ``"missing"``, ``"changed"`` or ``"not-a-file"``. With
        ``expected=None`` any regular file of that name is removed (companions such as a
        ``-atime`` file whose entry is already gone).
        """
        name = name or (expected.name if expected else None)
        assert name is not None
        st = self.lstat(name)
        if st is None:
            return "missing"
        if not stat.S_ISREG(st.st_mode):
            return "not-a-file"
        if expected is not None and not expected.matches(st):
            return "changed"
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return "missing"
        return "removed"

    def write_new(
        self, name: str, data: bytes | os.PathLike[str], mode: int = 0o644, *, durable: bool = True
    ) -> bool:
        """Create ``name`` atomically: temp file in this folder, fsync, then link it into place.
        ``data``: the bytes, or a local file whose bytes are copied a chunk at a time (never
        held whole: a bundle's member may be gigabytes). ``durable=False`` skips the fsync:
        still never seen half-written, but a power cut may leave it empty.

        An existing file wins (returns False): a concurrent writer's file is never overwritten.
        """
        tmp = self._temp_name()
        try:
            self._write_temp(tmp, data, mode, durable=durable)
            return self._publish(tmp, name)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self.fd)

    def write_replacing(self, name: str, data: bytes | os.PathLike[str], mode: int = 0o600) -> None:
        """Replace ``name`` with ``data`` whole: temp file in this folder, fsync, ``rename``
        over the name. A link standing at ``name`` is replaced, never followed, and a file
        with another name elsewhere (a hard link) keeps its bytes."""
        tmp = self._temp_name()
        try:
            self._write_temp(tmp, data, mode)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self.fd)

    def link_replacing(self, src: str, dst: str) -> None:
        """Give the regular file ``src`` the name ``dst``, replacing what stands there: a hard
        link (where there are none, a copy read through ``open_regular``) under a temp name,
        then ``rename``. A link at ``src`` is refused (ELOOP or EINVAL), never followed."""
        if self.regular(src) is None:
            raise OSError(errno.EINVAL, "not a regular file", os.path.join(self.path, src))
        tmp = self._temp_name()
        try:
            if not self._link_no_clobber(src, tmp):
                with open_regular(src, dir_fd=self.fd) as fin, self._open_temp(tmp, 0o644) as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
            os.rename(tmp, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self.fd)

    def link_noreplace(self, src: str, dst: str) -> bool:
        """Give ``src`` the extra name ``dst`` unless ``dst`` exists (atomic). False if it does.

        On filesystems without hard links: a complete copy under a temp name, renamed into
        place after checking that ``dst`` is absent (the caller holds the lock).
        """
        linked = self._link_no_clobber(src, dst)
        if linked is not None:
            return linked
        if self.lstat(dst) is not None:
            return False
        tmp = self._temp_name()
        try:
            with open_regular(src, dir_fd=self.fd) as fin, self._open_temp(tmp, 0o644) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
                fout.flush()
                os.fsync(fout.fileno())
            os.rename(tmp, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self.fd)

    def _open_temp(self, tmp: str, mode: int) -> BinaryIO:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.fdopen(os.open(tmp, flags, mode, dir_fd=self.fd), "wb")

    def _write_temp(
        self, tmp: str, data: bytes | os.PathLike[str], mode: int, *, durable: bool = True
    ) -> None:
        with self._open_temp(tmp, mode) as fh:
            if isinstance(data, bytes | bytearray | memoryview):
                fh.write(data)
            else:
                with open_regular(data) as source:
                    shutil.copyfileobj(source, fh, COPY_CHUNK)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())

    def _link_no_clobber(self, src: str, dst: str) -> bool | None:
        """Hard-link ``src`` as ``dst`` unless ``dst`` exists (False); None: no hard links here."""
        try:
            os.link(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
        return None

    def _publish(self, tmp: str, name: str) -> bool:
        """Give a complete temp file its final name, unless that name exists."""
        linked = self._link_no_clobber(tmp, name)
        if linked is not None:
            return linked
        if self.lstat(name) is not None:
            return False
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        return True

    def chmod_nofollow(self, name: str, clear_bits: int, expected: FileId | None = None) -> str:
        """Clear permission bits on a regular file, through an O_NOFOLLOW descriptor. A file
        with another name (a hard link, perhaps outside the cache) shares its mode with it: it
        is left as it is (``"hard-linked"``)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return "missing"
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "not-a-file"
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return "not-a-file"
            if expected is not None and st.st_ino != expected.ino:
                return "changed"
            if st.st_nlink > 1:
                return "hard-linked: it has another name, which shares its mode"
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~clear_bits)
            return "done"
        finally:
            os.close(fd)

    def fsync(self) -> None:
        with contextlib.suppress(OSError):
            os.fsync(self.fd)

    def _temp_name(self) -> str:
        return f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"


def _release(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def is_own_temp(name: str) -> bool:
    """Temp names cachedoctor (and its hook) use inside a cache directory."""
    return name.startswith((TEMP_PREFIX, ".cachedoctor-rekey-"))
