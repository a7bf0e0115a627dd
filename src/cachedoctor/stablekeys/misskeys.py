"""What went into the key of a compile that missed, in JAX's own terms, for ``cachedoctor why``.

JAX's ``cache_key.get`` feeds eight components into one SHA-256: ``computation``, ``jax_lib
version``, ``backend version``, ``XLA flags``, ``compile_options``, ``accelerator_config``,
``compression`` and ``custom_hook`` (0.4.38 has no ``backend version``), and shows them only in
a DEBUG log line per component. The stats recorder keeps, for each key that missed, one digest
per component and the pieces JAX hashed for the small ones (everything but the computation), so
that a later ``why`` can say which component differs from the key an earlier run wrote, and
what its two values were.

Cost: on every lookup, one wrapper call that keeps a reference to JAX's arguments of
``cache_key.get`` (no hashing, no copy); on a miss only (a compile follows, which costs far
more), JAX's key code runs once more with a recording hash
(:func:`splithash.jax_key_components`).
The key so computed must be the key JAX looked up, else nothing is recorded: under the stable
hook the key looked up is the stable key, whose components the hook hands over
(:func:`note_stable`).
"""

from __future__ import annotations

import base64
import contextlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # keys is imported when a key missed: recording stays light on import
    from cachedoctor.stablekeys.keys import KeyResult

MARKER = "__cachedoctor_misskeys_original__"
_local = threading.local()  # .inputs: the last cache_key.get arguments; .stable: (key, result)


def wrap_cache_key_get() -> None:
    """Keep, per thread, the arguments of JAX's ``cache_key.get`` (idempotent)."""
    from jax._src import cache_key as ck

    original = ck.get
    if getattr(original, MARKER, None) is not None:
        return

    def get(*args: Any, **kwargs: Any) -> Any:
        _local.inputs = (args, kwargs)
        return original(*args, **kwargs)

    setattr(get, MARKER, original)
    get.__wrapped__ = original  # type: ignore[attr-defined]
    ck.get = get


def note_stable(
    key: str,
    result: KeyResult,
    devices: Any = None,
    replay: tuple[str, list[str]] | None = None,
) -> None:
    """The stable hook's key for this thread's lookup, and what went into it.

    ``replay``: for a key the hook decided by replaying custom_partitioning calls, the variant's
    digest (the last component of that key, :func:`keys.replayed_key`) and, in words, why it is
    that variant (which recorded one reproduced, or why none did).
    """
    _local.stable = (key, result, devices, replay)


def forget() -> None:
    """Drop this thread's kept arguments (a compile ended: nothing outlives it)."""
    _local.inputs = None
    _local.stable = None


def shown_values(chunks: dict[str, list[bytes]]) -> dict[str, list[str]]:
    """Each small component's hashed pieces, as text where they are UTF-8, else ``b64:...``."""
    out: dict[str, list[str]] = {}
    for name, pieces in chunks.items():
        shown = []
        for piece in pieces:
            try:
                shown.append(piece.decode("utf-8"))
            except UnicodeDecodeError:
                shown.append("b64:" + base64.b64encode(piece).decode())
        out[name] = shown
    return out


def _devices(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """How many devices, of which kinds, the compile was for (JAX's ``devices`` argument): the
    accelerator component is a topology fingerprint on most backends, opaque without this."""
    devices = kwargs.get("devices", args[1] if len(args) > 1 else None)
    try:
        flat = list(devices.flat)  # type: ignore[union-attr]
        kinds = sorted({str(d.device_kind) for d in flat})
        return {"count": len(flat), "kinds": kinds}
    except Exception:
        return None


# JAX settings that change the program JAX lowers (and so the computation it hashes) without
# being a component of the key: part of JAX's trace context, or read by cache_key itself
LOWERING_SETTINGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_threefry_partitionable",
    "jax_softmax_custom_jvp",
    "jax_use_shardy_partitioner",
    "jax_compilation_cache_include_metadata_in_key",
    "jax_remove_custom_partitioning_ptr_from_cache_key",
    "jax_hlo_source_file_canonicalization_regex",
)


def lowering_settings() -> dict[str, Any]:
    """The values in force of :data:`LOWERING_SETTINGS` this JAX defines, as JSON scalars."""
    import jax

    out: dict[str, Any] = {}
    for name in LOWERING_SETTINGS:
        try:
            value = getattr(jax.config, name)
        except Exception:
            continue
        out[name] = value if isinstance(value, (bool, int, float, str, type(None))) else str(value)
    return out


POINTERS = "custom_partitioning pointers"  # the backend_config values JAX hashed (addresses)
WITHOUT_POINTERS = "computation without pointers"  # the computation's digest with them removed
# the computation's digest as JAX hashes it with jax_remove_custom_partitioning_ptr_from_cache_key
# on (its own IgnoreCallbacks.CUSTOM_PARTITIONING): comparable across a toggle of that flag
POINTERS_REMOVED = "computation, pointers removed by JAX"


def _without_pointers(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[str], str, str | None] | None:
    """For a module with custom_partitioning calls: their ``backend_config`` values (Python
    object addresses), the digest JAX's code gives the computation with each one replaced by
    the same placeholder, so that ``why`` can tell "only the pointer changed" from evidence, and
    the digest JAX gives it with its pointer flag on (:func:`_pointers_removed`)."""
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    from cachedoctor.stablekeys import keys, splithash

    module = kwargs.get("module", args[0] if args else None)
    if module is None:
        return None
    with module.context:
        if not keys._custom_partitioning_ops(module):
            return None
        clone = keys._clone(module)
        holder = type("Holder", (), {"operation": clone})()
        pointers = []
        for op in keys._custom_partitioning_ops(holder):
            pointers.append(str(ir.StringAttr(op.attributes["backend_config"]).value))
            op.attributes["backend_config"] = ir.StringAttr.get("cachedoctor:pointer")
        view = getattr(clone, "opview", clone)
        if "module" in kwargs:
            _, split = splithash.jax_key_components(args, {**kwargs, "module": view})
        else:
            _, split = splithash.jax_key_components((view, *args[1:]), kwargs)
    try:
        removed = _pointers_removed(args, kwargs)
    except Exception:  # the placeholder's digest still tells a pointer change
        removed = None
    return pointers, dict(split.components)["computation"], removed


def _pointers_removed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The computation's digest as JAX's own code hashes it with
    ``jax_remove_custom_partitioning_ptr_from_cache_key`` on, whatever the flag is here (None:
    this JAX has no such removal)."""
    from jax._src import cache_key as ck

    from cachedoctor.stablekeys import splithash

    removed = getattr(getattr(ck, "IgnoreCallbacks", None), "CUSTOM_PARTITIONING", None)
    if removed is None:
        return None
    if len(args) > 5:  # compilation_cache.get_cache_key passes it sixth
        args, kwargs = (*args[:5], removed, *args[6:]), kwargs
    else:
        kwargs = {**kwargs, "ignore_callbacks": removed}
    _, split = splithash.jax_key_components(args, kwargs)
    return dict(split.components)["computation"]


def describe_miss(looked_up: str) -> dict[str, Any] | None:
    """The components of ``looked_up`` (a key JAX did not find), or None when this thread's
    kept arguments do not give that very key."""
    stable = getattr(_local, "stable", None)
    devices = None
    if stable is not None and stable[0] == looked_up:
        result: KeyResult = stable[1]
        components, chunks = list(result.components.items()), result.component_chunks
        kind = "stable"
        devices = _devices((None, stable[2]), {})
        if stable[3] is not None:
            from cachedoctor.stablekeys.keys import REPLAY_COMPONENT

            digest, said = stable[3]
            components = [*components, (REPLAY_COMPONENT, digest)]
            chunks = {**chunks, REPLAY_COMPONENT: [line.encode() for line in said]}
    else:
        inputs = getattr(_local, "inputs", None)
        if inputs is None:
            return None
        args, kwargs = inputs
        try:
            from cachedoctor.stablekeys import splithash

            key, split = splithash.jax_key_components(args, kwargs)
        except Exception:
            return None
        if key != looked_up:
            return None
        components, chunks, kind = split.components, split.chunks, "jax"
        devices = _devices(args, kwargs)
        try:
            pointers = _without_pointers(args, kwargs)
        except Exception:
            pointers = None
        if pointers is not None:
            chunks = {**chunks, POINTERS: [p.encode() for p in pointers[0]]}
            components = [*components, (WITHOUT_POINTERS, pointers[1])]
            if pointers[2] is not None:
                components = [*components, (POINTERS_REMOVED, pointers[2])]
    doc: dict[str, Any] = {
        "kind": kind,
        "components": [[name, digest] for name, digest in components],
        "values": shown_values(chunks),
    }
    if devices is not None:
        doc["devices"] = devices
    with contextlib.suppress(Exception):
        from jax._src import config

        doc["metadata_in_key"] = bool(config.compilation_cache_include_metadata_in_key.value)
    with contextlib.suppress(Exception):
        doc["settings"] = lowering_settings()
    return doc
