"""Exit codes, the one error type that the CLI turns into a one-line message, and its wording."""

from __future__ import annotations

import enum


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


def clip(text: str, limit: int = 100) -> str:
    """User input quoted in a message, cut to a readable length (a 5000-character name)."""
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text)} characters)"


def count(n: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``2 entries``: a number with its noun in the right number."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
