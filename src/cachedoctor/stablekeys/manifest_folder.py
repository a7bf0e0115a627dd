"""The manifests folder of a local cache dir (``cachedoctor-manifests/``): opened without
following a link, and listed. Apart from the manifests' module, which imports it, so that the
hook's index lists a local cache without importing that module: a warm start writes no manifest.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator

from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_SUFFIX
from cachedoctor.storage.fsops import CacheDir


@contextlib.contextmanager
def open_manifest_folder(
    cache_dir: str | os.PathLike[str], *, create: bool = False
) -> Iterator[CacheDir]:
    """The manifests folder of a local cache dir, open: read and written relative to it, never
    through a link planted at ``cachedoctor-manifests/`` or at a manifest (``CacheDir``).
    FileNotFoundError when absent (made with ``create``); OSError ELOOP where a link stands."""
    if create:  # the hook may write before JAX has made the cache dir (the user's to name)
        with contextlib.suppress(FileExistsError):  # a file there: the open says ENOTDIR
            os.makedirs(cache_dir, exist_ok=True)
    with CacheDir.open(cache_dir) as root, root.walk(MANIFEST_DIRNAME, create=create) as folder:
        yield folder


def manifest_keys_of(names: Iterable[str]) -> set[str]:
    """The keys named by the files of a manifests folder (``<key>.json``; dot files are
    temporary)."""
    return {
        n[: -len(MANIFEST_SUFFIX)]
        for n in names
        if n.endswith(MANIFEST_SUFFIX) and not n.startswith(".")
    }


def local_manifest_keys(cache_dir: str) -> set[str]:
    """The keys that have a manifest in a local cache dir: one listing of its manifests
    folder, opened without following a link (a link there: none); empty when absent."""
    try:
        with open_manifest_folder(cache_dir) as folder:
            return manifest_keys_of(folder.listdir())
    except (FileNotFoundError, NotADirectoryError):
        return set()
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return set()  # a link where the folder should be: not ours to read
