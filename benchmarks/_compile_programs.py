"""Compile a range of distinct, real JAX programs into the persistent cache (run by generate.py).

Usage: python _compile_programs.py START STOP   (JAX_COMPILATION_CACHE_DIR names the cache)
       python _compile_programs.py FAMILY:START:STOP ...   (indices within each family)

Program ``i`` is fully determined by ``i``: the same index always builds the same program, so a
corpus can be regenerated or extended. Programs are compiled (``.lower().compile()``), not run:
compiling is what writes the cache entry. One process compiles many programs to amortise JAX's
start-up. Families, from small to large:

- ``ew``: elementwise chains (1-30 ops, several shapes and dtypes)
- ``mlp``: dense layers of various widths
- ``norm``: reductions, softmax, layer norm
- ``loop``: ``lax.fori_loop`` / ``lax.scan`` bodies
- ``shard``: programs sharded over the 8 host devices (num_partitions = 8)
- ``cp``: ``custom_partitioning`` programs (the unstable-key bug: a new key every process)
- ``unrolled``: Python-unrolled stacks of 10-300 layers (large HLO, 20-250 KB entries)
- ``const``: programs closing over big arrays (weights baked in as constants: 0.1-6 MB entries)

Families after these build the *distinct* corpora (``generate.py``: ``dist-*``), where most
entries are programs of their own rather than copies:

- ``deep``: Python-unrolled stacks of 150-1,000 layers with per-layer activations drawn at random
  (large HLO: about 1.1-9 MB decompressed entries; 10-70 CPU-seconds each to compile)
- ``varied``: thousands of cheap small programs, each distinct (random op chains over random
  shapes and dtypes, optional reduction or matmul, and a constant of its own, so no two coincide)
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import time

flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# Family table: (name, how many). Order is fixed; indices map into it.
FAMILIES = [
    ("ew", 140),
    ("mlp", 50),
    ("norm", 40),
    ("loop", 24),
    ("shard", 24),
    ("cp", 10),
    ("unrolled", 12),
    ("const", 14),
    ("deep", 20),
    ("varied", 30000),
]
TOTAL = sum(n for _, n in FAMILIES)
UNARY = [jnp.sin, jnp.cos, jnp.tanh, jnp.exp, jnp.abs, jnp.sqrt, jnp.log1p, jax.nn.relu]
SHAPES = [(16,), (1024,), (4096,), (128, 128), (512, 256), (64, 64, 8)]
DTYPES = [jnp.float32, jnp.float32, jnp.bfloat16, jnp.float16]
VARIED_SHAPES = [(8,), (32,), (100,), (256,), (1000,), (2048,), (16, 16), (64, 32), (128, 256)]
VARIED_NAMES = ["loss_fn", "train_step", "predict", "eval_step", "update", "apply", "step", "f"]
BINARY = [jnp.add, jnp.multiply, jnp.maximum, jnp.minimum, jnp.subtract]
ACTIVATIONS = [jnp.tanh, jax.nn.relu, jax.nn.gelu, jax.nn.sigmoid, jnp.sin]
# depths of the ``deep`` family: 7.3-9 KB of decompressed entry and ~0.07 CPU-s of compiling a layer
DEEP_DEPTHS = [150, 160, 170, 180, 200, 220, 240, 260, 285, 310]
DEEP_DEPTHS += [340, 380, 420, 470, 540, 620, 700, 800, 900, 1000]


def family_of(i: int) -> tuple[str, int]:
    for name, n in FAMILIES:
        if i < n:
            return name, i
        i -= n
    raise IndexError(i)


def _named(fn, name):  # type: ignore[no-untyped-def]
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


def _arg(shape, dtype=jnp.float32, sharding=None):  # type: ignore[no-untyped-def]
    """An abstract argument: lowering needs no real array (and writes no helper entries)."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def build(i: int):  # type: ignore[no-untyped-def]
    """(jitted function, example args) for program ``i``."""
    fam, j = family_of(i)
    rng = random.Random(1000 + i)
    if fam == "ew":
        ops = [rng.choice(UNARY) for _ in range(rng.randint(1, 30))]
        consts = [rng.uniform(0.5, 2.0) for _ in ops]
        shape, dtype = rng.choice(SHAPES), rng.choice(DTYPES)

        def ew(x):  # type: ignore[no-untyped-def]
            for op, c in zip(ops, consts, strict=True):
                x = op(x) * c + 0.1
            return x

        name = rng.choice(["f", "step", "update", "loss_fn", "apply"])
        return jax.jit(_named(ew, name)), (_arg(shape, dtype),)
    if fam == "mlp":
        widths = [rng.choice([32, 64, 128, 256, 512, 1024]) for _ in range(rng.randint(2, 9))]
        batch = rng.choice([1, 8, 32, 128])
        ws = [_arg((a, b)) for a, b in itertools.pairwise(widths)]

        def mlp(x, ws):  # type: ignore[no-untyped-def]
            for w in ws:
                x = jax.nn.gelu(x @ w)
            return jnp.sum(x**2)

        fn = jax.grad(mlp) if j % 3 == 0 else mlp
        return jax.jit(_named(fn, rng.choice(["mlp", "forward", "train_step"]))), (
            _arg((batch, widths[0])),
            ws,
        )
    if fam == "norm":
        shape = rng.choice([(8, 128), (64, 512), (32, 16, 256), (4, 1024)])
        kind = j % 4

        def norm(x):  # type: ignore[no-untyped-def]
            if kind == 0:
                return jax.nn.softmax(x, axis=-1)
            if kind == 1:
                m = x.mean(-1, keepdims=True)
                v = ((x - m) ** 2).mean(-1, keepdims=True)
                return (x - m) * lax.rsqrt(v + 1e-5)
            if kind == 2:
                return jnp.cumsum(x, axis=-1) / (1 + j)
            return jnp.sort(x, axis=-1)[..., : 1 + j % 7]

        return jax.jit(_named(norm, ["softmax", "layer_norm", "cumsum", "topk"][kind])), (
            _arg(shape),
        )
    if fam == "loop":
        n = rng.randint(3, 50)
        size = rng.choice([16, 128, 1024])

        def body(c, _):  # type: ignore[no-untyped-def]
            return jnp.tanh(c * 1.01 + j), c.sum()

        if j % 2:

            def loop(x):  # type: ignore[no-untyped-def]
                return lax.fori_loop(0, n, lambda k, c: jnp.sin(c) + k * 0.5 + j, x)
        else:

            def loop(x):  # type: ignore[no-untyped-def]
                return lax.scan(body, x, None, length=n)

        return jax.jit(_named(loop, "while_loop" if j % 2 else "scan_fn")), (_arg((size,)),)
    if fam == "shard":
        mesh = Mesh(jax.devices(), ("x",))
        sh = NamedSharding(mesh, P("x"))
        size = 8 * rng.choice([8, 64, 512])
        depth = rng.randint(1, 6)

        def sharded(x):  # type: ignore[no-untyped-def]
            for k in range(depth):
                x = jnp.sin(x) + x.sum() * (k + j)
            return x

        return jax.jit(_named(sharded, "sharded_step"), in_shardings=sh, out_shardings=sh), (
            _arg((size,), sharding=sh),
        )
    if fam == "cp":
        from jax.experimental.custom_partitioning import custom_partitioning

        mesh = Mesh(jax.devices(), ("x",))
        sh = NamedSharding(mesh, P("x"))
        add = float(j + 1)

        @custom_partitioning
        def op(x):  # type: ignore[no-untyped-def]
            return x

        def infer(mesh, arg_shapes, result_shape):  # type: ignore[no-untyped-def]
            return NamedSharding(mesh, P("x"))

        def partition(mesh, arg_shapes, result_shape):  # type: ignore[no-untyped-def]
            return mesh, (lambda x: x * add + 1.0), sh, (sh,)

        kwargs = {"infer_sharding_from_operands": infer, "partition": partition}
        try:
            op.def_partition(sharding_rule="i -> i", **kwargs)
        except TypeError:
            op.def_partition(**kwargs)

        def f(x):  # type: ignore[no-untyped-def]
            return op(x)

        return jax.jit(_named(f, "f"), in_shardings=sh, out_shardings=sh), (
            _arg((8 * (j + 1),), sharding=sh),
        )
    if fam == "unrolled":
        # layers with distinct constants and rolls do not fuse into one kernel, so the HLO and the
        # object code grow with depth (compile time grows faster: 300 layers take ~10 s)
        depth = [10, 16, 24, 32, 48, 64, 96, 128, 160, 200, 250, 300][j]
        width = rng.choice([64, 128])

        def unrolled(x, w):  # type: ignore[no-untyped-def]
            for k in range(depth):
                x = jnp.tanh(x @ w + k * 0.001)
                if k % 3 == 0:
                    x = jnp.roll(x, k % 7, axis=-1) * jnp.cos(x)
            return x

        return jax.jit(_named(unrolled, "transformer_stack")), (
            _arg((8, width)),
            _arg((width, width)),
        )
    if fam == "varied":
        return _varied(j, rng)
    if fam == "deep":
        return _deep(j, rng)
    # const: weights closed over become HLO constants, stored in the entry (and the object code)
    kib = [96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144][j]
    table = np.random.default_rng(i).standard_normal((kib * 256 // 64, 64)).astype(np.float32)

    def embed(ids):  # type: ignore[no-untyped-def]
        return jnp.take(table, ids % table.shape[0], axis=0).sum(-1)

    return jax.jit(_named(embed, "embed_lookup")), (_arg((16,), jnp.int32),)


def _varied(j: int, rng: random.Random):  # type: ignore[no-untyped-def]
    """A small program of its own: the float32 constant ``1 + j / 4096`` makes it unique."""
    shape, dtype = rng.choice(VARIED_SHAPES), rng.choice(DTYPES)
    steps = [
        (rng.choice(UNARY), None)
        if rng.random() < 0.6
        else (rng.choice(BINARY), rng.uniform(-2, 2))
        for _ in range(rng.randint(1, 12))
    ]
    tail = rng.choice(["none", "sum", "max", "mean", "matmul"])
    tag = np.float32(1 + j / 4096)  # exact in float32 for every j of the family: a literal

    def varied(x):  # type: ignore[no-untyped-def]
        x = x.astype(jnp.float32) * tag
        for op, c in steps:
            x = op(x) if c is None else op(x, c)
        if tail == "matmul" and x.ndim == 2:
            x = x @ x.T
        elif tail in ("sum", "max", "mean"):
            x = getattr(x, tail)(axis=-1)
        return x.astype(dtype)

    return jax.jit(_named(varied, rng.choice(VARIED_NAMES))), (_arg(shape, dtype),)


def _deep(j: int, rng: random.Random):  # type: ignore[no-untyped-def]
    """An unrolled stack (large HLO): layers with their own constants and activations."""
    depth, width = DEEP_DEPTHS[j], rng.choice([32, 64, 128])
    acts = [rng.choice(ACTIVATIONS) for _ in range(depth)]

    def deep(x, w):  # type: ignore[no-untyped-def]
        for k, act in enumerate(acts):
            x = act(x @ w + k * 0.001)
            if k % 3 == 0:
                x = jnp.roll(x, k % 7, axis=-1) * jnp.cos(x)
        return x

    name = rng.choice(["transformer_stack", "decoder_stack", "resnet_apply", "unet_forward"])
    return jax.jit(_named(deep, name)), (_arg((8, width)), _arg((width, width)))


def family_range(spec: str) -> range:
    """``FAMILY:START:STOP`` as program indices."""
    name, start, stop = spec.split(":")
    offset = 0
    for fam, n in FAMILIES:
        if fam == name:
            return range(offset + int(start), offset + min(int(stop), n))
        offset += n
    raise SystemExit(f"no family {name!r}")


def main() -> None:
    if len(sys.argv) == 3 and ":" not in sys.argv[1]:
        indices = range(int(sys.argv[1]), min(int(sys.argv[2]), TOTAL))
    else:
        indices = [i for spec in sys.argv[1:] for i in family_range(spec)]
    for i in indices:
        t0 = time.monotonic()
        fn, args = build(i)
        fn.lower(*args).compile()
        print(f"{i} {family_of(i)[0]} {time.monotonic() - t0:.2f}s", flush=True)
        if i % 500 == 499:
            jax.clear_caches()  # thousands of programs in one process: keep its memory flat


if __name__ == "__main__":
    main()
