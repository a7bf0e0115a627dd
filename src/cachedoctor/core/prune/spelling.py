"""Whether a ``relocated`` entry is really out of reach of the jobs: the one judgement
``prune --relocated`` and ``rekey --relocated`` share.

JAX hashes the cache dir *as spelled* (``storage/urls.jax_spelling``), so an entry written for
``/abs/cache`` is relocated for a run that spells the same folder ``cache`` or through a link:
the judgement holds only for the spelling the *jobs* use, which cachedoctor cannot see. An entry
is kept when a record shows a read since it was written (some run's spelling hits it), and when
it was written for another spelling of this very folder while the user has not said how the jobs
spell it (``--jobs-cache-dir``): cannot tell, so keep, and say what would tell.
"""

from __future__ import annotations

import os

from cachedoctor.core.usage.lookups import EntryUse
from cachedoctor.storage.location import Location


def keep_reason(
    written_dir: str, cache_real: str, jobs_told: bool, use: EntryUse | None
) -> str | None:
    """Why a relocated entry written for ``written_dir`` stays, or None when it may go.

    ``cache_real``: the cache's real path ("" for a bucket); ``jobs_told``: the user named the
    jobs' spelling, so another spelling of this folder is not theirs."""
    if use is not None and use.read_since_written:
        return (
            f"written for a cache spelled {written_dir}, and {use.evidence}: a run that spells "
            "the cache so looks it up; if your jobs spell it otherwise, say so with "
            "--jobs-cache-dir"
        )
    if jobs_told or not cache_real:
        return None  # on a bucket: a URL names one place, not two
    written = Location.of_setting(written_dir)  # the path the writer's XLA flag held
    if written is None or written.local_path is None:
        return None  # written for a bucket: a URL names one place, not two
    if not os.path.isabs(written_dir):
        return (
            f"written for a cache spelled {written_dir}, relative to the writer's working "
            "directory, which may be this folder: cannot tell; name the spelling your jobs use "
            "with --jobs-cache-dir"
        )
    if _same_folder(written_dir, cache_real):
        return (
            f"written for {written_dir}, which is this folder under another spelling: runs "
            "that spell it so hit it; name the spelling your jobs use with --jobs-cache-dir"
        )
    return None


def _same_folder(spelled: str, cache_real: str) -> bool:
    try:
        return os.path.realpath(spelled) == cache_real or os.path.samefile(spelled, cache_real)
    except OSError:
        return False
