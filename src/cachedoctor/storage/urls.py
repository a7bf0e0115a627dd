"""Bucket URLs (``gs://``, ``s3://``: the schemes of :mod:`.backends`): recognising, splitting,
and their local sub-cache path.

Kept apart from :mod:`.stores` (which brings thread pools and the fsspec glue) because the
runtime hook asks ``is_url`` of every JAX process's cache dir at start-up, where a local
directory must not pay for importing the bucket machinery: the registry (which imports no client)
is imported only for a text that looks like a URL.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
from types import ModuleType

from cachedoctor.errors import CachedoctorError

SUBCACHE_ROOT_ENV = "CACHEDOCTOR_XLA_SUBCACHE_ROOT"
DEFAULT_SUBCACHE_ROOT = "/tmp/cachedoctor-xla-subcaches"

_URL_RE = re.compile(r"^(?P<scheme>[a-z0-9]+)://(?P<bucket>[^/]+)(?:/(?P<prefix>.*))?$")


def _backends() -> ModuleType:
    """The registry of bucket schemes, imported when a text looks like a URL (``scheme://``):
    a local path, what a hooked JAX process mostly names, never imports it."""
    from cachedoctor.storage import backends

    return backends


def is_url(location: object) -> bool:
    """True for ``gs://…`` and ``s3://…`` (what JAX sends to etils.epath), False for paths."""
    if not isinstance(location, str):
        return False
    m = _URL_RE.match(location)
    return bool(m and _backends().is_scheme(m.group("scheme")))


def split_url(url: str) -> tuple[str, str, str]:
    """``gs://b/p/q/`` -> its scheme, bucket and prefix: ``gs``, ``b``, ``p/q``."""
    m = _URL_RE.match(url)
    backends = _backends()
    if not m or not backends.is_scheme(m.group("scheme")):
        named = backends.with_or([f"{b.scheme}://" for b in backends.schemes()])
        article = backends.schemes()[0].article
        raise CachedoctorError(f"not {article} {named} URL: {url}", slug="bad-url")
    return m.group("scheme"), m.group("bucket"), (m.group("prefix") or "").strip("/")


@functools.lru_cache(maxsize=16)
@functools.lru_cache(maxsize=16)  # asked on every lookup the hook answers, of one setting
def jax_spelling(cache_dir: str) -> str:
    """The cache dir as JAX spells the paths it builds under it.

    ``jax._src.compiler.get_compile_options`` puts ``str(Path(cache_dir) / name)`` into the
    compile options (``Path``: ``etils.epath`` when installed, else ``pathlib``), and jax <= 0.10
    hashes them into the key. Lexical only, as JAX is: a doubled slash, a ``.`` part and a
    trailing slash go; ``..``, a symbolic link and a relative spelling stay (no working directory
    is joined), so ``caches/sp``, ``caches/../caches/sp`` and ``/abs/caches/sp`` are three
    strings, three keys. A URL as epath spells it (``PurePath`` would make ``s3://b`` ``s3:/b``).
    """
    if is_url(cache_dir):
        scheme, bucket, prefix = split_url(cache_dir)
        parts = [p for p in prefix.split("/") if p and p != "."]
        return f"{scheme}://{bucket}" + "".join(f"/{p}" for p in parts)
    return str(pathlib.PurePath(cache_dir))


def jax_subpath(cache_dir: str, name: str) -> str:
    """``str(Path(cache_dir) / name)`` as JAX builds it: the string a stored option holds."""
    if is_url(cache_dir):
        return f"{jax_spelling(cache_dir)}/{name}"
    return str(pathlib.PurePath(cache_dir) / name)


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
