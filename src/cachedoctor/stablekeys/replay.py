"""Replay: key a custom_partitioning op on what its callbacks return, not on what they look like.

XLA's SPMD partitioner calls three Python entry points of ``jax._src.custom_partitioning`` for
each ``CustomSPMDPartitioning`` custom call (partition, infer-sharding, propagate-user-sharding),
passing shapes, ``HloSharding`` objects and the call's ``backend_config`` pointer. Those returns
are everything the compiled executable takes from the callbacks.

- **Record**: :func:`install` wraps the three entry points (in place, so the references XLA holds
  see the wrapper). Each call's arguments (shapes as dtype and dimensions, shardings as serialised
  ``OpSharding`` protos) and a digest of its return value (the per-shard module's bytecode, the
  shardings) are kept per pointer until the hook writes them into the entry's manifest.
- **Replay**: :func:`reproduces` calls the current callbacks again with recorded arguments, on a
  fresh thread as XLA does (so no thread-local jax config of the caller leaks in), and compares
  digests. Whatever the callbacks read (environment, files, random state, attributes, registries,
  flags) shows up in what they return.

An escape hatch for callbacks whose output is not reproducible: see :func:`depends_on`.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

# The entry points XLA calls, with the parameters each must have (checked, not assumed).
ENTRY_POINTS = {
    "partition": (
        "_custom_partitioning_partition",
        ["arg_shapes", "arg_shardings", "result_shape", "result_sharding", "backend_string"],
    ),
    "infer": (
        "_custom_partitioning_infer_sharding_from_operands",
        ["arg_shapes", "arg_shardings", "result_shape", "backend_string"],
    ),
    "propagate": (
        "_custom_partitioning_propagate_user_sharding",
        ["user_sharding", "shape", "backend_string"],
    ),
}
DEPENDS_ON_ATTR = "cachedoctor_depends_on"
_MAX_CALLS_PER_OP = 256  # a module whose partitioner calls back more often is not recorded


class ReplayUnavailable(Exception):
    """The installed JAX's partition entry points are not what the recorder expects."""


_originals: dict[str, Callable[..., Any]] = {}
_calls: dict[bytes, list[dict[str, Any]]] = {}
_overflow: set[bytes] = set()
_lock = threading.Lock()


def depends_on(inputs: Callable[[], Any] | None = None) -> Callable[[Any], Any]:
    """Declare what a partition callback's output depends on, instead of replaying it.

    For callbacks whose output differs on every call (which always miss under replay)::

        @depends_on(lambda: os.environ["MY_TILE"])   # the key hashes repr() of this value
        def partition(mesh, arg_shapes, result_shape): ...

        @depends_on()                                 # deterministic: reuse without replay
        def partition(mesh, arg_shapes, result_shape): ...

    The attribute ``cachedoctor_depends_on`` set on the function works without importing
    cachedoctor. The declaration is trusted: a wrong one gives stale hits.
    """

    def mark(fn: Any) -> Any:
        setattr(fn, DEPENDS_ON_ATTR, inputs if inputs is not None else _no_inputs)
        return fn

    return mark


def _no_inputs() -> str:
    return "deterministic"


def declared_inputs(info: Any) -> str | None:
    """The digest of a declared callback's named inputs, or None when it is to be replayed.

    Raises when the declared function raises: the caller keeps the raw pointer (a miss).
    """
    declared = getattr(getattr(info, "partition", None), DEPENDS_ON_ATTR, None)
    if declared is None:
        return None
    value = declared() if callable(declared) else declared
    return hashlib.sha256(repr(value).encode()).hexdigest()


# -- recording --------------------------------------------------------------------------------


def _entry_points() -> dict[str, Any]:
    from jax._src import custom_partitioning as cp

    found = {}
    for kind, (name, params) in ENTRY_POINTS.items():
        fn = getattr(cp, name, None)
        if not isinstance(fn, types.FunctionType):
            raise ReplayUnavailable(f"jax._src.custom_partitioning.{name} is gone")
        original = _originals.get(kind)
        actual = list(inspect.signature(original or fn).parameters)
        if actual != params:
            raise ReplayUnavailable(f"{name} takes {actual}, expected {params}")
        found[kind] = fn
    return found


def installed() -> bool:
    return len(_originals) == len(ENTRY_POINTS)


def install() -> None:
    """Wrap XLA's partition entry points so that each call is recorded; idempotent.

    The function objects are changed in place (``__code__``), because XLA holds references to
    them. Raises :class:`ReplayUnavailable` (and changes nothing) when they are not as expected.
    """
    with _lock:
        if installed():
            return
        found = _entry_points()
        for fn in found.values():
            if fn.__closure__:
                raise ReplayUnavailable(f"{fn.__name__} is a closure")
        for kind, fn in found.items():
            copy = types.FunctionType(
                fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
            )
            copy.__kwdefaults__ = fn.__kwdefaults__
            _originals[kind] = copy
            fn.__code__ = _forwarder.__code__
            fn.__defaults__ = None
            fn.__kwdefaults__ = {"__cachedoctor_call": _recorder(kind, copy)}


def _forwarder(*args: Any, __cachedoctor_call: Any = None) -> Any:
    """The code every wrapped entry point runs: forward to the recorder."""
    return __cachedoctor_call(*args)


def _recorder(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def record(*args: Any) -> Any:
        result = original(*args)
        try:
            pointer = bytes(args[-1])
            with _lock:
                calls = _calls.get(pointer)
            if calls is not None:  # a pointer the hook is waiting for
                entry = {"fn": kind, "args": _encode_args(kind, args[:-1])}
                entry["digest"] = _digest(kind, result)
                with _lock:
                    if entry not in calls:
                        if len(calls) >= _MAX_CALLS_PER_OP:
                            _overflow.add(pointer)
                        else:
                            calls.append(entry)
        except Exception:  # never break XLA's compile: an op without records is not reused
            with _lock:
                _overflow.add(bytes(args[-1]))
        return result

    return record


def expect(pointers: Sequence[bytes]) -> None:
    """Start recording the calls XLA makes for these pointers (forgetting earlier ones)."""
    with _lock:
        for p in pointers:
            _calls[p] = []
            _overflow.discard(p)


def take(pointers: Sequence[bytes]) -> list[list[dict[str, Any]]] | None:
    """The recorded calls per pointer, and stop recording them; None if any was not recordable."""
    with _lock:
        calls = [_calls.pop(p, None) for p in pointers]
        broken = any(p in _overflow for p in pointers)
        for p in pointers:
            _overflow.discard(p)
    if broken or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


# -- encoding ---------------------------------------------------------------------------------


def _encode_shape(shape: Any) -> Any:
    if shape.is_tuple():
        return {"tuple": [_encode_shape(s) for s in shape.tuple_shapes()]}
    return {"dtype": str(shape.numpy_dtype()), "dims": list(shape.dimensions())}


def _decode_shape(data: Any) -> Any:
    import numpy as np
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    if "tuple" in data:
        return xc.Shape.tuple_shape([_decode_shape(s) for s in data["tuple"]])
    return xc.Shape.array_shape(np.dtype(data["dtype"]), tuple(data["dims"]))


def _sharding_bytes(sharding: Any) -> bytes:
    return bytes(sharding.to_proto().SerializeToString())


def _encode_sharding(sharding: Any) -> str:
    return base64.b64encode(_sharding_bytes(sharding)).decode()


def _decode_sharding(data: str) -> Any:
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    proto = xc.OpSharding()
    proto.ParseFromString(base64.b64decode(data))
    return xc.HloSharding.from_proto(proto)


# per entry point: how each argument is encoded ("shape", "shapes", "sharding", "shardings")
_ARG_KINDS = {
    "partition": ("shapes", "shardings", "shape", "sharding"),
    "infer": ("shapes", "shardings", "shape"),
    "propagate": ("sharding", "shape"),
}


def _encode_args(kind: str, args: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for how, value in zip(_ARG_KINDS[kind], args, strict=True):
        if how == "shapes":
            out.append([_encode_shape(s) for s in value])
        elif how == "shardings":
            out.append([_encode_sharding(s) for s in value])
        elif how == "shape":
            out.append(_encode_shape(value))
        else:
            out.append(_encode_sharding(value))
    return out


def _decode_args(kind: str, args: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for how, value in zip(_ARG_KINDS[kind], args, strict=True):
        if how == "shapes":
            out.append([_decode_shape(s) for s in value])
        elif how == "shardings":
            out.append([_decode_sharding(s) for s in value])
        elif how == "shape":
            out.append(_decode_shape(value))
        else:
            out.append(_decode_sharding(value))
    return out


def _module_text(bytecode: bytes) -> bytes:
    """The per-shard module without debug locations: those name the Python frames that called
    the partitioner (XLA's thread, or the replay), which do not change what is computed."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    with mlir.make_ir_context():
        module = ir.Module.parse(bytecode)
        return str(module.operation.get_asm(enable_debug_info=False)).encode()


def _digest(kind: str, result: Any) -> str:
    """SHA-256 of what an entry point returned (module bytecode and shardings)."""
    h = hashlib.sha256(kind.encode() + b"\x00")
    if kind == "partition":
        bytecode, arg_shardings, result_sharding = result
        text = _module_text(bytes(bytecode))
        h.update(len(text).to_bytes(8, "little") + text)
        for s in [*arg_shardings, result_sharding]:
            data = _sharding_bytes(s)
            h.update(len(data).to_bytes(8, "little") + data)
    else:
        h.update(_sharding_bytes(result))
    return h.hexdigest()


def calls_digest(calls: Sequence[Sequence[dict[str, Any]]]) -> str:
    """One digest over every recorded call (what a manifest's replay section commits to)."""
    return hashlib.sha256(json.dumps(calls, sort_keys=True).encode()).hexdigest()


# -- replay -----------------------------------------------------------------------------------


def _replay_one(call: dict[str, Any], pointer: bytes) -> bool:
    kind = call["fn"]
    original = _originals[kind]
    result = original(*_decode_args(kind, call["args"]), pointer)
    return bool(_digest(kind, result) == call["digest"])


def reproduces(calls: Sequence[Sequence[dict[str, Any]]], pointers: Sequence[bytes]) -> str | None:
    """Replay recorded calls (one list per custom call) against the current callbacks.

    Returns None when every digest matches, else why not. Runs on a fresh thread, as XLA does.
    """
    if not installed():
        return "the partition recorder is not installed"
    if len(calls) != len(pointers):
        return f"{len(calls)} recorded custom calls, the module has {len(pointers)}"
    outcome: list[str | None] = ["replay did not finish"]

    def run() -> None:
        try:
            for i, (op_calls, pointer) in enumerate(zip(calls, pointers, strict=True)):
                for call in op_calls:
                    if not _replay_one(call, pointer):
                        outcome[0] = f"custom call {i}: {call['fn']} returned something else"
                        return
            outcome[0] = None
        except Exception as exc:  # a callback that fails now is a miss, not an error
            outcome[0] = f"replay raised {type(exc).__name__}: {exc}"

    thread = threading.Thread(target=run, name="cachedoctor-replay", daemon=True)
    thread.start()
    thread.join()
    return outcome[0]
