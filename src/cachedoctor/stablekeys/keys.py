"""The stable cache-key hasher: JAX's own key, minus the parts that change from run to run.

This is the one implementation of the stable key; the hook, the manifests and every offline
command use it. It runs JAX's own key code (``compilation_cache.get_cache_key`` and
``cache_key.get`` of the installed version, so a JAX upgrade keeps JAX's semantics) on
canonicalised inputs, with exactly three canonicalisations:

1. each ``CustomSPMDPartitioning`` custom call's ``backend_config`` (``str(id(obj))``) becomes a
   placeholder: the hook then picks the key by replaying recorded partitioner calls
   (:mod:`.replay`, :func:`replayed_key`); with no callbacks registered the pointer stays (a miss,
   never a wrong hit);
2. compile-option paths derived from the cache directory (the per-fusion autotune dir and the
   kernel cache file) become relative to the cache directory;
3. each Pallas TPU kernel (a ``tpu_custom_call``) has its Mosaic body's debug information
   stripped, exactly as jax 0.11 does before hashing (``_strip_mosaic_debug_info``): up to jax
   0.10 the body's source paths and line numbers are in the key, so the same kernel run from
   another folder, or a line lower, never hits. Where JAX strips them itself, nothing is done
   here; where it cannot be done (no Mosaic dialect, a body that does not parse),
   :class:`KernelsNotStripped` makes the hook keep JAX's own key and say so.

JAX feeds every key component into one SHA-256. We run the same code with a recording hash that
keeps one digest per component; the stable digest is a SHA-256 over the hasher version and those
component digests. That is what lets :func:`combine` recompute a key from a manifest offline.
Keys keep JAX's format ``<module>-<64 hex>``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachedoctor.stablekeys import replay

HASHER_VERSION = 2  # 2: custom_partitioning keyed by replay (1: static fingerprints)
CACHE_DIR_PLACEHOLDER = "<cachedoctor:cache_dir>"
CP_TARGET = "CustomSPMDPartitioning"
CP_PREFIX = f"cachedoctor-cp-v{HASHER_VERSION}:"
CP_REPLAY = CP_PREFIX + "replay"  # the key is decided by replaying the recorded calls
REPLAY_COMPONENT = "custom_partitioning_replay"  # the digest that tells replayed entries apart
# DebugOptions fields that JAX fills with paths under the cache directory.
CACHE_DIR_FIELDS = ("xla_gpu_per_fusion_autotune_cache_dir", "xla_gpu_kernel_cache_file")
_RAW_COMPONENT_LIMIT = 1 << 20  # keep raw bytes of small components (not the module) in manifests
CHUNK_LIMIT = 1 << 16  # a missed key's record keeps the hashed pieces of components this small


class InternalsChanged(Exception):
    """The installed JAX does not look like the versions this hasher was written against."""


class KernelsNotStripped(InternalsChanged):
    """A Pallas TPU kernel's debug information could not be stripped (canonicalisation 3)."""


@dataclass(frozen=True)
class VolatileField:
    """A value that differs between processes or machines, and what the hasher did with it."""

    field: str
    raw: str
    canonical: str
    reason: str | None = None  # set when the value could not be canonicalised (kept raw)


@dataclass
class KeyResult:
    """Everything the hasher learnt while computing one stable key."""

    key: str
    module_name: str
    components: dict[str, str]  # component name -> hex digest, in JAX's hashing order
    jax_equivalent_key: str  # JAX's formula over the canonical inputs
    volatile: list[VolatileField] = field(default_factory=list)
    canonical_ir: str | None = None
    xla_flags: list[str] = field(default_factory=list)
    cache_dir: str | None = None
    # (index, pointer) of the custom_partitioning calls whose key the hook decides by replay;
    # ``key`` is then the base key that the replayed entries share
    to_replay: list[tuple[int, bytes]] = field(default_factory=list)
    # component name -> each piece hashed, for the small components (up to 1 MiB)
    component_pieces: dict[str, list[bytes]] = field(default_factory=dict)

    @property
    def component_data(self) -> dict[str, str]:
        """Component name -> base64 of the hashed bytes (small ones): what manifests keep."""
        return component_data(self.component_pieces)

    @property
    def component_chunks(self) -> dict[str, list[bytes]]:
        """Component name -> each piece hashed, for components under CHUNK_LIMIT bytes: what a
        missed key's record keeps."""
        return component_chunks(self.component_pieces)

    @property
    def changed(self) -> bool:
        """Whether a canonicalisation changed the inputs (so JAX's own key differs from ours)."""
        return any(v.canonical != v.raw for v in self.volatile)

    @property
    def sound(self) -> bool:
        """False when some volatile value had to be kept raw (the key will not be reused)."""
        return all(v.reason is None for v in self.volatile)


def combine(components: Sequence[tuple[str, str]], hasher_version: int = HASHER_VERSION) -> str:
    """The stable digest (64 hex) from ``(component name, hex digest)`` pairs."""
    h = hashlib.sha256(f"cachedoctor-stable-key\x00v{hasher_version}\x00".encode())
    for name, digest in components:
        h.update(name.encode() + b"\x00" + bytes.fromhex(digest))
    return h.hexdigest()


def replayed_key(result: KeyResult, replay_digest: str) -> str:
    """The key of one replay-verified variant of a module: the base key's components plus
    :data:`REPLAY_COMPONENT` (so :func:`combine` recomputes it from the manifest offline)."""
    pairs = [*result.components.items(), (REPLAY_COMPONENT, replay_digest)]
    return f"{result.module_name}-{combine(pairs)}"


class _SplitHash:
    """Stands in for ``hashlib.sha256()`` inside JAX's ``cache_key.get``: one digest per part.

    The hashed pieces of the small components are kept as they came; their base64 text
    (manifests) and piece lists (a missed key's record) are made only when asked for, which a
    hit never does."""

    def __init__(self) -> None:
        self.total = hashlib.sha256()
        self._cur = hashlib.sha256()
        self._raw: list[bytes] = []
        self._raw_len = 0
        self.components: list[tuple[str, str]] = []
        self.pieces: dict[str, list[bytes]] = {}  # each update() of a small component, in order

    def update(self, data: bytes) -> None:
        self.total.update(data)
        self._cur.update(data)
        self._raw_len += len(data)
        if self._raw_len <= _RAW_COMPONENT_LIMIT:
            self._raw.append(bytes(data))

    def mark(self, name: str) -> None:
        self.components.append((name, self._cur.hexdigest()))
        if name != "computation" and self._raw_len <= _RAW_COMPONENT_LIMIT:
            self.pieces[name] = self._raw
        self._cur, self._raw, self._raw_len = hashlib.sha256(), [], 0

    @property
    def data(self) -> dict[str, str]:
        """Component name -> base64 of its hashed bytes, for components up to 1 MiB."""
        return component_data(self.pieces)

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


def jax_get_cache_key() -> Any:
    """JAX's own ``compilation_cache.get_cache_key``, even while the hook has wrapped it."""
    from jax._src import compilation_cache as cc

    fn = cc.get_cache_key
    return getattr(fn, "__cachedoctor_original__", fn)


def jax_cache_key_get() -> Any:
    """JAX's own ``cache_key.get``, even while the stats recorder has wrapped it
    (:mod:`.misskeys`)."""
    from jax._src import cache_key as ck

    fn = ck.get
    return getattr(fn, "__cachedoctor_misskeys_original__", fn)


def jax_key_components(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, _SplitHash]:
    """JAX's own key for ``cache_key.get(*args, **kwargs)``, computed by JAX's code with a hash
    that keeps one digest (and the hashed pieces of the small ones) per component."""
    from jax._src import cache_key as ck

    holder: dict[str, _SplitHash] = {}

    def sha256() -> _SplitHash:
        holder["hash"] = split = _SplitHash()
        return split

    get_globals = dict(ck.__dict__)
    get_globals["hashlib"] = types.SimpleNamespace(sha256=sha256)
    get_globals["_log_cache_key_hash"] = lambda hash_obj, name, hashfn: hash_obj.mark(name)
    combined = str(_rebind(jax_cache_key_get(), get_globals)(*args, **kwargs))
    if "hash" not in holder:
        raise InternalsChanged("cache_key.get did not hash through the recording hash")
    split = holder["hash"]  # its digest() is the stable combination: JAX's is the running total
    return f"{combined.rsplit('-', 1)[0]}-{split.total.hexdigest()}", split


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


def recording_get_cache_key() -> tuple[Any, dict[str, Any]]:
    """JAX's ``compilation_cache.get_cache_key``, rebound so that its key's components are kept:
    after a call, ``holder["hash"]`` is the :class:`_SplitHash` it hashed into."""
    return _jax_key_functions()


def _jax_key_functions() -> tuple[Any, dict[str, Any]]:
    """JAX's ``get_cache_key`` rebound so that ``cache_key.get`` hashes into a ``_SplitHash``.

    Rebound on every call, from JAX's module globals as they are then: a program (JAX's own
    tests do) may replace a function of ``cache_key`` at any time, and the key must follow."""
    from jax._src import cache_key as ck

    holder: dict[str, Any] = {}

    def sha256() -> _SplitHash:
        split = _SplitHash()
        holder["hash"] = split
        return split

    get_globals = dict(ck.__dict__)
    get_globals["hashlib"] = types.SimpleNamespace(sha256=sha256)
    get_globals["_log_cache_key_hash"] = lambda hash_obj, name, hashfn: hash_obj.mark(name)
    get = _rebind(jax_cache_key_get(), get_globals)
    original = jax_get_cache_key()
    cc_globals = dict(original.__globals__)
    cc_globals["cache_key"] = _ModuleProxy(ck, get=get)
    return _rebind(original, cc_globals), holder


# -- canonicalisation 1: custom_partitioning backend_config ------------------------------------


def _custom_calls(module: Any, target: str) -> list[Any]:
    """The module's ``stablehlo.custom_call`` ops calling ``target``, in walk order."""
    return _custom_calls_of(module, (target,))[target]


def _custom_calls_of(module: Any, targets: tuple[str, ...]) -> dict[str, list[Any]]:
    """The module's ``stablehlo.custom_call`` ops calling each of ``targets``, in walk order,
    found in one walk (a Python call per op: the hook walks every module it keys)."""
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    found: dict[str, list[Any]] = {t: [] for t in targets}
    advance = ir.WalkResult.ADVANCE

    def visit(op: Any) -> Any:
        if op.name == "stablehlo.custom_call":
            attributes = op.attributes
            if "call_target_name" in attributes:
                calls = found.get(ir.StringAttr(attributes["call_target_name"]).value)
                if calls is not None:
                    calls.append(op)
        return advance

    module.operation.walk(visit)
    return found


def _custom_partitioning_ops(module: Any) -> list[Any]:
    return _custom_calls(module, CP_TARGET)


def _clone(module: Any) -> Any:
    try:
        return module.operation.clone(ip=False)
    except TypeError:  # jax < 0.12 bindings take no ip argument
        return module.operation.clone()


def canonical_module(module: Any) -> tuple[Any, list[VolatileField], list[tuple[int, bytes]]]:
    """The module with each custom_partitioning pointer replaced by a placeholder.

    The placeholder is :data:`CP_REPLAY` (the hook decides the key by replay) or, for callbacks
    declared with :func:`.replay.depends_on`, the digest of the declared inputs. Also returns
    ``(index, pointer)`` of the custom calls to replay. The original module comes back untouched
    when it has no such call (the common case).
    """
    from jax._src import custom_partitioning as cp
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    with module.context:
        calls = _custom_calls_of(module, (CP_TARGET, MOSAIC_TARGET))
        strip_kernels = bool(calls[MOSAIC_TARGET]) and not jax_strips_kernels()
        if not calls[CP_TARGET] and not strip_kernels:
            return module, [], []
        clone = _clone(module)
        clone_module = getattr(clone, "opview", clone)
        holder = types.SimpleNamespace(operation=clone)
        volatile: list[VolatileField] = []
        to_replay: list[tuple[int, bytes]] = []
        if strip_kernels:
            volatile += _strip_kernels(holder, module.context)
        for i, op in enumerate(_custom_partitioning_ops(holder)):
            raw = ir.StringAttr(op.attributes["backend_config"]).value
            info = cp._sharding_callbacks.get(raw.encode())
            name = f"custom_call[{i}].backend_config"
            if info is None:
                volatile.append(VolatileField(name, raw, raw, "no callbacks registered"))
                continue
            try:
                declared = replay.declared_inputs(info)
            except Exception as exc:  # the declared inputs cannot be read: keep the pointer
                reason = f"depends_on raised {type(exc).__name__}: {exc}"
                volatile.append(VolatileField(name, raw, raw, reason))
                continue
            if declared is None:
                canonical = CP_REPLAY
                to_replay.append((i, raw.encode()))
            else:
                canonical = f"{CP_PREFIX}declared:{declared}"
            op.attributes["backend_config"] = ir.StringAttr.get(canonical)
            volatile.append(VolatileField(name, raw, canonical))
        return clone_module, volatile, to_replay


# -- canonicalisation 3: Mosaic kernels' debug information -------------------------------------

MOSAIC_TARGET = "tpu_custom_call"


def jax_strips_kernels() -> bool:
    """Whether the installed JAX strips Mosaic debug information before hashing (0.11 on)."""
    from jax._src import cache_key as ck

    return hasattr(ck, "_strip_mosaic_debug_info")


def _mosaic_ops(module: Any) -> list[Any]:
    return _custom_calls(module, MOSAIC_TARGET)


def _strip_kernels(module: Any, context: Any) -> list[VolatileField]:
    """Strip each Mosaic kernel's debug information in place, as ``cache_key.
    _strip_mosaic_debug_info`` does: locations unzipped into the config (``debug_locations``,
    jax 0.12) are dropped; else the body is parsed in the module's context with the TPU
    dialect, ``strip-debuginfo`` runs, its bytecode is written again (jax 0.11); the config is
    then re-serialised as compact JSON. Raises KernelsNotStripped where it cannot."""
    import io
    import json

    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]
    from jax._src.lib.mlir import passmanager as pm  # type: ignore[attr-defined]

    try:
        from jax._src.lib import tpu  # type: ignore[attr-defined]

        register = tpu.register_dialect
    except (ImportError, AttributeError) as exc:
        raise KernelsNotStripped(f"no Mosaic TPU dialect in this jaxlib: {exc}") from exc
    volatile = []
    before = context.allow_unregistered_dialects
    try:
        register(context)
        context.allow_unregistered_dialects = True
        for i, op in enumerate(_mosaic_ops(module)):
            raw = ir.StringAttr(op.attributes["backend_config"]).value
            try:
                config = json.loads(raw)
                kernel_config = config["custom_call_config"]
                body = kernel_config.get("body")
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise KernelsNotStripped(f"kernel {i}: its config is not JSON: {exc}") from exc
            if "debug_locations" in kernel_config:  # unzipped from the body (jax 0.12 on)
                del kernel_config["debug_locations"]
                canonical = json.dumps(config, separators=(",", ":"))
                op.attributes["backend_config"] = ir.StringAttr.get(canonical)
                digest = hashlib.sha256(canonical.encode()).hexdigest()
                volatile.append(
                    VolatileField(f"tpu_custom_call[{i}].body", raw, f"stripped:{digest}")
                )
                continue
            if not body:
                continue
            try:
                kernel = ir.Module.parse(base64.b64decode(body), context=context)
                pm.PassManager.parse("builtin.module(strip-debuginfo)").run(kernel.operation)
            except Exception as exc:  # ir.MLIRError, or a bytecode this jaxlib does not read
                said = " ".join(str(exc).split())  # MLIR's diagnostics span lines: one line
                raise KernelsNotStripped(f"kernel {i} does not parse: {said[:200]}") from exc
            out = io.BytesIO()
            kernel.operation.write_bytecode(out)
            config["custom_call_config"]["body"] = base64.b64encode(out.getvalue()).decode()
            canonical = json.dumps(config, separators=(",", ":"))
            op.attributes["backend_config"] = ir.StringAttr.get(canonical)
            digest = hashlib.sha256(out.getvalue()).hexdigest()
            volatile.append(VolatileField(f"tpu_custom_call[{i}].body", raw, f"stripped:{digest}"))
    finally:
        context.allow_unregistered_dialects = before
    return volatile


# -- canonicalisation 2: cache-dir-derived paths ------------------------------------------------


def canonical_path(value: str, cache_dir: str | None) -> str:
    """``value`` with a leading cache directory replaced by :data:`CACHE_DIR_PLACEHOLDER`."""
    if not cache_dir or not value:
        return value
    from cachedoctor.storage.urls import jax_spelling

    base = jax_spelling(cache_dir)
    if value == base or value.startswith(base.rstrip("/") + "/"):
        return CACHE_DIR_PLACEHOLDER + value[len(base) :]
    return value


@contextlib.contextmanager
def canonical_options(options: Any, cache_dir: str | None) -> Iterator[list[VolatileField]]:
    """Within the block, ``options`` has its cache-dir paths made relative; restored on exit.

    The fields are set on ``options`` itself rather than on a copy: a copy (a protobuf
    round trip) cost about a quarter of JAX's whole key, on every lookup, since jax <= 0.10
    puts the autotune path into every compile's options. That is safe because JAX builds the
    options anew for each compile and hands them to the compiler only after the key is
    computed; ``cache_key.get`` copies them itself before hashing.
    """
    debug = options.executable_build_options.debug_options
    changes = []
    for name in CACHE_DIR_FIELDS:
        value = getattr(debug, name, None)
        if isinstance(value, str) and value:
            canonical = canonical_path(value, cache_dir)
            if canonical != value:
                changes.append((name, value, canonical))
    try:
        for name, _, canonical in changes:
            setattr(debug, name, canonical)
        yield [VolatileField(f"debug_options.{n}", v, c) for n, v, c in changes]
    finally:
        for name, value, _ in changes:
            setattr(debug, name, value)


def hashed_xla_flags() -> list[str]:
    """The XLA flags JAX hashes into the key (same sources and exclusions as JAX); worked out
    again only when one of its sources changed since the last lookup."""
    from jax._src import cache_key as ck

    sources = (
        os.environ.get("XLA_FLAGS", ""),
        os.environ.get("LIBTPU_INIT_ARGS", ""),
        tuple(sys.argv),
        tuple(ck.get_flag_prefixes()),
        tuple(ck.xla_flags_to_exclude_from_cache_key),
    )
    if _flags_memo.get("sources") != sources:
        xla, libtpu, argv, prefixes, excluded = sources
        flags = [*xla.split(), *libtpu.split()]
        flags.extend(
            a for a in argv if a.startswith("--xla") or (prefixes and a.startswith(prefixes))
        )
        exclude = set(excluded)
        _flags_memo.update(
            sources=sources, flags=[f for f in sorted(flags) if f.split("=")[0] not in exclude]
        )
    return list(_flags_memo["flags"])


_flags_memo: dict[str, Any] = {}


def _module_name(module: Any) -> str:
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    return str(ir.StringAttr(module.operation.attributes["sym_name"]).value)


def module_text(module: Any) -> str:
    """Canonical text of a module, without debug locations (what ``record_ir`` stores)."""
    with module.context:
        try:
            return str(module.operation.get_asm(enable_debug_info=False))
        except TypeError:  # pragma: no cover - very old bindings
            return str(module)


def stable_key(
    module: Any,
    devices: Any,
    compile_options: Any,
    backend: Any,
    *,
    cache_dir: str | None = None,
    record_ir: bool = False,
) -> KeyResult:
    """Compute the stable key of one compilation (same arguments as JAX's ``get_cache_key``).

    ``cache_dir`` defaults to ``jax_compilation_cache_dir``. Raises :class:`InternalsChanged`
    when JAX's key code is not what this hasher expects.
    """
    check_internals()
    if cache_dir is None:
        from jax._src import config

        cache_dir = config.compilation_cache_dir.value
    canon_module, volatile, to_replay = canonical_module(module)
    get_cache_key, holder = _jax_key_functions()
    with canonical_options(compile_options, cache_dir) as opt_volatile:
        key = get_cache_key(canon_module, devices, compile_options, backend)
    split: _SplitHash | None = holder.get("hash")
    if split is None or not split.components:
        raise InternalsChanged("cache_key.get did not hash through the recording hash")
    module_name = key.rsplit("-", 1)[0]
    return KeyResult(
        key=key,
        module_name=module_name,
        components=dict(split.components),
        component_pieces=split.pieces,
        jax_equivalent_key=f"{module_name}-{split.total.hexdigest()}",
        volatile=volatile + opt_volatile,
        canonical_ir=module_text(canon_module) if record_ir else None,
        xla_flags=hashed_xla_flags(),
        cache_dir=cache_dir,
        to_replay=to_replay,
    )
