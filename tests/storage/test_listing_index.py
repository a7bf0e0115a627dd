"""The store's filesystems find an object in a cached listing by name, as the libraries do.

s3fs and gcsfs look an object's details up in its parent's cached listing by a linear scan, once
for every open (``remote_store.ListingIndex``). Our filesystems answer from an index instead:
the same answers as the library's own classes over the same cached listing (the oracle here),
without visiting the listing once per lookup.
"""

from __future__ import annotations

from typing import Any

import pytest

from cachedoctor.storage import remote_store

s3fs = pytest.importorskip("s3fs", reason="s3fs not installed (cachedoctor[s3])")
gcsfs = pytest.importorskip("gcsfs", reason="gcsfs not installed (cachedoctor[gcs])")

PARENT = "bucket/cache"


class VisitCountingList(list[dict[str, Any]]):
    """A cached listing that counts the entries lookups visit."""

    visited = 0

    def __iter__(self) -> Any:
        for item in super().__iter__():
            self.visited += 1
            yield item


def _listing(n: int) -> list[dict[str, Any]]:
    files = [
        {"name": f"{PARENT}/{i:05x}-cache", "type": "file", "size": i, "ETag": f'"e{i}"'}
        for i in range(n)
    ]
    odd = [
        {"name": f"{PARENT}/xla_gpu_per_fusion_autotune_cache_dir", "type": "directory", "size": 0},
        {"name": f"{PARENT}/dup", "type": "file", "size": 1, "ETag": '"a"'},
        {"name": f"{PARENT}/dup", "type": "file", "size": 2, "ETag": '"b"'},
        {"name": f"{PARENT}/slashed/", "type": "directory", "size": 0},
    ]
    return files[: n // 2] + odd + files[n // 2 :]


def _library_filesystem(scheme: str) -> Any:
    if scheme == "s3":
        return s3fs.S3FileSystem(skip_instance_cache=True, anon=True)
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem(skip_instance_cache=True, token="anon")


def _answer(fs: Any, path: str) -> Any:
    try:
        return fs.info(path)
    except FileNotFoundError as exc:
        return ("FileNotFoundError", str(exc))


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_lookups_in_a_cached_listing_answer_as_the_library(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # never a real service
    ours, theirs = remote_store._make_filesystem(scheme), _library_filesystem(scheme)
    listing = _listing(40)
    for fs in (ours, theirs):
        fs.dircache[PARENT] = list(listing)
    paths = [*sorted({str(info["name"]) for info in listing}), f"{PARENT}/dup"]
    paths += [f"{PARENT}/slashed", f"{PARENT}/00003-cache/"]
    if scheme == "s3":  # gcsfs asks the server about a name its listing lacks
        paths += [f"{PARENT}/absent-cache", f"{PARENT}/00003-cach"]
    for path in paths:
        assert _answer(ours, path) == _answer(theirs, path), path


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_lookups_do_not_visit_the_listing_once_each(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    fs = remote_store._make_filesystem(scheme)
    listing = VisitCountingList(_listing(2000))
    fs.dircache[PARENT] = listing
    names = [str(info["name"]) for info in listing if info["type"] == "file"]
    for name in names:
        assert fs.info(name)["name"] == name
    # one pass to index the listing, not one pass per lookup (2000 x 2004 with the library's)
    assert listing.visited <= 2 * len(listing)

    listing.append({"name": f"{PARENT}/late-cache", "type": "file", "size": 7, "ETag": '"l"'})
    assert fs.info(f"{PARENT}/late-cache")["size"] == 7  # a grown listing is indexed again
    fs.dircache[PARENT] = [{"name": f"{PARENT}/other-cache", "type": "file", "size": 3}]
    assert fs.info(f"{PARENT}/other-cache")["size"] == 3  # and so is another listing
    if scheme == "s3":
        with pytest.raises(FileNotFoundError):
            fs.info(f"{PARENT}/late-cache")
