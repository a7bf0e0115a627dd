"""What a file was when a plan was made (``FileId``): a removal is refused when any of it
changed; and what is read of a file for it (``Stat``). Apart from the file operations
(``fsops``), which take one only to compare it: a process that only writes (the hook's stats
record) does not build this dataclass at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Stat(Protocol):
    """What the planners read of a file: an ``os.stat_result``, or an object's ``ObjectStat``."""

    @property
    def st_mode(self) -> int: ...
    @property
    def st_ino(self) -> int: ...
    @property
    def st_size(self) -> int: ...
    @property
    def st_mtime_ns(self) -> int: ...
    @property
    def st_uid(self) -> int: ...


@dataclass(frozen=True)
class FileId:
    """What a file was when a plan was made: a removal is refused when any of it changed.

    ``version`` is an object's GCS generation or S3 ETag (None for a local file): on a bucket
    it alone decides, and the server enforces it on the delete.
    """

    name: str
    ino: int
    size: int
    mtime_ns: int
    version: str | None = None
    # a removal that rests on the access time the plan saw (not read since the write, or last
    # read that long ago): a read since the plan, which moves the access time, cancels it
    atime_ns: int | None = None

    @classmethod
    def of(cls, name: str, st: Stat) -> FileId:
        return cls(name, st.st_ino, st.st_size, st.st_mtime_ns, getattr(st, "version", None))

    def matches(self, st: Stat) -> bool:
        if self.version is not None:
            return getattr(st, "version", None) == self.version
        if self.atime_ns is not None and getattr(st, "st_atime_ns", 0) > self.atime_ns:
            return False
        return (st.st_ino, st.st_size, st.st_mtime_ns) == (self.ino, self.size, self.mtime_ns)
