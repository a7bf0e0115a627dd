"""Whether a folder's access times say anything: the mount's atime policy, from the kernel.

JAX reads an entry on every hit (``lru_cache.get``: ``read_bytes``) and writes it once
(``put``: ``write_bytes``, which sets atime at creation and mtime at the last write). On a
``relatime`` mount (Linux's default) the first read after a write moves ``st_atime`` past
``st_mtime``; on ``strictatime`` every read does. So there, ``st_atime > st_mtime`` means *some
process read the entry after it was written*, and ``st_atime <= st_mtime`` means *nothing has
read it since* (cachedoctor opens entries with ``O_NOATIME``, so its own reads leave no trace:
``storage/files.open_regular``). On a ``noatime`` mount, or a network filesystem whose server
keeps access times its own way, the times say nothing, and nothing is concluded from them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

MOUNTINFO = "/proc/self/mountinfo"

AtimePolicy = Literal["relatime", "strictatime", "noatime"]

# Filesystems whose access times are the server's (or a FUSE daemon's) to keep: unknown.
_OCTAL = re.compile(r"\\([0-7]{3})")
_NETWORK_TYPES = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "lustre"})


@dataclass(frozen=True)
class MountAtime:
    """The mount a folder is on and what its access times can tell."""

    mount_point: str
    fs_type: str
    policy: AtimePolicy | None  # None: not known (network fs, FUSE, no /proc)

    @property
    def tells_reads(self) -> bool:
        """Whether ``st_atime`` vs ``st_mtime`` tells a read since the last write."""
        return self.policy in ("relatime", "strictatime")

    def describe(self) -> str:
        what = self.policy or "access times not kept reliably"
        return f"{self.mount_point} ({self.fs_type}, {what})"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field) if "\\" in field else field


def parse_mountinfo(text: str) -> list[tuple[str, str, str, str]]:
    """(major:minor, mount point, per-mount options, fs type) of each line of mountinfo."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            mounts.append((fields[2], _unescape(fields[4]), fields[5], fields[sep + 1]))
        except (ValueError, IndexError):
            continue  # a line in a form this reader does not know: skipped, never guessed
    return mounts


def policy_of(options: str, fs_type: str) -> AtimePolicy | None:
    """The atime policy of one mount's options (``strictatime`` is shown as neither flag)."""
    if fs_type in _NETWORK_TYPES or fs_type.startswith("fuse"):
        return None
    opts = set(options.split(","))
    if "noatime" in opts:
        return "noatime"
    if "relatime" in opts:
        return "relatime"
    return "strictatime"


def mount_of(path: str, mountinfo: str | None = None) -> MountAtime | None:
    """The mount ``path`` (a folder) lives on, matched by device and longest mount point;
    None when the kernel's table cannot be read (not Linux)."""
    try:
        st = os.stat(path)
        real = os.path.realpath(path)
        text = mountinfo if mountinfo is not None else _read_mountinfo()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    best: tuple[str, str, str, str] | None = None
    for m in parse_mountinfo(text):
        point = m[1]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and m[0] == dev and (best is None or len(point) > len(best[1])):
            best = m
    if best is None:
        return None
    return MountAtime(best[1], best[3], policy_of(best[2], best[3]))


def _read_mountinfo() -> str:
    """The kernel's mount table, read anew each time (mounts change under a long process)."""
    with open(MOUNTINFO, encoding="utf-8", errors="replace") as fh:
        return fh.read()
