"""Pallas TPU kernels in a stored HLO module: each ``tpu_custom_call`` and its Mosaic body.

A Pallas TPU kernel lowers to a ``tpu_custom_call`` whose config is JSON; its
``custom_call_config.body`` is the kernel as base64 MLIR bytecode. In the optimised module that
libtpu stores, the config is not in the instruction's ``backend_config`` (empty) but in the
module's field 22, a list of payloads the instruction names by index (its field 99, field 2);
in a module lowered by JAX it is the ``backend_config`` itself (docs/format-tpu.md).

The body keeps debug locations: the kernel's source path and line numbers. Up to jax 0.10 they
are hashed into the cache key, so the same kernel run from another folder, or a line lower,
gets another key; jax 0.11 strips them first (``cache_key._strip_mosaic_debug_info``).

``kernels_in_module`` finds the bodies in the bytes alone. ``describe`` reads a body with
jaxlib's MLIR (imported only then: about half a second): its name, its grid, its debug locations,
and the digest of the body with its debug information stripped as jax 0.11 strips it. Two bodies
with equal stripped digests differ in debug locations only; that is the evidence ``scan``,
``diff`` and ``why`` give, and what the stable hasher (stablekeys/keys.py) hashes.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachedoctor.formats import wire

TARGET = "tpu_custom_call"
_TARGET_BYTES = TARGET.encode()
# HloModuleProto / HloComputationProto / HloInstructionProto field numbers (hlo.proto; 22 and 99
# as read from libtpu's modules)
_MODULE_COMPUTATIONS, _MODULE_PAYLOADS = 3, 22
_COMPUTATION_NAME, _COMPUTATION_INSTRUCTIONS = 1, 2
_INSTR_NAME, _INSTR_TARGET, _INSTR_CONFIG, _INSTR_PAYLOAD = 1, 28, 43, 99


@dataclass(frozen=True)
class KernelConfig:
    """One ``tpu_custom_call`` of a module: where it is, its config, the Mosaic body in it."""

    instruction: str  # computation/instruction
    config: bytes  # the JSON config
    body: bytes | None  # the MLIR bytecode, None when the config holds none


@dataclass(frozen=True)
class Location:
    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class KernelDetail:
    """What jaxlib's MLIR reads of a Mosaic body."""

    name: str | None  # the kernel function's name (the Pallas kernel's Python name)
    grid: tuple[int, ...] | None  # its iteration bounds
    locations: tuple[Location, ...]  # every file location, in the order MLIR prints them
    stripped_sha256: str  # of the body with debug information stripped (as jax 0.11 does)


class MosaicUnreadable(ValueError):
    """jaxlib could not read the body (missing, or a bytecode newer than it reads)."""


def kernels_in_module(module: wire.Buffer) -> list[KernelConfig]:
    """Every ``tpu_custom_call`` of an ``HloModuleProto``, in order. Raises WireError."""
    if _TARGET_BYTES not in bytes(module):
        return []
    fields = wire.field_list(module)
    payloads = [bytes(v) for n, wt, v in fields if n == _MODULE_PAYLOADS and wt == wire.LEN]
    found = []
    for number, wt, computation in fields:
        if number != _MODULE_COMPUTATIONS or wt != wire.LEN:
            continue
        assert isinstance(computation, memoryview)
        cfields = wire.field_list(computation)
        cname = next((bytes(v) for n, _, v in cfields if n == _COMPUTATION_NAME), b"")
        for n, _, instruction in cfields:
            if n != _COMPUTATION_INSTRUCTIONS or _TARGET_BYTES not in bytes(instruction):
                continue
            found.extend(_kernel_of(cname, instruction, payloads))
    return found


def _kernel_of(cname: bytes, instruction: Any, payloads: list[bytes]) -> list[KernelConfig]:
    ifields = wire.fields_by_number(instruction)
    if wire.as_str(wire.first(ifields, _INSTR_TARGET)) != TARGET:
        return []
    name = wire.as_str(wire.first(ifields, _INSTR_NAME)) or "?"
    where = f"{cname.decode('utf-8', 'replace')}/{name}"
    config = wire.first(ifields, _INSTR_CONFIG)
    data = b"" if config is None or isinstance(config, int) else bytes(config)
    if not data:
        ref = wire.first(ifields, _INSTR_PAYLOAD)
        if ref is not None and not isinstance(ref, int):
            index = wire.as_int(wire.first(wire.fields_by_number(ref), 2))
            if index is not None and 0 <= index < len(payloads):
                data = payloads[index]
    return [KernelConfig(where, data, body_of(data))]


def body_of(config: bytes) -> bytes | None:
    """The Mosaic body of a ``tpu_custom_call`` config, or None when it holds none."""
    try:
        parsed = json.loads(config)
        body = parsed["custom_call_config"]["body"]
        return base64.b64decode(body, validate=True) if isinstance(body, str) else None
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


# The bodies this process read, by digest: the kernel tier (cache/tiers.py) reads them from
# here instead of decoding the entry again. Bounded: a miss only costs that second decode.
_BODIES: dict[str, bytes] = {}
_BODIES_MAX_BYTES = 16 << 20
_bodies_bytes = 0


def remember_body(body: bytes) -> str:
    """``body_digest(body)``, the body kept for :func:`known_body`."""
    global _bodies_bytes
    digest = body_digest(body)
    if digest not in _BODIES:
        if _bodies_bytes + len(body) > _BODIES_MAX_BYTES:
            _BODIES.clear()
            _bodies_bytes = 0
        _BODIES[digest] = body
        _bodies_bytes += len(body)
    return digest


def known_body(digest: str) -> bytes | None:
    """A body this process read (:func:`remember_body`), if it still holds it."""
    return _BODIES.get(digest)


# --- reading a body with jaxlib's MLIR ------------------------------------------------------

_LOC_DEF = re.compile(r'^#(loc\d*) = loc\("((?:[^"\\]|\\.)*)":(\d+):(\d+)(?:\s+to\s+[^)]*)?\)$')
_FUNC = re.compile(r"func\.func\s+(?:public\s+|private\s+)?@([\w$.-]+)")
_SYM_NAME = re.compile(r'\bsym_name = "((?:[^"\\]|\\.)*)"')  # the generic form (stable_mosaic)
_BOUNDS = re.compile(r"iteration_bounds\s*=\s*array<i64(?::\s*([-\d,\s]*))?>")


@functools.cache
def _mlir() -> tuple[Any, Any, Any, Any]:
    """jaxlib's ``ir``, ``passmanager``, Mosaic TPU dialect and the dialect registry JAX's own
    contexts get (imported once, on demand). From jaxlib itself where it lays them out as
    0.10 does (80 ms); else through ``jax._src``, which imports all of jax (370 ms; measured:
    benchmarks/bench_tpu_scan.py). Raises MosaicUnreadable."""
    try:
        from jaxlib.mlir import ir, passmanager
        from jaxlib.mlir._mlir_libs import _jax_mlir_ext
        from jaxlib.mosaic.python import tpu

        registry = ir.DialectRegistry()
        _jax_mlir_ext.register_dialects(registry)  # JAX's dialects and passes
        _check(ir, passmanager, tpu, registry)
        return ir, passmanager, tpu, registry
    except Exception:  # another layout: as JAX itself finds them
        pass
    try:
        from jax._src.interpreters import mlir as jax_mlir
        from jax._src.lib import tpu as jax_tpu  # type: ignore[attr-defined]
        from jax._src.lib.mlir import ir as jax_ir  # type: ignore[attr-defined]
        from jax._src.lib.mlir import passmanager as jax_pm  # type: ignore[attr-defined]

        _check(jax_ir, jax_pm, jax_tpu, jax_mlir.upstream_dialects)
        return jax_ir, jax_pm, jax_tpu, jax_mlir.upstream_dialects
    except Exception as exc:  # no jaxlib, or one without the Mosaic TPU dialect
        said = " ".join(str(exc).split())[:200]
        raise MosaicUnreadable(f"jaxlib's MLIR cannot read Mosaic kernels here: {said}") from exc


def _check(ir: Any, passmanager: Any, tpu: Any, registry: Any) -> None:
    """Raise unless a context of this kind parses the pipeline ``describe`` runs."""
    context = _context(ir, tpu, registry)
    with context:
        passmanager.PassManager.parse(STRIP)


def _context(ir: Any, tpu: Any, registry: Any) -> Any:
    context = ir.Context()
    context.append_dialect_registry(registry)
    tpu.register_dialect(context)
    context.allow_unregistered_dialects = True
    return context


STRIP = "builtin.module(strip-debuginfo)"


@functools.lru_cache(maxsize=256)
def describe(body: bytes) -> KernelDetail:
    """A Mosaic body's name, grid, locations and stripped digest. Raises MosaicUnreadable."""
    ir, passmanager, tpu, registry = _mlir()
    try:
        context = _context(ir, tpu, registry)
        with context:
            module = ir.Module.parse(body)
            text = module.operation.get_asm(enable_debug_info=True)
            passmanager.PassManager.parse(STRIP).run(module.operation)
            out = io.BytesIO()
            module.operation.write_bytecode(out)
    except Exception as exc:  # MLIRError, or a bytecode version jaxlib does not read
        raise MosaicUnreadable(f"jaxlib's MLIR could not read the kernel: {exc}") from exc
    return KernelDetail(
        name=_name(text),
        grid=_grid(text),
        locations=_locations(text),
        stripped_sha256=hashlib.sha256(out.getvalue()).hexdigest(),
    )


def _locations(text: str) -> tuple[Location, ...]:
    found = []
    for line in text.splitlines():
        match = _LOC_DEF.match(line.strip())
        if match:
            file = match.group(2).encode().decode("unicode_escape", "replace")
            found.append(Location(file, int(match.group(3)), int(match.group(4))))
    return tuple(found)


def _name(text: str) -> str | None:
    match = _FUNC.search(text) or _SYM_NAME.search(text)
    return match.group(1) if match else None


def _grid(text: str) -> tuple[int, ...] | None:
    match = _BOUNDS.search(text)
    if not match:
        return None
    values = (match.group(1) or "").replace(" ", "")
    return tuple(int(v) for v in values.split(",") if v)


def location_change(a: KernelDetail, b: KernelDetail) -> str:
    """How ``b``'s locations differ from ``a``'s, in a few words: ``a/k.py:14 → b/k.py:15``
    (the first line that moved, and how many other lines moved)."""
    pairs = list(
        dict.fromkeys(
            (str(x), str(y))
            for x, y in zip(a.locations, b.locations, strict=False)
            if (x.file, x.line) != (y.file, y.line)
        )
    )
    if not pairs and len(a.locations) == len(b.locations):
        return "no file location differs (names or columns only)"
    if not pairs:
        return f"{len(a.locations)} locations → {len(b.locations)}"
    first = f"{pairs[0][0]} → {pairs[0][1]}"
    more = len(pairs) - 1
    return first + (f" (and {more} more line{'s' if more > 1 else ''})" if more else "")


# --- a module with its kernel bodies replaced -------------------------------------------------

MASKED = "<mosaic body>"


def with_bodies(module: wire.Buffer, replace: Callable[[bytes], str]) -> bytes:
    """``module`` with the Mosaic body of each payload (field 22) replaced by
    ``replace(body)``; every other byte as it was. Raises WireError, MosaicUnreadable.

    What two modules whose bodies are replaced by their stripped digests share is everything
    but the kernels' debug information: equal program digests of the results are the evidence
    that two entries differ in debug locations only. Bodies replaced by ``MASKED`` tell scan
    which entries to look at (equal up to their kernel bodies)."""
    out = bytearray()
    for number, wt, value in wire.field_list(module):
        if number == _MODULE_PAYLOADS and isinstance(value, memoryview):
            out += wire.encode_field(number, wt, _payload_with_body(bytes(value), replace))
        else:
            out += wire.encode_field(number, wt, value)
    return bytes(out)


def _payload_with_body(payload: bytes, replace: Callable[[bytes], str]) -> bytes:
    body = body_of(payload)
    if body is None:
        return payload
    config = json.loads(payload)
    config["custom_call_config"]["body"] = replace(body)
    return json.dumps(config, separators=(",", ":"), sort_keys=True).encode()


def stripped(body: bytes) -> str:
    """A body's stand-in in ``with_bodies``: the digest of it without debug information."""
    return "stripped:" + describe(body).stripped_sha256


def masked(body: bytes) -> str:
    return MASKED


# --- two modules' kernels compared ----------------------------------------------------------


@dataclass(frozen=True)
class KernelPair:
    """One kernel of two modules (the n-th ``tpu_custom_call`` of each)."""

    instruction: str
    name: str | None
    same_body: bool  # byte for byte, debug locations included
    same_stripped: bool | None  # without debug information; None when unreadable
    change: str  # how the debug locations moved ("" when the bodies are the same)
    a_locations: tuple[str, ...] = ()
    b_locations: tuple[str, ...] = ()


@dataclass(frozen=True)
class KernelComparison:
    """Two modules' Pallas kernels, and whether the modules differ in their debug info only."""

    pairs: tuple[KernelPair, ...]
    # the modules are equal once every body's debug information is stripped (True), differ
    # even so (False), or cannot be told (None: a body jaxlib cannot read, kernels not paired)
    only_debug_info: bool | None
    unreadable: str | None = None

    @property
    def moved(self) -> tuple[KernelPair, ...]:
        """The kernels whose bodies differ in debug locations only."""
        return tuple(p for p in self.pairs if not p.same_body and p.same_stripped)

    def summary(self) -> str:
        """``Mosaic kernel `mm_kernel`: a/k.py:14 → b/k.py:15`` for each kernel that moved."""
        return "; ".join(
            f"Mosaic kernel `{p.name or p.instruction}`: {p.change}" for p in self.moved
        )


def compare_kernels(a: wire.Buffer, b: wire.Buffer) -> KernelComparison | None:
    """The Pallas kernels of two HLO modules compared, or None when neither holds one.
    Raises WireError."""
    from cachedoctor.xla import hlo_facts

    ka, kb = kernels_in_module(a), kernels_in_module(b)
    if not ka and not kb:
        return None
    if [k.instruction for k in ka] != [k.instruction for k in kb]:
        return KernelComparison((), False, None)  # other kernels: another program
    pairs = []
    try:
        for x, y in zip(ka, kb, strict=True):
            pairs.append(_pair(x, y))
        same = (
            hlo_facts.scan_facts(with_bodies(a, stripped)).program_digest
            == hlo_facts.scan_facts(with_bodies(b, stripped)).program_digest
        )
    except MosaicUnreadable as exc:
        return KernelComparison(tuple(pairs), None, str(exc))
    return KernelComparison(tuple(pairs), same)


def _pair(x: KernelConfig, y: KernelConfig) -> KernelPair:
    if x.body is None or y.body is None:
        same = x.config == y.config
        return KernelPair(x.instruction, None, same, same, "")
    dx, dy = describe(x.body), describe(y.body)
    same_body = x.body == y.body
    return KernelPair(
        x.instruction,
        dx.name or dy.name,
        same_body,
        dx.stripped_sha256 == dy.stripped_sha256,
        "" if same_body else location_change(dx, dy),
        tuple(str(loc) for loc in dx.locations),
        tuple(str(loc) for loc in dy.locations),
    )
