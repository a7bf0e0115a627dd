"""JAX's own key code, run with a hash that keeps one digest per component.

JAX's ``cache_key.get`` feeds every component of a key into one SHA-256. Here the same code
(the installed JAX's, rebound once and kept while JAX's functions stay the same) hashes into a
:class:`_SplitHash` instead: one digest per component, and the stable digest (:func:`combine`)
over them. :mod:`.keys` builds the stable key on it; ``misskeys`` and ``here`` read a key's
components with it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from typing import Any

HASHER_VERSION = 2  # 2: custom_partitioning keyed by replay (1: static fingerprints)
_RAW_COMPONENT_LIMIT = 1 << 20  # keep raw bytes of small components (not the module) in manifests
CHUNK_LIMIT = 1 << 16  # a missed key's record keeps the hashed pieces of components this small


class InternalsChanged(Exception):
    """The installed JAX does not look like the versions this hasher was written against."""


def combine(components: Sequence[tuple[str, str]], hasher_version: int = HASHER_VERSION) -> str:
    """The stable digest (64 hex) from ``(component name, hex digest)`` pairs."""
    h = hashlib.sha256(f"cachedoctor-stable-key\x00v{hasher_version}\x00".encode())
    for name, digest in components:
        h.update(name.encode() + b"\x00" + bytes.fromhex(digest))
    return h.hexdigest()


class _SplitHash:
    """Stands in for ``hashlib.sha256()`` inside JAX's ``cache_key.get``: one digest per part.

    JAX's updates and its per-component log calls only note the pieces (references: JAX hashes
    ``bytes``) and where each component ends; the components' digests are made in one loop when
    JAX asks for its digest. What a hit never needs is made only when asked for: JAX's own
    running digest (:meth:`total_hexdigest`), the small components' base64 text (manifests) and
    piece lists (a missed key's record). (A live lookup's every instruction runs with JAX's
    work between them, a few times slower than in a loop: the fewer per update, the better.)"""

    __slots__ = ("_components", "_ends", "_pieces")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []  # every piece hashed, in order
        self._ends: list[tuple[str, int]] = []  # (component, pieces hashed when it ended)
        self._components: list[tuple[str, str]] | None = None

    def update(self, data: bytes) -> None:
        self._pieces.append(data if type(data) is bytes else bytes(data))

    def mark(self, name: str, hashfn: object = None) -> None:
        """The end of component ``name`` (JAX's ``_log_cache_key_hash(hash_obj, name, fn)``)."""
        self._ends.append((name, len(self._pieces)))

    def _segments(self) -> Iterator[tuple[str, list[bytes]]]:
        pieces, start = self._pieces, 0
        for name, end in self._ends:
            yield name, pieces[start:end]
            start = end

    @property
    def components(self) -> list[tuple[str, str]]:
        """(component name, hex SHA-256 of its pieces), in JAX's order."""
        found = self._components
        if found is None:
            found = []
            for name, segment in self._segments():
                h = hashlib.sha256()
                for data in segment:
                    h.update(data)
                found.append((name, h.hexdigest()))
            self._components = found
        return found

    @property
    def computation(self) -> bytes | None:
        """The module's bytes, when JAX hashed them in one piece."""
        for name, segment in self._segments():
            if name == "computation":
                return segment[0] if len(segment) == 1 else None
        return None

    @property
    def pieces(self) -> dict[str, list[bytes]]:
        """Each update() of the components up to 1 MiB but the computation, in order."""
        return {
            name: segment
            for name, segment in self._segments()
            if name != "computation" and sum(map(len, segment)) <= _RAW_COMPONENT_LIMIT
        }

    def total_hexdigest(self) -> str:
        """JAX's own digest: one SHA-256 over everything hashed, in order."""
        total = hashlib.sha256()
        for data in self._pieces:
            total.update(data)
        return total.hexdigest()

    @property
    def chunks(self) -> dict[str, list[bytes]]:
        """Component name -> each piece hashed, for components under :data:`CHUNK_LIMIT`."""
        return component_chunks(self.pieces)

    def digest(self) -> bytes:
        return bytes.fromhex(combine(self.components))


def component_data(pieces: dict[str, list[bytes]]) -> dict[str, str]:
    return {name: base64.b64encode(b"".join(p)).decode() for name, p in pieces.items()}


def component_chunks(pieces: dict[str, list[bytes]]) -> dict[str, list[bytes]]:
    return {name: list(p) for name, p in pieces.items() if sum(map(len, p)) <= CHUNK_LIMIT}


class _ModuleProxy:
    """A module stand-in that overrides a few attributes and forwards the rest."""

    def __init__(self, real: types.ModuleType, **overrides: Any) -> None:
        self._real = real
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _rebind(fn: Any, new_globals: dict[str, Any]) -> Any:
    clone = types.FunctionType(
        fn.__code__, new_globals, fn.__name__, fn.__defaults__, fn.__closure__
    )
    clone.__kwdefaults__ = fn.__kwdefaults__
    return clone


def jax_module(name: str) -> Any:
    """``jax._src.<name>``, from ``sys.modules`` once imported: the hook asks on every lookup,
    and an import statement in a function calls into importlib each time."""
    module = sys.modules.get(f"jax._src.{name}")
    if module is None:
        module = importlib.import_module(f"jax._src.{name}")
    return module


def jax_get_cache_key() -> Any:
    """JAX's own ``compilation_cache.get_cache_key``, even while the hook has wrapped it."""
    fn = jax_module("compilation_cache").get_cache_key
    return getattr(fn, "__cachedoctor_original__", fn)


def jax_cache_key_get() -> Any:
    """JAX's own ``cache_key.get``, even while the stats recorder has wrapped it
    (:mod:`.misskeys`)."""
    fn = jax_module("cache_key").get
    return getattr(fn, "__cachedoctor_misskeys_original__", fn)


_checked: set[tuple[int, int]] = set()


def check_internals() -> None:
    """Raise :class:`InternalsChanged` unless JAX's key code has the shape we rely on.

    The result is remembered per pair of JAX functions, so the per-compile cost is a lookup.
    """
    try:
        ident = (id(jax_cache_key_get()), id(jax_get_cache_key()))
    except Exception:  # pragma: no cover - reported by the full check below
        ident = (0, 0)
    if ident in _checked:
        return
    _check_internals()
    _checked.add(ident)


def _check_internals() -> None:
    try:
        from jax._src import cache_key  # noqa: F401 - JAX's key module must import
        from jax._src import custom_partitioning as cp
    except Exception as exc:  # pragma: no cover - depends on the installed jax
        raise InternalsChanged(f"cannot import JAX's key modules: {exc}") from exc
    names = getattr(getattr(jax_cache_key_get(), "__code__", None), "co_names", ())
    if "hashlib" not in names or "_log_cache_key_hash" not in names:
        raise InternalsChanged("jax._src.cache_key.get no longer hashes through hashlib.sha256")
    get_cache_key = jax_get_cache_key()
    if "cache_key" not in getattr(getattr(get_cache_key, "__code__", None), "co_names", ()):
        raise InternalsChanged("compilation_cache.get_cache_key no longer calls cache_key.get")
    import inspect

    params = list(inspect.signature(get_cache_key).parameters)
    if params[:4] != ["module", "devices", "compile_options", "backend"] or len(params) != 5:
        raise InternalsChanged(f"unexpected get_cache_key signature {params}")
    if not hasattr(cp, "_sharding_callbacks"):
        raise InternalsChanged("jax._src.custom_partitioning._sharding_callbacks is gone")


# -- the rebound functions, kept: a hit's key rebinds nothing -----------------------------------

_local = threading.local()  # .split: the _SplitHash the kept functions last hashed into


def _thread_sha256() -> _SplitHash:
    split = _SplitHash()
    _local.split = split
    return split


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """The names a function's code may read as globals: its own and its nested functions'."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_global_names(const))
    return tuple(sorted(names))


def _identities(namespace: dict[str, Any], names: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(map(id, map(namespace.get, names)))


# (cache_key.get, get_cache_key, the names each reads, their objects' ids, the rebound function)
_KEPT: list[Any] = [None]


def _kept_functions() -> tuple[Any, Any]:
    """JAX's ``cache_key.get`` and ``get_cache_key``, rebound so that ``cache_key.get`` hashes
    into this thread's :class:`_SplitHash`.

    They are kept while JAX's two functions, and every global their code reads, are the objects
    they were rebound from (checked on each call by identity): a program that replaces one
    (JAX's own tests do) gets them rebound afresh, and the key follows. JAX's internals are
    checked whenever they are rebound."""
    ck = jax_module("cache_key")
    get, original = jax_cache_key_get(), jax_get_cache_key()
    kept = _KEPT[0]
    if (
        kept is None
        or kept[0] is not get
        or kept[1] is not original
        or kept[4] != _identities(ck.__dict__, kept[2])
        or kept[5] != _identities(original.__globals__, kept[3])
    ):
        check_internals()  # new functions: their shape is checked before they are rebound
        get_globals = dict(ck.__dict__)
        get_globals["hashlib"] = types.SimpleNamespace(sha256=_thread_sha256)
        get_globals["_log_cache_key_hash"] = _SplitHash.mark
        rebound_get = _rebind(get, get_globals)
        cc_globals = dict(original.__globals__)
        cc_globals["cache_key"] = _ModuleProxy(ck, get=rebound_get)
        get_names, cc_names = _global_names(get.__code__), _global_names(original.__code__)
        kept = _KEPT[0] = (
            get,
            original,
            get_names,
            cc_names,
            _identities(ck.__dict__, get_names),
            _identities(original.__globals__, cc_names),
            rebound_get,
            _rebind(original, cc_globals),
        )
    return kept[6], kept[7]


def _split_by(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, _SplitHash]:
    """``fn``'s key and the split hash it hashed into, on this thread."""
    _local.split = None
    try:
        key = fn(*args, **kwargs)
        split: _SplitHash | None = _local.split
    finally:
        _local.split = None
    if split is None or not split._ends:
        raise InternalsChanged("cache_key.get did not hash through the recording hash")
    return str(key), split


def jax_key(module: Any, devices: Any, options: Any, backend: Any) -> tuple[str, _SplitHash]:
    """JAX's ``compilation_cache.get_cache_key`` on these inputs, hashed into a split hash: the
    stable key (the split hash's digest) and the split hash."""
    return _split_by(_kept_functions()[1], module, devices, options, backend)


def jax_key_components(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, _SplitHash]:
    """JAX's own key for ``cache_key.get(*args, **kwargs)`` (its running digest over every
    component) and the split hash, computed by JAX's code."""
    combined, split = _split_by(_kept_functions()[0], *args, **kwargs)
    return f"{combined.rsplit('-', 1)[0]}-{split.total_hexdigest()}", split
