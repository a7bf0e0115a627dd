"""Where a cache is, as the user named it: a local folder or a bucket prefix, parsed once.

``Location.parse`` is made at the edge (the CLI's parameters, the Python API, the hook where it
reads JAX's config value) and handed down to the last call: core entry points, listings, plans,
manifests. Below the edge nothing parses a path or URL string again or tests a type to tell a
bucket from a folder: it asks the Location what it can do (``can_rename``, ``has_locks``,
``has_modes``, ``has_atime``), where it is (``local_path``, ``url``), or for its folder
(``store()``, ``open_dir()``: an ``fsops.Folder``). ``tests/storage/test_location.py`` fails on a
``Location.parse(`` or an ``.is_local`` below the edge.

Cheap to import (the hook imports it at JAX start-up): the bucket client, the thread pools and the
no-follow folder code are imported only by ``store()`` and ``open_dir()``.

Spellings, decided here once:

- a local path keeps the user's spelling (``caches/sp``, ``caches/sp/``, ``./c``): JAX hashes the
  spelling into keys (``urls.jax_spelling``) and the reports show it as typed; ``~`` is not
  expanded (the shell expands it; JAX does not), nor is a Windows-looking ``C:\\cache`` special;
- ``gs://`` and ``s3://`` (the schemes registered in :mod:`.backends`) are buckets, shown as
  ``scheme://bucket/prefix`` (no trailing slash);
- ``file:///abs/c`` is the local folder ``/abs/c`` (JAX's epath reads it so);
- any other ``scheme://`` (``http://``, ``ftp://``) is refused with one line (``bad-url``): it is
  neither a folder nor a bucket cachedoctor can read. Where the value is JAX's own setting
  (the hook), ``Location.of_setting`` gives None for it instead of raising.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from cachedoctor.errors import CachedoctorError
from cachedoctor.storage import urls

if TYPE_CHECKING:
    from cachedoctor.storage.fsops import Folder
    from cachedoctor.storage.stores import Store

_SCHEME_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Location:
    """A cache folder or entry: a local path (as typed) or a bucket URL (normalised).

    A report's ``to_dict`` and ``--json`` write it as its spelling (``plaindata.as_text``)."""

    plain_as_text: ClassVar[bool] = True

    spelling: str  # a local path as typed, or the bucket URL as ``urls`` normalises it
    is_local: bool
    # the store, once opened (``store()``): its request counts are this Location's
    _opened: dict[str, Store] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    @classmethod
    def parse(cls, where: str | os.PathLike[str] | Location) -> Location:
        """The Location of what the user typed; a Location is returned as it is.

        Raises CachedoctorError (``bad-url``) for an empty string or a scheme that is neither
        ``file://`` nor a registered bucket's (``gs://``, ``s3://``).
        """
        if isinstance(where, Location):
            return where
        text = os.fspath(where)
        if not isinstance(text, str) or not text:
            raise CachedoctorError(f"not a folder or a bucket URL: {text!r:.60}", slug="bad-url")
        if urls.is_url(text):
            scheme, bucket, prefix = urls.split_url(text)
            return cls(f"{scheme}://{bucket}" + (f"/{prefix}" if prefix else ""), False)
        if text.startswith("file://") and len(text) > len("file://"):
            return cls(text.removeprefix("file://"), True)
        other = _SCHEME_RE.match(text)
        if other:
            from cachedoctor.storage import backends

            buckets = [f"{b.article} {b.scheme}://bucket/prefix" for b in backends.schemes()]
            raise CachedoctorError(
                f"{text[:200]}: {other.group('scheme')}:// is not supported; give a local "
                f"folder, {backends.with_or(buckets)}",
                slug="bad-url",
            )
        return cls(text, True)

    @classmethod
    def local(cls, path: str | os.PathLike[str]) -> Location:
        """A local file or folder known to be one (a folder cachedoctor made, a path the system
        gave): nothing is parsed, so a path is never taken for a URL."""
        return cls(os.fspath(path), True)

    @classmethod
    def of_setting(cls, value: object) -> Location | None:
        """JAX's cache-dir setting (or an XLA flag's path) as a Location; None when unset or
        not a folder or bucket cachedoctor reads. Never raises: the hook calls it."""
        if not value or not isinstance(value, str | os.PathLike):
            return None
        try:
            return cls.parse(value)
        except CachedoctorError:
            return None

    @classmethod
    def of_store(cls, store: Store) -> Location:
        """The Location of an already opened store (a test's throttled or counted one)."""
        location = cls.parse(store.url)
        location._opened["store"] = store
        return location

    def __str__(self) -> str:
        return self.spelling

    @property
    def display(self) -> str:
        """How reports and messages name it."""
        return self.spelling

    @property
    def local_path(self) -> str | None:
        """The folder's path as typed; None for a bucket."""
        return self.spelling if self.is_local else None

    @property
    def url(self) -> str | None:
        """The bucket URL (``gs://b/p``); None for a local folder."""
        return None if self.is_local else self.spelling

    # What the place can do. A bucket has no rename (no link-without-replace), no JAX lock
    # (``.lockfile`` is a local flock), no file modes or owners, and no access times.

    @property
    def can_rename(self) -> bool:
        return self.is_local

    @property
    def has_locks(self) -> bool:
        return self.is_local

    @property
    def has_modes(self) -> bool:
        return self.is_local

    @property
    def has_atime(self) -> bool:
        return self.is_local

    @property
    def jax_spelling(self) -> str:
        """The folder as JAX spells the paths it builds under it (``urls.jax_spelling``)."""
        return urls.jax_spelling(self.spelling)

    def subpath(self, name: str) -> str:
        """``str(Path(dir) / name)`` as JAX builds it (``urls.jax_subpath``)."""
        return urls.jax_subpath(self.spelling, name)

    def child(self, name: str) -> Location:
        """The Location of ``name`` inside this folder."""
        if self.is_local:
            return Location(os.path.join(self.spelling, name), True)
        return Location(f"{self.spelling}/{name}", False)

    @property
    def parent(self) -> Location | None:
        """The folder holding this one (an entry's cache folder); None for a bucket's root."""
        if self.is_local:
            return Location(os.path.dirname(self.spelling) or ".", True)
        parent, _, _ = self.spelling.rpartition("/")
        return None if parent.endswith(":/") else Location(parent, False)

    @property
    def name(self) -> str:
        """The last part: an entry's file or object name."""
        return os.path.basename(self.spelling.rstrip("/" if not self.is_local else os.sep))

    @property
    def subcache_dir(self) -> str | None:
        """Where XLA's sub-caches go for a bucket cache (``urls.subcache_dir_for``); None here."""
        return None if self.is_local else urls.subcache_dir_for(self.spelling)

    def exists_locally(self) -> bool:
        """A local file or folder stands at this path (a bucket: False, no request made)."""
        return self.is_local and os.path.lexists(self.spelling)

    def store(self) -> Store:
        """The ``Store`` of this folder, opened on first use and kept (its request counts
        belong to this Location); imports the bucket client only for a bucket."""
        store = self._opened.get("store")
        if store is None:
            from cachedoctor.storage.stores import open_store

            store = self._opened["store"] = open_store(self.spelling)
        return store

    def resolved(self) -> Location:
        """A local folder by its real path (links resolved, as ``open_dir`` opens it); a
        bucket as it is (its store kept)."""
        return Location(os.path.realpath(self.spelling), True) if self.is_local else self

    def open_dir(self) -> Folder:
        """The folder API (``fsops.Folder``) that removes and rewrites without following links
        (local) or only when an object is unchanged (bucket). The caller closes it."""
        from cachedoctor.storage.fsops import CacheDir
        from cachedoctor.storage.store_dir import StoreDir

        if self.is_local:
            return CacheDir.open(self.spelling)
        return StoreDir(self.store())
