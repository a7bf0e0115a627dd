"""The scan's fast HLO reader (``hlo_facts``, protobuf over a minimal view) against the pure walker
(``hlo.summarize`` / ``hlo.canonicalize``) on real modules written by JAX.

The pure walker is the independent oracle: it shares no parsing code with the view. The summary
and the key-volatile fields must be equal; the program digest is another hash, so what must be
equal is the grouping it makes (same program <=> same canonical lines).
"""

from __future__ import annotations

import hashlib
import random
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cachedoctor.cache import reader
from cachedoctor.core.check.runner import program_env, run_command
from cachedoctor.formats import wire
from cachedoctor.xla import hlo, hlo_facts
from tests.support.caches import hlo_modules
from tests.support.sessioncache import SharedBuilds

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

# Programs whose modules cover what the view reads: called computations (while, cond, sort,
# reduce, scatter), parameters and tuples, 8-way sharding with shard_map, LAPACK custom calls,
# donation (module-level aliasing), integer and low-precision types, a larger unrolled stack.
VARIETY = """
import functools
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

@jax.jit
def loop(x):
    return jax.lax.fori_loop(0, 5, lambda i, v: jnp.sin(v) + i, x)

@jax.jit
def branch(p, x):
    return jax.lax.cond(p > 0, lambda v: v * 2, lambda v: v - 1, x)

@jax.jit
def sorts(x):
    return jnp.sort(x), jnp.argsort(x), x.at[jnp.array([0, 2])].add(1.0)

@functools.partial(jax.jit, donate_argnums=0)
def donate(a, b):
    return a + b, (a * b).astype(jnp.bfloat16)

@jax.jit
def stack(x, w):
    for k in range(40):
        x = jnp.tanh(x @ w + k)
    return x.sum(0), jnp.cumsum(x, axis=1)

@jax.jit
def linalg(m):
    return jnp.linalg.cholesky(m), jnp.linalg.eigh(m)[0]

mesh = Mesh(jax.devices(), ("d",))
sh = NamedSharding(mesh, P("d"))

@functools.partial(jax.jit, in_shardings=sh, out_shardings=sh)
def sharded(a):
    f = jax.shard_map(lambda v: jax.lax.psum(v, "d") * v, mesh=mesh, in_specs=P("d"),
                      out_specs=P("d"))
    return f(a) + jnp.roll(a, 1)

x = jnp.arange(16.0)
loop(x); branch(1, x); sorts(x); donate(jnp.ones(4), jnp.ones(4))
stack(jnp.ones((8, 32)), jnp.ones((32, 32)) * 0.01); linalg(jnp.eye(4) * 2.0)
sharded(jnp.arange(32.0)); jnp.argmax(x, axis=0).astype(jnp.int8).block_until_ready()
print("done")
"""


@pytest.fixture(scope="module")
def real_modules(shared_builds: SharedBuilds, seed_cache: Path) -> list[bytes]:
    """Modules of the seed cache (custom_partitioning) and of the VARIETY program."""

    def make(root: Path) -> None:
        script, cache = root / "variety.py", root / "cache"
        script.write_text(VARIETY)
        cache.mkdir()
        if not hasattr(__import__("jax"), "shard_map"):  # jax < 0.6: the experimental spelling
            script.write_text(
                VARIETY.replace(
                    "jax.shard_map",
                    "__import__('jax.experimental.shard_map').experimental.shard_map.shard_map",
                )
            )
        run = run_command([sys.executable, str(script)], program_env(str(cache)))
        assert run.returncode == 0, run.stderr[-3000:]

    root, _ = shared_builds("variety", make, VARIETY)
    modules = hlo_modules(seed_cache) + hlo_modules(root / "cache")
    assert len(modules) >= 12
    return modules


def _key_volatile(canonical: hlo.CanonicalHlo) -> tuple[hlo.VolatileField, ...]:
    return tuple(v for v in canonical.volatile if v.category in reader.KEY_VOLATILE_CATEGORIES)


def test_summary_and_volatile_fields_equal_the_pure_walk(real_modules: list[bytes]) -> None:
    opcodes: set[str] = set()
    for module in real_modules:
        facts = hlo_facts.scan_facts(module)
        assert facts.summary == hlo.summarize(module)
        assert facts.volatile == _key_volatile(hlo.canonicalize(module))
        opcodes.update(op for op, _ in facts.summary.opcodes)
    # the corpus reaches what the view must read, or the comparison proves little
    assert {"while", "conditional", "sort", "custom-call", "parameter", "tuple"} <= opcodes
    assert any(
        v.category == "custom-partitioning"
        for m in real_modules
        for v in hlo_facts.scan_facts(m).volatile
    )


def _partition(values: list[str]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for i, value in enumerate(values):
        groups.setdefault(value, []).append(i)
    return sorted(groups.values())


Value = wire.FieldValue | bytes  # what a rewrite may put in a field's place
Change = Callable[[int, int, wire.FieldValue], Value]


def _rewrite(message: wire.Buffer, path: tuple[int, ...], change: Change) -> bytes:
    """Re-encode a module, applying ``change(number, wt, value) -> value`` to the fields of
    every message at ``path`` (() = module, (3,) = computations, (3, 2) = instructions)."""
    out = []
    for number, wt, value in wire.field_list(message):
        new: Value = value
        if path and number == path[0] and not isinstance(value, int):
            new = _rewrite(value, path[1:], change)
        elif not path:
            new = change(number, wt, value)
        out.append(wire.encode_field(number, wt, new))
    return b"".join(out)


def _rerun(module: bytes) -> bytes:
    """What another run of the same program may store: another module id, instruction names
    and source metadata (the code moved), and a module name of another function."""

    def instruction(number: int, wt: int, value: wire.FieldValue) -> Value:
        if number == 1 and not isinstance(value, int):
            return b"renamed." + bytes(value)
        if number == 7 and not isinstance(value, int):
            return wire.encode_field(2, wire.LEN, b"jit(moved)/op") + wire.encode_field(
                4, wire.VARINT, 4242
            )
        return value

    def module_fields(number: int, wt: int, value: wire.FieldValue) -> Value:
        if number == 5 and isinstance(value, int):
            return value + 17
        return b"jit_other" if number == 1 else value

    return _rewrite(_rewrite(module, (3, 2), instruction), (), module_fields)


def _renumbered(module: bytes, offset: int) -> bytes:
    """Every instruction id, and every reference to one, moved by ``offset``."""

    def shift_ids(number: int, wt: int, value: wire.FieldValue) -> Value:
        if number == 35 and isinstance(value, int):
            return value + offset
        if number in (36, 37):  # operands, control predecessors
            ids = [v + offset for v in wire.packed_varints(value)]
            return ids[0] if isinstance(value, int) else b"".join(map(wire.encode_varint, ids))
        return value

    def root(number: int, wt: int, value: wire.FieldValue) -> Value:
        return value + offset if number == 6 and isinstance(value, int) else value

    return _rewrite(_rewrite(module, (3, 2), shift_ids), (3,), root)


def _one_opcode_changed(module: bytes) -> bytes:
    """The first ``tanh``/``sine``/``add`` of the module made another op: a real change."""
    done = False

    def change(number: int, wt: int, value: wire.FieldValue) -> Value:
        nonlocal done
        opcode = None if isinstance(value, int) else bytes(value)
        if number == 2 and not done and opcode in (b"tanh", b"sine", b"add"):
            done = True
            return b"cosine" if opcode != b"cosine" else b"tanh"
        return value

    changed = _rewrite(module, (3, 2), change)
    return changed if done else module


def test_program_digest_groups_as_the_canonical_lines(real_modules: list[bytes]) -> None:
    """Copies with other names, module ids and source metadata group with their original, real
    changes do not, in the pure walker's canonical lines and in the program digest alike."""
    variants: list[bytes] = []
    for module in real_modules:
        variants += [module, _rerun(module), _one_opcode_changed(module)]
    lines = [hlo.canonicalize(m).digest for m in variants]
    digests = [hlo_facts.scan_facts(m).program_digest for m in variants]
    raw = [hashlib.sha256(m).hexdigest() for m in variants]
    assert _partition(digests) == _partition(lines)
    # the variants do test something: reruns changed bytes but not the program...
    assert len(set(raw)) > len(set(lines))
    # ...and some opcode changes made another program
    assert len(set(lines)) > len(real_modules) * 1.2


def test_renumbered_module_is_another_program(real_modules: list[bytes]) -> None:
    """Ids are numbered per module, so a rerun keeps them: the digest keeps them too (Python
    then need not map operands to positions), where ``diff``'s canonical lines do not."""
    module = max(real_modules, key=len)
    renumbered = _renumbered(module, 1000)
    assert hlo.canonicalize(renumbered).digest == hlo.canonicalize(module).digest
    assert (
        hlo_facts.scan_facts(renumbered).program_digest
        != hlo_facts.scan_facts(module).program_digest
    )


def test_volatile_addresses_are_masked(real_modules: list[bytes]) -> None:
    """An address in a backend_config (host callbacks) is volatile on any instruction: the same
    program under another address, listed in the volatile fields in module order, beside the
    custom_partitioning metadata, exactly as the pure walker lists them."""
    module = next(
        m
        for m in real_modules
        if any(v.category == "custom-partitioning" for v in _key_volatile(hlo.canonicalize(m)))
    )

    a, b = _with_config(module, b"140245123456789"), _with_config(module, b" 140245987654321 ")
    fa, fb = hlo_facts.scan_facts(a), hlo_facts.scan_facts(b)
    assert fa.program_digest == fb.program_digest
    short = _with_config(module, b"1402459")
    assert fa.program_digest != hlo_facts.scan_facts(short).program_digest
    for variant, facts in ((a, fa), (b, fb)):
        assert facts.volatile == _key_volatile(hlo.canonicalize(variant))
    categories = [v.category for v in fa.volatile]
    assert categories.count("backend_config-pointer") >= 2 and "custom-partitioning" in categories
    assert categories[-1] != "custom-partitioning"  # the order matters: not simply appended


def _with_config(module: bytes, config: bytes) -> bytes:
    """The module with ``config`` as the backend_config of every instruction."""

    def instructions(number: int, wt: int, value: wire.FieldValue) -> Value:
        if number == 2 and not isinstance(value, int):
            kept = _rewrite(value, (), lambda n, _wt, v: b"" if n == 43 else v)
            return kept + wire.encode_field(43, wire.LEN, config)
        return value

    return _rewrite(module, (3,), instructions)


@pytest.mark.parametrize(
    "config",
    [b"140245123456789", b"\t\n 140245123456789 ", b" " * 200 + b"140245123456789", b"12345678 9"],
)
def test_address_configs_in_a_module_without_custom_calls(
    real_modules: list[bytes], config: bytes
) -> None:
    """The byte gate that spares most modules a look at every backend_config must let through
    every address-like config, on any instruction of a plain module (no custom call, no
    custom_partitioning), whatever its whitespace and length prefix (a config of 128 bytes or
    more has a two-byte length); what it lets through is then as the pure walker says."""
    plain = [m for m in real_modules if b"custom-call" not in m and b"custom_partitioning" not in m]
    module = max(plain, key=len)
    variant = _with_config(module, config)
    facts = hlo_facts.scan_facts(variant)
    assert facts.volatile == _key_volatile(hlo.canonicalize(variant))
    is_address = config.strip().isdigit()
    assert bool(facts.volatile) == is_address
    other = hlo_facts.scan_facts(_with_config(module, config.replace(b"4", b"7")))
    assert (facts.program_digest == other.program_digest) == is_address


def test_non_utf8_names_parse(real_modules: list[bytes]) -> None:
    """protobuf refuses invalid UTF-8 in ``string`` fields; the view declares bytes."""
    module = real_modules[0]
    renamed = _rewrite(module, (3, 2), lambda n, wt, v: b"\xff\xfe" if n == 1 else v)
    facts = hlo_facts.scan_facts(renamed)
    assert facts.summary == hlo.summarize(renamed)
    assert facts.program_digest == hlo_facts.scan_facts(module).program_digest


def test_damaged_modules_raise_wire_errors_only(real_modules: list[bytes]) -> None:
    """Truncated or corrupted bytes give WireError (the reader's "HLO module is malformed"),
    never another exception."""
    rng = random.Random(7)
    module = real_modules[-1]
    refused = 0
    for _ in range(200):
        damaged = bytearray(module[: rng.randrange(1, len(module))])
        for _ in range(rng.randrange(0, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            hlo_facts.scan_facts(bytes(damaged))
        except wire.WireError:
            refused += 1
    assert refused > 100  # most cuts end inside a field


def test_view_descriptor_is_protobufs_own_encoding() -> None:
    """The hand-encoded view file equals the one protobuf's ``descriptor_pb2`` builds from the
    same fields (the oracle: protobuf's own encoder)."""
    from google.protobuf import descriptor_pb2

    built = descriptor_pb2.FileDescriptorProto(
        name="cachedoctor/hlo_view.proto", package="cachedoctor_hlo_view", syntax="proto2"
    )
    kinds = {"b": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES}
    kinds["i"] = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
    views = {**hlo_facts._VIEW, **hlo_facts._SIGNATURE_VIEW}
    for message_name, fields in views.items():
        message = built.message_type.add(name=message_name)
        for number, name, kind, repeated in fields:
            field = message.field.add(name=name, number=number)
            field.label = (
                descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
                if repeated
                else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
            )
            if kind in kinds:
                field.type = kinds[kind]
            else:
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                field.type_name = f".cachedoctor_hlo_view.{kind}"
    assert hlo_facts.view_file_descriptor() == built.SerializeToString()


def test_public_protobuf_route_reads_the_same(real_modules: list[bytes]) -> None:
    """Facts, signatures and refusals are the same whichever route made the views' classes,
    and the direct route is the one taken where upb is installed."""
    rng = random.Random(11)
    damaged = []
    for module in real_modules[-3:]:
        for _ in range(40):
            cut = bytearray(module[: rng.randrange(1, len(module))])
            cut[rng.randrange(len(cut))] = rng.randrange(256)
            damaged.append(bytes(cut))

    def read_all() -> list[object]:
        out: list[object] = []
        for module in [*real_modules, *damaged]:
            try:
                out.append((hlo_facts.scan_facts(module), hlo_facts.signature(module)))
            except wire.WireError as exc:
                out.append(str(exc))
        return out

    from google.protobuf import message_factory

    made_public: list[str] = []
    public_class = message_factory.GetMessageClass

    def counted(descriptor: Any) -> Any:
        made_public.append(descriptor.name)
        return public_class(descriptor)

    _forget_view_classes()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(message_factory, "GetMessageClass", counted)
            direct = read_all()
            assert made_public == []  # upb is installed with protobuf's wheels: used directly
            _forget_view_classes()
            patch.setitem(sys.modules, "google._upb", None)  # its import fails
            public = read_all()
            assert "Module" in made_public
        with pytest.MonkeyPatch.context() as patch:  # a upb whose private API changed
            import google._upb

            patch.setattr(message_factory, "GetMessageClass", counted)
            made_public.clear()
            _forget_view_classes()
            changed = types.SimpleNamespace(DescriptorPool=google._upb._message.DescriptorPool)
            patch.setattr(google._upb, "_message", changed)  # no MessageMeta
            changed_api = read_all()
            assert "Module" in made_public
    finally:
        _forget_view_classes()
    assert public == direct
    assert changed_api == direct
    assert sum(isinstance(found, str) for found in direct) > 20


def _forget_view_classes() -> None:
    for made in (hlo_facts._class_maker, hlo_facts._module_class, hlo_facts._signature_parse):
        made.cache_clear()
