"""Exit codes, the one error type that the CLI turns into a one-line message, and its wording."""

from __future__ import annotations

import contextlib
import enum
import errno
import os
from typing import NamedTuple


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

    def __init__(self, where: str, files: int, *, unproven: str | None = None) -> None:
        if unproven is not None:  # names alone: not enough for a command that removes files
            super().__init__(
                f"{clip(where)} does not look like a JAX cache: {count(files, 'file')}, but no "
                "entry that decodes, no entry with its -atime file, no stats record or manifest;"
                f" {unproven} changes only a JAX cache"
            )
            return
        super().__init__(
            f"{clip(where)} does not look like a JAX cache: {count(files, 'file')}, but no cache "
            "entry, -atime file or XLA sub-cache; give the cache directory"
        )


# One slug and one reason per condition, whichever command, API function or finding meets it.
_REASONS: dict[int, tuple[str, str]] = {
    errno.ENOTDIR: ("not-a-dir", "not a directory"),
    errno.EISDIR: ("is-a-dir", "it is a directory"),
    errno.EACCES: ("permission-denied", "permission denied"),
    errno.EPERM: ("permission-denied", "permission denied"),
    errno.ELOOP: ("symlink-loop", "a loop of symbolic links"),
    errno.ENAMETOOLONG: ("name-too-long", "the name is too long"),
}


class _Kind(NamedTuple):
    noun: str  # "no such {noun}: PATH"
    label: str  # "cannot read {label}PATH: …"
    missing: str  # the slug of ENOENT on a read
    is_dir: bool


# what path_error's ``what`` may name; each kind's missing slug is its own (a command that is
# not there is `command-not-found`, as a shell says it), every other condition's is shared.
_KINDS = {
    "dir": _Kind("directory", "", "no-such-dir", True),
    "file": _Kind("file", "", "no-such-file", False),
    "config file": _Kind("config file", "config file ", "no-such-file", False),
    "baseline": _Kind("baseline file", "baseline ", "no-such-file", False),
    "command": _Kind("command", "", "command-not-found", False),
}
# verbs that make the named path: ENOENT there is a missing folder above it
_MAKING = frozenset({"write", "create"})
VERBS = frozenset({"read", "use", "run", "remove"}) | _MAKING


def _errno(exc: OSError) -> int | None:
    if isinstance(exc, FileNotFoundError):
        return errno.ENOENT
    if isinstance(exc, NotADirectoryError):
        return errno.ENOTDIR
    return exc.errno


def _condition(exc: OSError, path: str | os.PathLike[str] | None) -> tuple[str, str] | None:
    """(slug, reason) of a known condition; an ELOOP on a link to something that exists is
    ``O_NOFOLLOW`` refusing a link (``symlink``), not a loop."""
    code = _errno(exc)
    if code == errno.ELOOP and path is not None:
        with contextlib.suppress(OSError, ValueError):
            if os.path.islink(path) and os.path.exists(path):
                return "symlink", "a symbolic link; not followed"
    return _REASONS.get(code) if code is not None else None


def os_reason(exc: OSError) -> str:
    """Why an ``OSError`` happened, in the words ``path_error`` uses: the evidence string of a
    finding or problem (``cannot read: permission denied``), never a raised error."""
    if _errno(exc) == errno.ENOENT:
        return "no such file or directory"
    found = _condition(exc, exc.filename if isinstance(exc.filename, str) else None)
    return found[1] if found else str(exc.strerror or exc)


def path_error(
    exc: OSError,
    path: str | os.PathLike[str],
    *,
    what: str = "dir",
    verb: str = "read",
    cls: type[CachedoctorError] = CachedoctorError,
    hint: str = "",
) -> CachedoctorError:
    """The one-line error for an ``OSError`` met doing ``verb`` on ``path``.

    ``what``: ``dir``, ``file``, ``config file``, ``baseline`` or ``command``; ``verb``:
    ``read``, ``use``, ``run``, ``remove``, ``write`` or ``create``; ``cls``: the error class to
    raise (``ConfigError``, ``BaselineError``…, for callers that catch it), whose slug the
    condition's replaces; ``hint``: what to do, appended in parentheses.

    Each condition has one slug everywhere: ``no-such-dir`` / ``no-such-file`` (and
    ``command-not-found``), ``not-a-dir``, ``is-a-dir``, ``permission-denied``, ``symlink-loop``
    (``symlink`` for a link that is refused, not followed), ``name-too-long``; any other is
    ``io``, in the system's words. A write or create that meets ENOENT is ``no-such-dir``: the
    folder it goes in is missing.
    """
    kind = _KINDS[what]
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}")
    shown = clip(os.fspath(path))
    head = f"cannot {verb} {kind.label}{shown}"
    if _errno(exc) == errno.ENOENT:
        if verb in _MAKING:
            folder = clip(os.path.dirname(os.fspath(path)) or ".")
            slug, words = "no-such-dir", f"{head}: no such directory: {folder}"
        else:
            slug, words = kind.missing, f"no such {kind.noun}: {shown}"
    elif (found := _condition(exc, path)) is not None:
        slug, reason = found
        if slug == "not-a-dir" and kind.is_dir and verb not in _MAKING:
            words = f"not a directory: {shown}"
        elif slug == "not-a-dir":  # a file where a folder of its path should be
            words = f"{head}: a part of its path is not a directory"
        else:
            words = f"{head}: {reason}"
    else:
        slug, words = "io", f"{head}: {os_reason(exc)}"
    return cls(f"{words} ({hint})" if hint else words, slug=slug)


def clip(text: str, limit: int = 100) -> str:
    """User input quoted in a message, cut to a readable length (a 5000-character name)."""
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def count(n: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``2 entries``: a number with its noun in the right number."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
