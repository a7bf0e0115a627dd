"""The stable hasher's building blocks: replay records, path canonicalisation, key combination."""

from __future__ import annotations

import json
import os
import types

import numpy as np
import pytest

from cachedoctor.stablekeys import keys, replay

pytest.importorskip("jax")


def test_replay_arguments_round_trip() -> None:
    """Recorded shapes and shardings decode to what XLA passed (replay calls with them)."""
    from jax._src.lib import xla_client as xc

    shape = xc.Shape.array_shape(np.dtype("bfloat16"), (8, 4))
    tuple_shape = xc.Shape.tuple_shape([shape, xc.Shape.array_shape(np.dtype("int8"), ())])
    sharding = xc.HloSharding.iota_tile((2, 1))
    args = [[shape, tuple_shape], [sharding, xc.HloSharding.replicate()], shape, sharding]
    encoded = replay._encode_args("partition", args)
    decoded = replay._decode_args("partition", json.loads(json.dumps(encoded)))
    assert [str(s) for s in decoded[0]] == [str(shape), str(tuple_shape)]
    assert [str(s) for s in decoded[1]] == [str(sharding), str(xc.HloSharding.replicate())]
    assert str(decoded[2]) == str(shape) and decoded[3] == sharding


def test_declared_inputs_key_the_callback() -> None:
    calls = []

    def read() -> str:
        calls.append(1)
        return os.environ.get("CACHEDOCTOR_TEST_TILE", "4")

    @replay.depends_on(read)
    def partition(mesh, arg_shapes, result_shape):  # pragma: no cover - never called here
        raise AssertionError

    info = types.SimpleNamespace(partition=partition)
    first = replay.declared_inputs(info)
    os.environ["CACHEDOCTOR_TEST_TILE"] = "8"
    try:
        assert replay.declared_inputs(info) != first and len(calls) == 2
    finally:
        del os.environ["CACHEDOCTOR_TEST_TILE"]
    assert replay.declared_inputs(types.SimpleNamespace(partition=lambda: 0)) is None
    deterministic = replay.depends_on()(lambda: 0)
    assert replay.declared_inputs(types.SimpleNamespace(partition=deterministic))


def test_canonical_path() -> None:
    assert keys.canonical_path("/c/dir/xla_gpu_kernel_cache_file", "/c/dir") == (
        "<cachedoctor:cache_dir>/xla_gpu_kernel_cache_file"
    )
    assert keys.canonical_path("/c/dir/x", "/c/dir/") == "<cachedoctor:cache_dir>/x"
    assert keys.canonical_path("/c/dirx/x", "/c/dir") == "/c/dirx/x"
    assert keys.canonical_path("/other/x", "/c/dir") == "/other/x"
    assert keys.canonical_path("/c/dir/x", None) == "/c/dir/x"


def test_combine_depends_on_version_and_every_component() -> None:
    comps = [("computation", "00" * 32), ("compile_options", "11" * 32)]
    base = keys.combine(comps)
    assert len(base) == 64
    assert keys.combine(comps, hasher_version=keys.HASHER_VERSION + 1) != base
    assert keys.combine([comps[0], ("compile_options", "12" * 32)]) != base
    assert keys.combine(list(reversed(comps))) != base


def _real_key_inputs(autotune_dir: str) -> tuple[object, object, object, object]:
    """What JAX passes to get_cache_key for a small jitted function, with an autotune path."""
    import jax
    import jax.numpy as jnp
    from jax._src import compiler, xla_bridge

    module = jax.jit(lambda x: jnp.sin(x) * 2.0).lower(jnp.arange(8.0)).compiler_ir("stablehlo")
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    debug = options.executable_build_options.debug_options
    debug.xla_gpu_per_fusion_autotune_cache_dir = autotune_dir
    devices = np.array([[jax.devices("cpu")[0]]])
    return module, devices, options, xla_bridge.get_backend("cpu")


def test_stable_key_leaves_jax_compile_options_as_they_were(monkeypatch) -> None:
    """The cache-dir path is made relative on JAX's own options object for the key only: JAX
    then compiles with exactly the options it built, also when the key computation fails."""
    cache_dir = "/c/dir"
    autotune = f"{cache_dir}/xla_gpu_per_fusion_autotune_cache_dir"
    module, devices, options, backend = _real_key_inputs(autotune)
    before = options.SerializeAsString()

    result = keys.stable_key(module, devices, options, backend, cache_dir=cache_dir)
    assert options.SerializeAsString() == before
    assert [(v.raw, v.canonical) for v in result.volatile] == [
        (autotune, "<cachedoctor:cache_dir>/xla_gpu_per_fusion_autotune_cache_dir")
    ]
    # the key hashes the relative path: the same cache at another path has the same key
    moved = _real_key_inputs("/elsewhere/xla_gpu_per_fusion_autotune_cache_dir")
    assert keys.stable_key(*moved, cache_dir="/elsewhere").key == result.key
    assert keys.stable_key(*moved, cache_dir="/c/dir").key != result.key

    def failing_key_functions() -> tuple[object, dict[str, object]]:
        def get_cache_key(*args: object) -> str:
            raise RuntimeError("simulated failure inside JAX's key code")

        return get_cache_key, {}

    monkeypatch.setattr(keys, "_jax_key_functions", failing_key_functions)
    with pytest.raises(RuntimeError, match="simulated"):
        keys.stable_key(module, devices, options, backend, cache_dir=cache_dir)
    assert options.SerializeAsString() == before
