"""The key manifests of one cache dir as this process knows them: listed once, each read once.

Every lookup the hook answers asks "has this key a manifest?" (static modules: write it once)
and, for a module with custom_partitioning calls, "which recorded variants of this module are
there?". On a bucket, answering from the store each time would be a metadata request per lookup
and a listing plus a read per manifest per custom_partitioning lookup, in every process of a
job starting at once. The index lists the manifests folder at the first lookup, reads a
module's manifests at the first lookup of that module (concurrently on a bucket) and keeps
them; what this process writes is added. A refresh re-lists, and reads only manifests it has not
seen: the hook refreshes before it makes a new variant, to see what other processes recorded
since this one started.

Nothing here decides a key: a manifest the index does not know only costs a miss (a new
variant), never a wrong hit, since replay checks every candidate against the current callbacks.

A local cache dir is listed here, without the manifests' module: a warm start, which writes
no manifest, never imports it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from cachedoctor.stablekeys.manifest_folder import local_manifest_keys

if TYPE_CHECKING:
    from cachedoctor.stablekeys import manifest as mf
    from cachedoctor.storage.location import Location


def module_of(key: str) -> str:
    """The module part of ``<module>-<hex>``."""
    return key.rsplit("-", 1)[0]


class ManifestIndex:
    """The manifests of one cache dir (a local path or a ``gs://`` / ``s3://`` URL)."""

    def __init__(self, cache_dir: Location) -> None:
        self.cache_dir = cache_dir
        self._keys: set[str] | None = None  # keys with a manifest, from the last listing
        self._modules: dict[str, list[mf.Manifest]] = {}  # module -> its manifests, read once
        self._read: set[str] = set()  # keys already read (or found unreadable)
        self._lock = threading.Lock()
        self.listings = 0
        self.reads = 0
        self.error: str | None = None  # why the last listing failed (then: no manifests known)

    def _listed(self) -> set[str]:
        if self._keys is None:
            self._keys = self._list()
        return self._keys

    def _list(self) -> set[str]:
        self.listings += 1
        try:
            if self.cache_dir.local_path is not None:
                found = local_manifest_keys(self.cache_dir.spelling)
            else:
                from cachedoctor.stablekeys import manifest as mf

                found = mf.manifest_keys(self.cache_dir)
        except Exception as exc:  # unreachable bucket, no permission: nothing known, a miss
            self.error = f"{type(exc).__name__}: {exc}"
            return set()
        self.error = None
        return found

    def has(self, key: str) -> bool:
        """Whether ``key`` had a manifest at the last listing, or this process wrote one."""
        with self._lock:
            return key in self._listed()

    def module(self, module_name: str) -> list[mf.Manifest]:
        """This module's manifests (read at its first lookup in this process)."""
        with self._lock:
            if module_name in self._modules:
                return list(self._modules[module_name])
            wanted = [k for k in self._listed() if module_of(k) == module_name]
        self._add_read(module_name, wanted)
        with self._lock:
            return list(self._modules[module_name])

    def refresh(self, module_name: str) -> list[mf.Manifest]:
        """List again; the manifests of this module that were not known before (read now)."""
        listed = self._list()
        with self._lock:
            self._keys = (self._keys or set()) | listed
            wanted = [k for k in listed if module_of(k) == module_name and k not in self._read]
        return self._add_read(module_name, wanted)

    def _add_read(self, module_name: str, keys: list[str]) -> list[mf.Manifest]:
        """Read ``keys`` and keep them under the module; returns those not known before."""
        found: list[mf.Manifest] = []
        if keys:
            from cachedoctor.stablekeys import manifest as mf

            found = mf.read_manifests(self.cache_dir, keys)
        with self._lock:
            self.reads += len(keys)
            self._read.update(keys)
            known = self._modules.setdefault(module_name, [])
            seen = {m.key for m in known}
            fresh = [m for m in found if m.key not in seen]
            known.extend(fresh)
            return fresh

    def add(self, manifest: mf.Manifest) -> None:
        """A manifest this process wrote (or found already written)."""
        with self._lock:
            self._listed().add(manifest.key)
            self._read.add(manifest.key)
            if manifest.module_name in self._modules:
                known = self._modules[manifest.module_name]
                if all(m.key != manifest.key for m in known):
                    known.append(manifest)

    def stats(self) -> dict[str, Any]:
        return {"listings": self.listings, "reads": self.reads, "error": self.error}


_INDEXES: dict[str, ManifestIndex] = {}
_LOCK = threading.Lock()


def index_for(cache_dir: Location) -> ManifestIndex:
    """The process's one index of a cache dir."""
    name = cache_dir.spelling.rstrip("/")
    with _LOCK:
        found = _INDEXES.get(name)
        if found is None:
            found = _INDEXES[name] = ManifestIndex(cache_dir)
        return found
