"""Key manifests: what went into each stable key, one small JSON file per cache entry.

Location: ``<cache dir>/cachedoctor-manifests/<key>.json`` where ``<key>`` is the name the entry is
stored under (the stable key in ``stable`` mode, JAX's key in ``observe`` mode). The optional
canonical module text (``record_ir``) sits beside it as ``<key>.mlir.gz``. JAX's LRU eviction only
looks at ``*-cache`` / ``*-atime`` files in the top directory, so it neither counts nor deletes
these.

Writes are atomic (unique temp file in the same directory, fsync, ``os.replace``), so any number of
processes and hosts may write at once: a reader sees a whole old file or a whole new one.

A ``gs://`` / ``s3://`` cache dir gets the same layout as objects
(``<url>/cachedoctor-manifests/<key>.json``): one PUT per manifest, which an object store
publishes whole or not at all, so no rename is needed. One store per process serves them all.
With ``create`` the write is create-only (a precondition on buckets, a hard link locally): of
several processes writing one key's manifest at once, the first one's stays and the others get
FileExistsError, so no manifest is torn, replaced or written twice.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import gzip
import json
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachedoctor.layout import MANIFEST_DIRNAME, MANIFEST_IR_SUFFIX, MANIFEST_SUFFIX
from cachedoctor.stablekeys.entry_files import shares_jax_filesystem
from cachedoctor.stablekeys.keys import CP_PREFIX, REPLAY_COMPONENT, KeyResult, replayed_key
from cachedoctor.stablekeys.manifest_folder import (
    local_manifest_keys,
    manifest_keys_of,
    open_manifest_folder,
)
from cachedoctor.stablekeys.splithash import HASHER_VERSION, combine
from cachedoctor.storage.files import open_regular
from cachedoctor.storage.location import Location

if TYPE_CHECKING:
    from cachedoctor.storage.stores import Store

SCHEMA_VERSION = 1
KEY_MODES = {
    "static": "no custom_partitioning call: the key is computed from the module",
    "replay": "custom_partitioning: reused only when the recorded partitioner calls reproduce",
    "declared": "custom_partitioning: keyed on the inputs its callbacks declare (depends_on)",
    "fallback": "a raw pointer stays in the key: never reused",
}


@dataclass(frozen=True)
class Manifest:
    """One key manifest (see the module docstring for where it lives)."""

    key: str  # the name the entry is stored under
    stable_key: str
    jax_key: str | None  # JAX's own key for the same compilation, when known
    mode: str  # "stable" or "observe"
    module_name: str
    hasher_version: int
    components: list[dict[str, Any]]  # [{"name", "digest", "data" (base64 or None)}] in order
    volatile: list[dict[str, Any]]  # [{"field", "raw", "canonical", "reason"}]
    sound: bool
    xla_flags: list[str]
    cache_dir: str | None
    versions: dict[str, str]  # jax, jaxlib, python, cachedoctor
    platform: dict[str, str]  # platform, platform_version
    created: float
    host: str
    pid: int
    migrated_from: str | None = None
    has_ir: bool = False
    schema_version: int = SCHEMA_VERSION
    # how the key was made (see KEY_MODES); for "replay", the key shared by every variant of the
    # module (``base_key``) and the partitioner calls XLA made, one list per replayed custom call
    key_mode: str = "static"
    base_key: str | None = None
    replay: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # the writing process in a jax.distributed job (JAX's process_id and num_processes), and the
    # autotune sub-cache mode its compile options carried ("UPDATE", "READ"; None: no sub-cache)
    process_index: int | None = None
    process_count: int | None = None
    autotune_mode: str | None = None
    # observe mode: whether JAX's own key (the one the entry is stored under) holds a
    # custom_partitioning pointer, i.e. JAX's pointer-removal flag was off (None: not recorded)
    jax_key_pointer: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self, component: str) -> str | None:
        """The recorded digest of one key component, or None where the key has none."""
        return next((c.get("digest") for c in self.components if c.get("name") == component), None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in known}
        return cls(**kwargs)


class ManifestError(ValueError):
    """A manifest file that cannot be read or does not verify."""


def manifest_dir(cache_dir: str | os.PathLike[str]) -> Path:
    """Folder that holds the manifests of a cache directory."""
    return Path(cache_dir) / MANIFEST_DIRNAME


def manifest_path(cache_dir: str | os.PathLike[str], key: str) -> Path:
    return manifest_dir(cache_dir) / f"{key}{MANIFEST_SUFFIX}"


# --- gs:// and s3:// cache dirs ----------------------------------------------------------------

_STORES: dict[str, Store] = {}
_STORES_LOCK = threading.Lock()


def _jax_filesystem(url: str) -> Any:
    """The fsspec filesystem JAX reaches ``url`` with, or None (JAX uses another backend)."""
    try:
        import fsspec
        from jax._src import path as jax_path

        fs = getattr(jax_path.Path(url), "_backend").fs(url)  # noqa: B009 - etils, untyped
        return fs if isinstance(fs, fsspec.AbstractFileSystem) else None
    except Exception:
        return None


def _store_for(where: Location) -> Store | None:
    """The process's one store for a bucket cache dir; None for a local directory."""
    url = where.url
    if url is None:
        return None
    from cachedoctor.storage import remote_store, retry, stores

    with _STORES_LOCK:
        if url not in _STORES:
            shared = _jax_filesystem(url) if shares_jax_filesystem() else None
            _STORES[url] = (
                stores.open_store(url)
                if shared is None
                else remote_store.RemoteStore(url, fs=shared, policy=retry.RetryPolicy(attempts=1))
            )
        return _STORES[url]


def store_for(where: Location) -> Store:
    """The process's one store for a bucket (the manifests', reused for the stats record)."""
    store = _store_for(where)
    if store is None:
        raise ValueError(f"not a gs:// or s3:// URL: {where}")
    return store


def _object(key: str, suffix: str = MANIFEST_SUFFIX) -> str:
    return f"{MANIFEST_DIRNAME}/{key}{suffix}"


def _read_object(store: Store, name: str) -> bytes | None:
    try:
        with store.open_read(name) as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def manifest_keys(cache_dir: Location) -> set[str]:
    """The keys that have a manifest: one listing of the manifests folder (empty: none yet)."""
    store = _store_for(cache_dir)
    if store is None:
        return local_manifest_keys(cache_dir.spelling)
    try:
        names = [i.name for i in store.list(MANIFEST_DIRNAME) if not i.is_dir]
    except (FileNotFoundError, NotADirectoryError):
        return set()
    return manifest_keys_of(names)


def read_manifests(cache_dir: Location, keys: Iterable[str]) -> list[Manifest]:
    """The manifests of ``keys`` (concurrent reads on a bucket); missing or unreadable skipped."""
    store = _store_for(cache_dir)

    def read(key: str) -> Manifest | None:
        try:
            return load_manifest(cache_dir, key)
        except (OSError, ManifestError):
            return None

    wanted = list(keys)
    found = store.map(read, wanted) if store is not None else [read(k) for k in wanted]
    return [m for m in found if m is not None]


def manifest_exists(cache_dir: Location, key: str) -> bool:
    """Whether ``key`` has a manifest (one metadata request on a bucket)."""
    store = _store_for(cache_dir)
    if store is not None:
        return store.stat(_object(key)) is not None
    return manifest_path(cache_dir.spelling, key).exists()


def from_key_result(
    result: KeyResult,
    *,
    mode: str,
    stored_under: str,
    jax_key: str | None,
    backend: Any = None,
    migrated_from: str | None = None,
    replay_digest: str | None = None,
    replay_calls: list[list[dict[str, Any]]] | None = None,
    process: tuple[int, int] | None = None,
    autotune_mode: str | None = None,
    jax_key_pointer: bool | None = None,
) -> Manifest:
    """Build a manifest from the hasher's result (done in the process that computed the key).

    With ``replay_calls`` (the calls recorded for ``result.to_replay``), the manifest is that of
    a replay-keyed variant: its components end with ``replay_digest``. ``process``: (index,
    count) of the writing process in a jax.distributed job.
    """
    import platform as _platform

    from cachedoctor._version import __version__

    versions = {"python": _platform.python_version(), "cachedoctor": __version__}
    try:
        import jax
        from jax._src.lib import version_str as jaxlib_version

        versions.update(jax=jax.__version__, jaxlib=str(jaxlib_version))
    except Exception:  # informative only
        pass
    plat = {}
    if backend is not None:
        plat = {
            "platform": str(getattr(backend, "platform", "")),
            "platform_version": str(getattr(backend, "platform_version", "")),
        }
    components = [
        {"name": n, "digest": d, "data": result.component_data.get(n)}
        for n, d in result.components.items()
    ]
    stable_key, base_key, replay = result.key, None, None
    if replay_calls is not None and replay_digest is not None:
        components.append({"name": REPLAY_COMPONENT, "digest": replay_digest, "data": None})
        stable_key, base_key = replayed_key(result, replay_digest), result.key
        replay = [
            {"index": i, "calls": calls}
            for (i, _), calls in zip(result.to_replay, replay_calls, strict=True)
        ]
    return Manifest(
        key=stored_under,
        stable_key=stable_key,
        jax_key=jax_key,
        mode=mode,
        module_name=result.module_name,
        hasher_version=HASHER_VERSION,
        components=components,
        volatile=[v._asdict() for v in result.volatile],
        sound=result.sound,
        xla_flags=list(result.xla_flags),
        cache_dir=result.cache_dir,
        versions=versions,
        platform=plat,
        created=time.time(),
        host=socket.gethostname(),
        pid=os.getpid(),
        migrated_from=migrated_from,
        has_ir=result.canonical_ir is not None,
        key_mode=_key_mode(result, replay),
        base_key=base_key,
        replay=replay,
        process_index=process[0] if process else None,
        process_count=process[1] if process else None,
        autotune_mode=autotune_mode,
        jax_key_pointer=jax_key_pointer,
    )


def _key_mode(result: KeyResult, replay: list[dict[str, Any]] | None) -> str:
    if not result.sound:
        return "fallback"
    if replay is not None or result.to_replay:
        return "replay"
    if any(v.canonical.startswith(CP_PREFIX) for v in result.volatile):
        return "declared"
    return "static"


def key_mode_reason(manifest: Manifest) -> str:
    """Why a manifest's key was made the way it was (one line, for scan/check/status)."""
    reasons = [v["reason"] for v in manifest.volatile if v.get("reason")]
    if manifest.key_mode == "fallback" and reasons:
        return "; ".join(reasons)
    if manifest.key_mode == "replay" and manifest.replay is not None:
        calls = sum(len(op["calls"]) for op in manifest.replay)
        return f"{calls} recorded partitioner call(s) in {len(manifest.replay)} custom call(s)"
    return KEY_MODES.get(manifest.key_mode, manifest.key_mode)


def key_mode_summary(manifests: Iterable[Manifest]) -> dict[str, Any]:
    """The modules keyed in each mode, and why each fallback fell back (for ``status``)."""
    modules: dict[str, set[str]] = {}
    fallbacks: dict[str, str] = {}
    for m in manifests:
        modules.setdefault(m.key_mode, set()).add(m.module_name)
        if m.key_mode == "fallback":
            fallbacks[m.module_name] = key_mode_reason(m)
    return {
        "modes": {mode: sorted(names) for mode, names in sorted(modules.items())},
        "fallbacks": dict(sorted(fallbacks.items())),
    }


def _atomic_write(cache_dir: str | os.PathLike[str], name: str, data: bytes, create: bool) -> None:
    """Write ``cachedoctor-manifests/<name>`` whole (``create``: only if absent, else
    FileExistsError); the folder is made when absent, and no link on the way is followed."""
    with open_manifest_folder(cache_dir, create=True) as folder:
        if create:
            if not folder.write_new(name, data, mode=0o644 & ~_umask()):
                raise FileExistsError(errno.EEXIST, "File exists", os.path.join(folder.path, name))
        else:
            folder.write_replacing(name, data, mode=0o644 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_manifest(
    cache_dir: Location,
    manifest: Manifest,
    *,
    ir_text: str | None = None,
    create: bool = False,
) -> Path | str:
    """Write (or replace) a manifest atomically; with ``ir_text``, its compressed module too.

    Returns the file's path, or its URL for a bucket cache dir. ``create``: only if the key
    has no manifest yet, else FileExistsError (see the module docstring); the module text goes
    first, so a reader that finds the manifest finds the text.
    """
    store = _store_for(cache_dir)
    path = manifest_path(cache_dir.spelling, manifest.key) if store is None else None
    if ir_text is not None:
        ir = gzip.compress(ir_text.encode(), 6)
        with contextlib.suppress(FileExistsError):  # a concurrent writer's text: the same module
            if store is not None:
                store.write_atomic(_object(manifest.key, MANIFEST_IR_SUFFIX), ir, create=create)
            else:
                _atomic_write(cache_dir.spelling, manifest.key + MANIFEST_IR_SUFFIX, ir, create)
        if not manifest.has_ir:
            manifest = Manifest.from_dict({**manifest.to_dict(), "has_ir": True})
    data = json.dumps(manifest.to_dict(), indent=1, sort_keys=True).encode() + b"\n"
    if store is not None:
        store.write_atomic(_object(manifest.key), data, create=create)
        return store.url_of(_object(manifest.key))
    assert path is not None
    _atomic_write(cache_dir.spelling, path.name, data, create)
    return path


def load_manifest(cache_dir: Location, key: str) -> Manifest | None:
    """The manifest of ``key`` (the stored entry name), or None when there is none.

    Raises :class:`ManifestError` when the file exists but cannot be parsed.
    """
    store = _store_for(cache_dir)
    if store is not None:
        found = _read_object(store, _object(key))
        return None if found is None else _parse(store.url_of(_object(key)), found)
    path = manifest_path(cache_dir.spelling, key)
    try:
        raw = _read_regular(cache_dir.spelling, path.name)
    except FileNotFoundError:
        return None
    return _parse(path, raw)


def _read_regular(cache_dir: str | os.PathLike[str], name: str) -> bytes:
    """A manifest's bytes; a FIFO or device named like one is refused, never waited on, and a
    link at the folder or the file is never followed (OSError)."""
    with open_manifest_folder(cache_dir) as folder, open_regular(name, dir_fd=folder.fd) as fh:
        return fh.read()


def _parse(path: Path | str, raw: bytes) -> Manifest:
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise ManifestError(f"{path}: unknown manifest schema {data.get('schema_version')!r}")
        return Manifest.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ManifestError(f"{path}: not a cachedoctor manifest: {exc}") from exc


def iter_manifests(cache_dir: Location) -> Iterator[Manifest]:
    """All readable manifests of a cache directory, sorted by key; unreadable ones are skipped."""
    store = _store_for(cache_dir)
    if store is not None:
        yield from _iter_objects(store)
        return
    try:
        with open_manifest_folder(cache_dir.spelling) as folder:
            names = folder.listdir()
    except OSError:  # none, or a link or a file where the folder should be: nothing of ours
        return
    folder_path = manifest_dir(cache_dir.spelling)
    for name in names:
        if name.startswith(".") or not name.endswith(MANIFEST_SUFFIX):
            continue
        try:
            yield _parse(folder_path / name, _read_regular(cache_dir.spelling, name))
        except (OSError, ManifestError):
            continue


def _iter_objects(store: Store) -> Iterator[Manifest]:
    """A bucket's manifests: one listing, then the objects read concurrently."""
    try:
        items = store.list(MANIFEST_DIRNAME)
    except FileNotFoundError:
        return
    names = [
        _object(i.name.removesuffix(MANIFEST_SUFFIX))
        for i in items
        if i.name.endswith(MANIFEST_SUFFIX) and not i.name.startswith(".") and not i.is_dir
    ]

    def read(name: str) -> Manifest | None:
        try:
            raw = _read_object(store, name)
            return None if raw is None else _parse(store.url_of(name), raw)
        except (OSError, ManifestError):
            return None

    for found in store.map(read, names):
        if found is not None:
            yield found


def load_ir(cache_dir: Location, key: str) -> str | None:
    """The canonical module text recorded with ``record_ir``, or None."""
    store = _store_for(cache_dir)
    if store is not None:
        raw = _read_object(store, _object(key, MANIFEST_IR_SUFFIX))
        return None if raw is None else gzip.decompress(raw).decode()
    try:
        data = _read_regular(cache_dir.spelling, key + MANIFEST_IR_SUFFIX)
    except FileNotFoundError:
        return None
    return gzip.decompress(data).decode()


def verify_components(manifest: Manifest) -> list[str]:
    """Problems found re-hashing the recorded component bytes (empty when all digests match)."""
    import hashlib

    problems = []
    for comp in manifest.components:
        if comp.get("data") is None:
            continue
        digest = hashlib.sha256(base64.b64decode(comp["data"])).hexdigest()
        if digest != comp["digest"]:
            problems.append(f"component {comp['name']!r}: recorded bytes do not match its digest")
    return problems


def recompute_key(manifest: Manifest, *, hasher_version: int | None = None) -> str:
    """The stable key for a manifest, recomputed offline with the same hasher.

    With ``hasher_version`` (default: the manifest's), computes what that version of the
    combination step gives; raises :class:`ManifestError` when recorded bytes do not verify.
    """
    problems = verify_components(manifest)
    if problems:
        raise ManifestError("; ".join(problems))
    version = manifest.hasher_version if hasher_version is None else hasher_version
    pairs = [(c["name"], c["digest"]) for c in manifest.components]
    return f"{manifest.module_name}-{combine(pairs, version)}"
