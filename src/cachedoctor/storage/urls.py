"""Bucket URLs (``gs://``, ``s3://``): recognising, splitting, and their local sub-cache path.

Kept apart from :mod:`.stores` (which brings thread pools and the fsspec glue) because the
runtime hook asks ``is_url`` of every JAX process's cache dir at start-up, where a local
directory must not pay for importing the bucket machinery.
"""

from __future__ import annotations

import os
import re

from cachedoctor.errors import CachedoctorError

SCHEMES = {"gs": "gcs", "s3": "s3"}  # URL scheme -> the extra that brings its filesystem
SUBCACHE_ROOT_ENV = "CACHEDOCTOR_XLA_SUBCACHE_ROOT"
DEFAULT_SUBCACHE_ROOT = "/tmp/cachedoctor-xla-subcaches"

_URL_RE = re.compile(r"^(?P<scheme>[a-z0-9]+)://(?P<bucket>[^/]+)(?:/(?P<prefix>.*))?$")


def is_url(location: object) -> bool:
    """True for ``gs://…`` and ``s3://…`` (what JAX sends to etils.epath), False for paths."""
    if not isinstance(location, str):
        return False
    m = _URL_RE.match(location)
    return bool(m and m.group("scheme") in SCHEMES)


def split_url(url: str) -> tuple[str, str, str]:
    """``gs://b/p/q/`` -> ("gs", "b", "p/q")."""
    m = _URL_RE.match(url)
    if not m or m.group("scheme") not in SCHEMES:
        raise CachedoctorError(f"not a gs:// or s3:// URL: {url}", slug="bad-url")
    return m.group("scheme"), m.group("bucket"), (m.group("prefix") or "").strip("/")


def subcache_dir_for(cache_dir: str, root: str | None = None) -> str | None:
    """Where XLA's sub-caches (autotune dir, kernel cache file) go for ``cache_dir``.

    None for a local cache: JAX puts them inside it. For a URL, a local directory, because XLA
    opens these paths with plain file I/O and cannot write ``gs://`` or ``s3://``. The path is
    the same on every host (no user name, no home directory), because jax <= 0.10.2 hashes the
    autotune path into every cache key and 0.12 hashes the kernel cache path: a per-host path
    would give every host its own keys and defeat the shared cache.
    Override the root with ``$CACHEDOCTOR_XLA_SUBCACHE_ROOT`` (the same value on every host).
    """
    if not is_url(cache_dir):
        return None
    scheme, bucket, prefix = split_url(cache_dir)
    base = root or os.environ.get(SUBCACHE_ROOT_ENV) or DEFAULT_SUBCACHE_ROOT
    safe = [re.sub(r"[^A-Za-z0-9._-]", "_", p) for p in (scheme, bucket, *prefix.split("/")) if p]
    safe = [p if p not in (".", "..") else p.replace(".", "_") for p in safe]
    return os.path.join(base, *safe)
