"""Exit codes, the one error type that the CLI turns into a one-line message, and its wording."""

from __future__ import annotations

import enum
import errno
import os


class ExitCode(enum.IntEnum):
    """Process exit codes shared by every command."""

    OK = 0
    FINDINGS = 1  # the command worked and found something that fails the run (or entries differ)
    USAGE = 2  # bad arguments, unreadable input, I/O errors


class CachedoctorError(Exception):
    """An error the user can act on; the CLI prints ``slug: message`` and exits with ``code``."""

    slug = "error"
    code = ExitCode.USAGE

    def __init__(self, message: str, *, slug: str | None = None) -> None:
        super().__init__(message)
        if slug is not None:
            self.slug = slug


class NoCacheDirError(CachedoctorError):
    slug = "no-cache-dir"


class EntryNotFoundError(CachedoctorError):
    slug = "entry-not-found"


class AmbiguousEntryError(CachedoctorError):
    """A key prefix that names several entries: more of the key tells them apart."""

    slug = "ambiguous-entry"


class NotACacheError(CachedoctorError):
    """A folder that holds files but nothing of a JAX cache: the user named the wrong one."""

    slug = "not-a-cache"

    def __init__(self, where: str, files: int) -> None:
        super().__init__(
            f"{clip(where)} does not look like a JAX cache: {count(files, 'file')}, but no cache "
            "entry, -atime file or XLA sub-cache; give the cache directory"
        )


# One slug and one wording per condition, whichever command or API function meets it.
_OS_CONDITIONS: dict[int, tuple[str, str]] = {
    errno.ENOENT: ("no-such-{what}", "no such {noun}: {path}"),
    errno.ENOTDIR: ("not-a-dir", "not a directory: {path}"),
    errno.EACCES: ("permission-denied", "cannot read {path}: permission denied"),
    errno.EPERM: ("permission-denied", "cannot read {path}: permission denied"),
    errno.ELOOP: ("symlink-loop", "cannot read {path}: a loop of symbolic links"),
    errno.ENAMETOOLONG: ("name-too-long", "cannot read {path}: the name is too long"),
}
_NOUNS = {"dir": "directory", "file": "file"}


def path_error(
    exc: OSError, path: str | os.PathLike[str], *, what: str = "dir"
) -> CachedoctorError:
    """The one-line error for an ``OSError`` met on ``path`` (``what``: ``dir`` or ``file``).

    Each condition has one slug everywhere: ``no-such-dir`` / ``no-such-file``, ``not-a-dir``,
    ``permission-denied``, ``symlink-loop``, ``name-too-long``; any other is ``io``, in the
    system's words.
    """
    code = exc.errno
    if isinstance(exc, FileNotFoundError):
        code = errno.ENOENT
    elif isinstance(exc, NotADirectoryError):
        code = errno.ENOTDIR
    shown = clip(os.fspath(path))
    if code not in _OS_CONDITIONS:
        return CachedoctorError(f"cannot read {shown}: {exc.strerror or exc}", slug="io")
    slug, words = _OS_CONDITIONS[code]
    return CachedoctorError(
        words.format(noun=_NOUNS[what], path=shown), slug=slug.format(what=what)
    )


def clip(text: str, limit: int = 100) -> str:
    """User input quoted in a message, cut to a readable length (a 5000-character name)."""
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def count(n: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``2 entries``: a number with its noun in the right number."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
