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
   stripped, exactly as jax 0.11 does before hashing
   (``_strip_mosaic_debug_info``): up to jax 0.10 the body's source paths and line numbers are
   in the key, so the same kernel run from another folder, or a line lower, never hits. Where
   JAX strips them itself, nothing is done here; where it cannot be done (no Mosaic dialect, a
   body that does not parse), :class:`KernelsNotStripped` makes the hook keep JAX's own key and
   say so.

JAX feeds every key component into one SHA-256. We run the same code with a recording hash that
keeps one digest per component; the stable digest is a SHA-256 over the hasher version and those
component digests. That is what lets :func:`combine` recompute a key from a manifest offline.
Keys keep JAX's format ``<module>-<64 hex>``. A module is walked for those custom calls only
when the bytecode JAX hashed names one (:func:`stable_key`): a hit on a plain module costs JAX's
own key code and a few digests.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import types
from typing import Any, NamedTuple

from cachedoctor.stablekeys import replay
from cachedoctor.stablekeys.splithash import (
    HASHER_VERSION,
    InternalsChanged,
    _SplitHash,
    combine,
    component_chunks,
    component_data,
    jax_key,
    jax_module,
)
from cachedoctor.storage.urls import jax_spelling

CACHE_DIR_PLACEHOLDER = "<cachedoctor:cache_dir>"
CP_TARGET = "CustomSPMDPartitioning"
CP_PREFIX = f"cachedoctor-cp-v{HASHER_VERSION}:"
CP_REPLAY = CP_PREFIX + "replay"  # the key is decided by replaying the recorded calls
REPLAY_COMPONENT = "custom_partitioning_replay"  # the digest that tells replayed entries apart
# DebugOptions fields that JAX fills with paths under the cache directory.
CACHE_DIR_FIELDS = ("xla_gpu_per_fusion_autotune_cache_dir", "xla_gpu_kernel_cache_file")


class KernelsNotStripped(InternalsChanged):
    """A Pallas TPU kernel's debug information could not be stripped (canonicalisation 3)."""


class VolatileField(NamedTuple):
    """A value that differs between processes or machines, and what the hasher did with it.

    (A named tuple, not a dataclass: ``@dataclass`` costs ~0.4 ms at import, in every hooked
    process's start.)"""

    field: str
    raw: str
    canonical: str
    reason: str | None = None  # set when the value could not be canonicalised (kept raw)


class KeyResult:
    """Everything the hasher learnt while computing one stable key.

    JAX's own key over the canonical inputs (``jax_equivalent_key``) and the XLA flags JAX
    hashed (``xla_flags``) are worked out when first asked for: a hit never asks. (A plain
    class for that, and for the start-up cost of ``@dataclass``.)"""

    __slots__ = (
        "_component_pieces",
        "_components",
        "_jax_key",
        "_split",
        "_xla_flags",
        "cache_dir",
        "canonical_ir",
        "key",
        "module_name",
        "to_replay",
        "volatile",
    )

    def __init__(
        self,
        key: str,
        module_name: str,
        # component name -> hex digest, in JAX's hashing order (from ``split`` when not given)
        components: dict[str, str] | None = None,
        jax_equivalent_key: str | None = None,  # JAX's formula over the canonical inputs
        volatile: list[VolatileField] | None = None,
        canonical_ir: str | None = None,
        xla_flags: list[str] | None = None,
        cache_dir: str | None = None,
        # (index, pointer) of the custom_partitioning calls whose key the hook decides by
        # replay; ``key`` is then the base key that the replayed entries share
        to_replay: list[tuple[int, bytes]] | None = None,
        # component name -> each piece hashed, for the small components (up to 1 MiB)
        component_pieces: dict[str, list[bytes]] | None = None,
        *,
        split: _SplitHash | None = None,  # where what is not given comes from
    ) -> None:
        if split is None and (jax_equivalent_key is None or components is None):
            raise TypeError("KeyResult needs the split hash, or its key and components")
        self.key = key
        self.module_name = module_name
        self._components = components
        self._jax_key = jax_equivalent_key
        self.volatile = [] if volatile is None else volatile
        self.canonical_ir = canonical_ir
        self._xla_flags = xla_flags
        self.cache_dir = cache_dir
        self.to_replay = [] if to_replay is None else to_replay
        if split is None and component_pieces is None:
            component_pieces = {}
        self._component_pieces = component_pieces
        self._split = split

    def __repr__(self) -> str:
        return f"KeyResult(key={self.key!r}, volatile={self.volatile!r})"

    @property
    def components(self) -> dict[str, str]:
        """Component name -> hex digest, in JAX's hashing order."""
        if self._components is None:
            assert self._split is not None
            self._components = dict(self._split.components)
        return self._components

    @property
    def component_pieces(self) -> dict[str, list[bytes]]:
        """Component name -> each piece hashed, for the small components (up to 1 MiB)."""
        if self._component_pieces is None:
            assert self._split is not None
            self._component_pieces = self._split.pieces
        return self._component_pieces

    @property
    def jax_equivalent_key(self) -> str:
        """JAX's own formula (one SHA-256 over every component) on the canonical inputs."""
        if self._jax_key is None:
            assert self._split is not None
            self._jax_key = f"{self.module_name}-{self._split.total_hexdigest()}"
        return self._jax_key

    @property
    def xla_flags(self) -> list[str]:
        """The XLA flags JAX hashes into the key (:func:`hashed_xla_flags`), read when first
        asked for: a miss's manifest and record ask, in the same compile."""
        if self._xla_flags is None:
            self._xla_flags = hashed_xla_flags()
        return self._xla_flags

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


def replayed_key(result: KeyResult, replay_digest: str) -> str:
    """The key of one replay-verified variant of a module: the base key's components plus
    :data:`REPLAY_COMPONENT` (so :func:`combine` recomputes it from the manifest offline)."""
    pairs = [*result.components.items(), (REPLAY_COMPONENT, replay_digest)]
    return f"{result.module_name}-{combine(pairs)}"


# Names whose calls the hasher canonicalises (see the module docstring): a module whose
# hashed bytecode holds neither is keyed without walking it.
CP_TARGET_BYTES = CP_TARGET.encode()
MOSAIC_TARGET = "tpu_custom_call"
MOSAIC_TARGET_BYTES = MOSAIC_TARGET.encode()
MLIR_BYTECODE_MAGIC = b"ML\xefR"


def _plain(computation: bytes | None) -> bool:
    """Whether the computation JAX hashed is MLIR bytecode naming none of the custom calls the
    hasher canonicalises: then the module need not be walked (strings are stored verbatim in
    bytecode). Anything else (several pieces, another encoding) is walked."""
    return (
        computation is not None
        and computation.startswith(MLIR_BYTECODE_MAGIC)
        and CP_TARGET_BYTES not in computation
        and MOSAIC_TARGET_BYTES not in computation
    )


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


def jax_strips_kernels() -> bool:
    """Whether the installed JAX strips Mosaic debug information before hashing (0.11 on)."""
    return hasattr(jax_module("cache_key"), "_strip_mosaic_debug_info")


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
    base = jax_spelling(cache_dir)
    if value == base or value.startswith(base.rstrip("/") + "/"):
        return CACHE_DIR_PLACEHOLDER + value[len(base) :]
    return value


def canonicalise_options(options: Any, cache_dir: str | None) -> list[VolatileField]:
    """Make ``options``'s cache-dir paths relative, in place; :func:`restore_options` puts
    them back (call it in a ``finally``).

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
                changes.append(VolatileField(f"debug_options.{name}", value, canonical))
    for i, change in enumerate(changes):
        try:
            setattr(debug, change.field.partition(".")[2], change.canonical)
        except BaseException:
            restore_options(options, changes[:i])
            raise
    return changes


def restore_options(options: Any, changes: list[VolatileField]) -> None:
    """Undo :func:`canonicalise_options`."""
    if changes:
        debug = options.executable_build_options.debug_options
        for change in changes:
            setattr(debug, change.field.partition(".")[2], change.raw)


def hashed_xla_flags() -> list[str]:
    """The XLA flags JAX hashes into the key (same sources and exclusions as JAX); worked out
    again only when one of its sources changed since the last lookup."""
    ck = jax_module("cache_key")

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
    ir = jax_module("lib.mlir").ir  # the stats recorder asks on every compile
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
    when JAX's key code is not what this hasher expects (checked by :func:`jax_key` whenever
    it rebinds JAX's functions).

    JAX's key code runs on the module as given first: when the bytecode it hashed names no
    custom call that the hasher canonicalises (the common case), that is the stable key, and
    the module is never walked. Otherwise (or when the hashed computation is not MLIR
    bytecode) the module is canonicalised and, if that changed it, hashed again.
    """
    if cache_dir is None:
        cache_dir = jax_module("config").compilation_cache_dir.value
    opt_volatile = canonicalise_options(compile_options, cache_dir)
    try:
        canon_module = module
        volatile: list[VolatileField] = []
        to_replay: list[tuple[int, bytes]] = []
        key, split = jax_key(module, devices, compile_options, backend)
        if not _plain(split.computation):
            canon_module, volatile, to_replay = canonical_module(module)
            if canon_module is not module:
                key, split = jax_key(canon_module, devices, compile_options, backend)
    finally:
        restore_options(compile_options, opt_volatile)
    module_name = key.rsplit("-", 1)[0]
    return KeyResult(
        key=key,
        module_name=module_name,
        volatile=volatile + opt_volatile,
        canonical_ir=module_text(canon_module) if record_ir else None,
        cache_dir=cache_dir,
        to_replay=to_replay,
        split=split,
    )
