"""Typed errors for the binary format decoders (snappy, Riegeli, split protos, GPU executables).

They derive from ``ValueError`` so a caller can catch one family for "this file is not what we
can read", and tell apart data that is damaged (``CorruptFormat``) from data that is well formed
but uses a feature we do not implement or is larger than we agree to hold (``UnsupportedFormat``).
"""

from __future__ import annotations


class FormatError(ValueError):
    """Base class: the bytes cannot be decoded. ``offset`` is where it went wrong, if known."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at byte {offset})")
        self.offset = offset


class CorruptFormat(FormatError):
    """The data is truncated, inconsistent or not the format it claims to be."""


class UnsupportedFormat(FormatError):
    """The data may be valid, but uses a feature this decoder does not implement."""


class TooLarge(UnsupportedFormat):
    """Decoding would exceed a size limit; raised before the memory is allocated."""
