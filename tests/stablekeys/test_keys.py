"""The stable hasher's building blocks: replay records, path canonicalisation, key combination."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cachedoctor.stablekeys import keys, replay, splithash

pytest.importorskip("jax")


def test_replay_arguments_round_trip() -> None:
    """Recorded shapes and shardings decode to what XLA passed (replay calls with them)."""
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

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

    # the attribute set by hand (no cachedoctor import) may hold the value itself
    def by_hand() -> None:  # pragma: no cover - never called here
        raise AssertionError

    by_hand.cachedoctor_depends_on = "tile=8"  # type: ignore[attr-defined]
    declared = replay.depends_on(lambda: "tile=8")(lambda: 0)
    assert replay.declared_inputs(types.SimpleNamespace(partition=by_hand)) == (
        replay.declared_inputs(types.SimpleNamespace(partition=declared))
    )
    assert replay.declared_inputs(types.SimpleNamespace()) is None


def test_canonical_path() -> None:
    assert keys.canonical_path("/c/dir/xla_gpu_kernel_cache_file", "/c/dir") == (
        "<cachedoctor:cache_dir>/xla_gpu_kernel_cache_file"
    )
    assert keys.canonical_path("/c/dir/x", "/c/dir/") == "<cachedoctor:cache_dir>/x"
    assert keys.canonical_path("/c/dirx/x", "/c/dir") == "/c/dirx/x"
    assert keys.canonical_path("/other/x", "/c/dir") == "/other/x"
    assert keys.canonical_path("/c/dir/x", None) == "/c/dir/x"


@pytest.mark.parametrize("cache_dir", ["s3://b/c/dir", "s3://b/c/dir/", "s3://b//c/dir"])
def test_canonical_path_of_a_bucket_cache_dir(cache_dir: str) -> None:
    """As JAX joins paths to a URL cache dir (etils.epath), checked against JAX's own join."""
    from jax._src import path as jax_path

    if not jax_path.epath_installed:
        pytest.skip("JAX reaches buckets through etils.epath: pip install '.[s3]' or '.[gcs]'")
    joined = str(jax_path.Path(cache_dir) / "xla_gpu_per_fusion_autotune_cache_dir")
    assert keys.canonical_path(joined, cache_dir) == (
        "<cachedoctor:cache_dir>/xla_gpu_per_fusion_autotune_cache_dir"
    )
    assert keys.canonical_path("s3://b/c/dirx/x", cache_dir) == "s3://b/c/dirx/x"
    assert keys.canonical_path("gs://b/c/dir/x", cache_dir) == "gs://b/c/dir/x"


def test_combine_depends_on_version_and_every_component() -> None:
    comps = [("computation", "00" * 32), ("compile_options", "11" * 32)]
    base = splithash.combine(comps)
    assert len(base) == 64
    assert splithash.combine(comps, hasher_version=splithash.HASHER_VERSION + 1) != base
    assert splithash.combine([comps[0], ("compile_options", "12" * 32)]) != base
    assert splithash.combine(list(reversed(comps))) != base


def _real_key_inputs(autotune_dir: str) -> tuple[Any, Any, Any, Any]:
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
    # a path outside the cache dir stays as it is, and counts exactly where JAX's key counts it
    # (jax <= 0.10 hashes the autotune dir; later releases leave it out)
    jax_hashes_the_path = _jax_key(*moved) != _jax_key(module, devices, options, backend)
    outside = keys.stable_key(*moved, cache_dir="/c/dir").key
    assert (outside != result.key) == jax_hashes_the_path

    def failing_jax_key(*args: object) -> tuple[str, object]:
        raise RuntimeError("simulated failure inside JAX's key code")

    monkeypatch.setattr(keys, "jax_key", failing_jax_key)
    with pytest.raises(RuntimeError, match="simulated"):
        keys.stable_key(module, devices, options, backend, cache_dir=cache_dir)
    assert options.SerializeAsString() == before


# -- the hasher in this process, against JAX's own get_cache_key on the same inputs ----------------

CP_MODULE = """
module @jit_cp attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {
    %0 = stablehlo.custom_call @CustomSPMDPartitioning(%arg0)
      {backend_config = "POINTER", api_version = 2 : i32} : (tensor<8xf32>) -> tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}"""


def _lowered(fn: Any) -> Any:
    import jax
    import jax.numpy as jnp

    return jax.jit(fn).lower(jnp.ones((4,), jnp.float32)).compiler_ir("stablehlo")


def _cp_module(pointer: str) -> Any:
    """A module with one custom_partitioning call, parsed by JAX's MLIR bindings."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    with mlir.make_ir_context():
        return ir.Module.parse(CP_MODULE.replace("POINTER", pointer))


def _target() -> tuple[Any, Any, Any]:
    """Devices, compile options and backend, the other arguments of JAX's get_cache_key."""
    import jax
    from jax._src import compiler, xla_bridge

    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    return np.array([[jax.devices()[0]]]), options, xla_bridge.get_backend()


def _jax_key(module: Any, devices: Any, options: Any, backend: Any) -> str:
    from jax._src import compilation_cache

    return str(compilation_cache.get_cache_key(module, devices, options, backend))


def double(x: Any) -> Any:
    return x * 2


def test_a_plain_module_keys_like_jax() -> None:
    """No volatile input: JAX's formula over our inputs is JAX's key; the stable key is the
    combination of the per-component digests that JAX hashed."""
    devices, options, backend = _target()
    module = _lowered(double)
    result = keys.stable_key(module, devices, options, backend, record_ir=True)
    assert result.jax_equivalent_key == _jax_key(module, devices, options, backend)
    assert result.module_name == "jit_double" and result.volatile == [] and result.sound
    assert not result.changed and result.to_replay == []
    assert next(iter(result.components)) == "computation"
    assert "compile_options" in result.components
    assert result.key == f"jit_double-{splithash.combine(list(result.components.items()))}"
    # the small components keep the bytes JAX hashed, so a manifest can be checked offline
    assert "computation" not in result.component_data
    for name, data in result.component_data.items():
        raw = base64.b64decode(data)
        assert hashlib.sha256(raw).hexdigest() == result.components[name], name
    assert result.xla_flags == keys.hashed_xla_flags()
    assert result.canonical_ir is not None and "@main" in result.canonical_ir
    assert "loc(" not in result.canonical_ir
    assert keys.stable_key(module, devices, options, backend).canonical_ir is None
    other = keys.stable_key(_lowered(lambda x: x * 3), devices, options, backend)
    assert other.key != result.key
    assert [n for n in other.components if other.components[n] != result.components[n]] == [
        "computation"
    ]


def test_a_module_is_walked_only_when_the_bytecode_jax_hashed_names_a_canonicalised_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hit on a plain module costs JAX's key code and a few digests: the module is not walked
    for custom calls when the bytecode JAX hashed names none. A module with a custom_partitioning
    call is walked and canonicalised (its pointer never reaches the key), and so is one whose
    hashed computation is not bytecode we can read (here: made to look so)."""

    walks: list[Any] = []
    real_walk = keys._custom_calls_of

    def counted(module: Any, targets: tuple[str, ...]) -> Any:
        walks.append(module)
        return real_walk(module, targets)

    monkeypatch.setattr(keys, "_custom_calls_of", counted)
    devices, options, backend = _target()
    plain = keys.stable_key(_lowered(double), devices, options, backend)
    assert walks == [] and plain.volatile == []
    first = keys.stable_key(_cp_module("1234"), devices, options, backend)
    # walked: its pointer found (no callbacks registered here, so kept: a miss, never a hit)
    assert walks and [v.raw for v in first.volatile] == ["1234"] and not first.sound
    monkeypatch.setattr(keys, "MLIR_BYTECODE_MAGIC", b"not bytecode")
    walks.clear()
    again = keys.stable_key(_lowered(double), devices, options, backend)
    assert walks and again.key == plain.key


@pytest.mark.parametrize(
    ("computation", "plain"),
    [
        (b"ML\xefR\x00 stablehlo.add", True),
        (b"ML\xefR\x00 stablehlo.custom_call CustomSPMDPartitioning", False),
        (b"ML\xefR\x00 stablehlo.custom_call tpu_custom_call", False),
        (b"module @jit_f { CustomSPMD }", False),  # text, not bytecode: walked
        (None, False),  # hashed in several pieces: walked
    ],
)
def test_which_hashed_computations_skip_the_walk(computation: bytes | None, plain: bool) -> None:
    assert keys._plain(computation) is plain


def test_the_split_hash_keeps_the_computation_it_hashed_in_one_piece() -> None:
    split = splithash._SplitHash()
    split.update(b"ML\xefR module")
    split.mark("computation")
    split.update(b"0.4")
    split.mark("jax_lib version")
    assert split.computation == b"ML\xefR module"
    assert split.total_hexdigest() == hashlib.sha256(b"ML\xefR module0.4").hexdigest()
    pieces = splithash._SplitHash()
    pieces.update(b"ML\xefR a")
    pieces.update(b"b")
    pieces.mark("computation")
    assert pieces.computation is None


def test_the_kept_key_functions_follow_a_program_that_replaces_jax_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rebound key functions are kept between lookups only while JAX's are the same
    objects: a program that replaces a function JAX's key code calls (JAX's own tests do) gets
    keys from the replacement at once, and its own keys again once it is put back."""
    from jax._src import cache_key as ck

    devices, options, backend = _target()
    module = _lowered(double)
    before = keys.stable_key(module, devices, options, backend).key
    real = ck._hash_xla_flags

    def salted(hash_obj: Any, *args: Any, **kwargs: Any) -> None:
        hash_obj.update(b"salt")
        real(hash_obj, *args, **kwargs)

    monkeypatch.setattr(ck, "_hash_xla_flags", salted)
    salted_key = keys.stable_key(module, devices, options, backend).key
    salted_result = keys.stable_key(module, devices, options, backend)
    assert salted_key != before
    # JAX's own key, salted too, is what the kept functions hashed
    assert salted_result.jax_equivalent_key == _jax_key(module, devices, options, backend)
    monkeypatch.setattr(ck, "_hash_xla_flags", real)
    assert keys.stable_key(module, devices, options, backend).key == before


def test_keys_computed_on_several_threads_at_once_are_each_their_own() -> None:
    """The kept functions are shared; each thread's key hashes into its own split hash."""
    from concurrent.futures import ThreadPoolExecutor

    devices, options, backend = _target()
    modules = [_lowered(fn) for fn in (double, lambda x: x * 3, lambda x: x + 1, lambda x: -x)]
    alone = [keys.stable_key(m, devices, options, backend).key for m in modules]

    def key_of(i: int) -> str:
        _, own_options, _ = _target()
        return keys.stable_key(modules[i % 4], devices, own_options, backend).key

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns inside each other's keys
    try:
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(key_of, range(256)))
    finally:
        sys.setswitchinterval(switching)
    assert together == [alone[i % 4] for i in range(256)]


def test_cache_dir_paths_are_relative_to_the_cache_dir(tmp_path: Path) -> None:
    devices, _, backend = _target()
    module = _lowered(double)
    results, jax_keys = [], []
    for cache_dir in (tmp_path / "a", tmp_path / "b"):
        _, options, _ = _target()
        debug = options.executable_build_options.debug_options
        debug.xla_gpu_kernel_cache_file = f"{cache_dir}/xla_gpu_kernel_cache_file"
        debug.xla_gpu_per_fusion_autotune_cache_dir = f"{cache_dir}/xla_gpu_per_fusion_autotune"
        results.append(keys.stable_key(module, devices, options, backend, cache_dir=str(cache_dir)))
        jax_keys.append(_jax_key(module, devices, options, backend))
        # the caller's options are left as they were
        assert debug.xla_gpu_kernel_cache_file.startswith(str(cache_dir))
    assert jax_keys[0] != jax_keys[1] and results[0].key == results[1].key
    # without cache_dir, the hasher takes JAX's configured cache directory (as the hook does)
    import jax

    _, options, _ = _target()
    options.executable_build_options.debug_options.xla_gpu_kernel_cache_file = (
        f"{tmp_path}/b/xla_gpu_kernel_cache_file"
    )
    option = "jax_compilation_cache_dir"
    previous = getattr(jax.config, option)
    jax.config.update(option, f"{tmp_path}/b")  # type: ignore[no-untyped-call]
    try:
        configured = keys.stable_key(module, devices, options, backend)
    finally:
        jax.config.update(option, previous)  # type: ignore[no-untyped-call]
    assert configured.cache_dir == f"{tmp_path}/b" and configured.changed
    # JAX's own key of the options with the placeholder paths is what we hashed
    _, canonical, _ = _target()
    debug = canonical.executable_build_options.debug_options
    placeholder = keys.CACHE_DIR_PLACEHOLDER
    debug.xla_gpu_kernel_cache_file = f"{placeholder}/xla_gpu_kernel_cache_file"
    debug.xla_gpu_per_fusion_autotune_cache_dir = f"{placeholder}/xla_gpu_per_fusion_autotune"
    assert results[0].jax_equivalent_key == _jax_key(module, devices, canonical, backend)
    assert results[0].changed and results[0].sound
    assert [(v.field, v.raw, v.canonical) for v in results[1].volatile] == [
        (f"debug_options.{name}", f"{tmp_path}/b/{leaf}", f"<cachedoctor:cache_dir>/{leaf}")
        for name, leaf in [
            ("xla_gpu_per_fusion_autotune_cache_dir", "xla_gpu_per_fusion_autotune"),
            ("xla_gpu_kernel_cache_file", "xla_gpu_kernel_cache_file"),
        ]
    ]
    # a path outside the cache directory is an input like any other
    _, elsewhere, _ = _target()
    elsewhere.executable_build_options.debug_options.xla_gpu_kernel_cache_file = "/x/kernels"
    moved = keys.stable_key(module, devices, elsewhere, backend, cache_dir=str(tmp_path / "a"))
    assert moved.volatile == [] and moved.key != results[0].key
    assert moved.jax_equivalent_key == _jax_key(module, devices, elsewhere, backend)


class _Callbacks:
    """Stands in for JAX's registered partitioner info (a weak-referenceable object)."""

    def __init__(self, partition: Any) -> None:
        self.partition = partition


def test_custom_partitioning_pointers_become_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax._src import custom_partitioning as cp

    devices, options, backend = _target()
    registered = {
        b"1111": _Callbacks(lambda: 0),
        b"2222": _Callbacks(lambda: 0),
        b"3333": _Callbacks(replay.depends_on(lambda: "tile=4")(lambda: 0)),
        b"4444": _Callbacks(replay.depends_on(lambda: "tile=4")(lambda: 0)),
        b"5555": _Callbacks(replay.depends_on(lambda: 1 / 0)(lambda: 0)),
    }
    for pointer, info in registered.items():
        monkeypatch.setitem(cp._sharding_callbacks, pointer, info)

    def key(pointer: str) -> keys.KeyResult:
        return keys.stable_key(_cp_module(pointer), devices, options, backend)

    first, second = key("1111"), key("2222")
    assert first.key == second.key and first.to_replay == [(0, b"1111")]
    assert [(v.field, v.raw, v.canonical, v.reason) for v in first.volatile] == [
        ("custom_call[0].backend_config", "1111", keys.CP_REPLAY, None)
    ]
    replay_module = _cp_module(keys.CP_REPLAY)
    assert first.jax_equivalent_key == _jax_key(replay_module, devices, options, backend)
    # declared inputs decide the key instead of a replay
    declared = key("3333")
    assert declared.key == key("4444").key != first.key and declared.to_replay == []
    placeholder = declared.volatile[0].canonical
    assert placeholder.startswith(keys.CP_PREFIX + "declared:")
    declared_module = _cp_module(placeholder)
    assert declared.jax_equivalent_key == _jax_key(declared_module, devices, options, backend)
    # no callbacks, or declared inputs that cannot be read: the pointer stays (a miss, never a
    # wrong hit), and the result says why
    for raw, reason in [
        ("6666", "no callbacks registered"),
        ("5555", "depends_on raised ZeroDivisionError: division by zero"),
    ]:
        kept = key(raw)
        assert [(v.field, v.raw, v.canonical, v.reason) for v in kept.volatile] == [
            ("custom_call[0].backend_config", raw, raw, reason)
        ]
        assert not kept.sound and kept.to_replay == []
        assert kept.jax_equivalent_key == _jax_key(_cp_module(raw), devices, options, backend)
    assert key("6666").key != key("7777").key
    # every custom call is looked at, whatever came before it
    call = '{backend_config = "SECOND", api_version = 2 : i32} : (tensor<8xf32>) -> tensor<8xf32>'
    two_calls = CP_MODULE.replace(
        "return %0", f"%1 = stablehlo.custom_call @CustomSPMDPartitioning(%0) {call}\n    return %1"
    )
    for first_pointer in ("6666", "5555"):
        from jax._src.interpreters import mlir
        from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

        with mlir.make_ir_context():
            module = ir.Module.parse(
                two_calls.replace("POINTER", first_pointer).replace("SECOND", "1111")
            )
        both = keys.stable_key(module, devices, options, backend)
        assert [(v.field, v.canonical) for v in both.volatile] == [
            ("custom_call[0].backend_config", first_pointer),
            ("custom_call[1].backend_config", keys.CP_REPLAY),
        ]
        assert both.to_replay == [(1, b"1111")]
    plain = _lowered(double)
    assert keys.canonical_module(plain) == (plain, [], [])


def test_replayed_keys_extend_the_base_key() -> None:
    devices, options, backend = _target()
    result = keys.stable_key(_lowered(double), devices, options, backend)
    one, two = keys.replayed_key(result, "aa" * 32), keys.replayed_key(result, "bb" * 32)
    assert len({one, two, result.key}) == 3
    assert one.startswith("jit_double-") and len(one) == len(result.key)


def test_xla_flags_are_hashed_as_jax_hashes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flags we report are the ones that change JAX's key: an excluded one does not."""
    devices, options, backend = _target()
    module = _lowered(double)

    def hashed(flags: str) -> tuple[list[str], str, str]:
        monkeypatch.setenv("XLA_FLAGS", flags)
        result = keys.stable_key(module, devices, options, backend)
        return result.xla_flags, result.key, _jax_key(module, devices, options, backend)

    monkeypatch.setattr("sys.argv", ["prog", "--xla_cpu_from_argv=1", "-v"])
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_x=1")
    flags, key, jax_key = hashed("--xla_dump_to=/a --xla_cpu_b=1")
    assert flags == ["--xla_cpu_b=1", "--xla_cpu_from_argv=1", "--xla_tpu_x=1"]
    flags2, key2, jax_key2 = hashed("--xla_cpu_b=1 --xla_dump_to=/b")
    assert (flags2, key2) == (flags, key) and jax_key2 == jax_key
    flags3, key3, jax_key3 = hashed("--xla_cpu_b=2")
    assert key3 != key and jax_key3 != jax_key and "--xla_cpu_b=2" in flags3
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    assert hashed("--xla_cpu_b=2")[0] == ["--xla_cpu_b=2", "--xla_cpu_from_argv=1"]
    # arguments with one of JAX's flag prefixes are hashed too
    from jax._src import cache_key as ck

    monkeypatch.setattr(ck, "get_flag_prefixes", lambda: ["--my_backend"])
    monkeypatch.setattr("sys.argv", ["prog", "--my_backend_x=1", "--other=1"])
    flags4, key4, jax_key4 = hashed("--xla_cpu_b=2")
    assert flags4 == ["--my_backend_x=1", "--xla_cpu_b=2"]
    monkeypatch.setattr("sys.argv", ["prog", "--my_backend_x=2", "--other=2"])
    _, key5, jax_key5 = hashed("--xla_cpu_b=2")
    assert key5 != key4 and jax_key5 != jax_key4


def test_changed_internals_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook falls back to JAX when JAX's key code is not what the hasher was written for."""
    from jax._src import cache_key as ck
    from jax._src import compilation_cache as cc
    from jax._src import custom_partitioning as cp

    splithash.check_internals()  # the installed JAX passes
    real_get_cache_key = cc.get_cache_key

    def wrapped(module: Any, devices: Any, compile_options: Any, backend: Any, x: Any = 0) -> str:
        raise AssertionError("never called")

    wrapped.__cachedoctor_original__ = real_get_cache_key  # type: ignore[attr-defined]
    monkeypatch.setattr(cc, "get_cache_key", wrapped)
    assert splithash.jax_get_cache_key() is real_get_cache_key
    splithash.check_internals()  # the hook's own wrapper is seen through
    monkeypatch.undo()

    def fails(message: str) -> None:
        splithash._checked.clear()
        with pytest.raises(splithash.InternalsChanged) as info:
            splithash.check_internals()
        assert str(info.value) == message
        monkeypatch.undo()
        splithash._checked.clear()

    monkeypatch.setattr(ck, "get", lambda *a: 0)
    fails("jax._src.cache_key.get no longer hashes through hashlib.sha256")

    def unlogged(*args: Any) -> Any:
        return hashlib.sha256()  # hashes, but no longer logs each component

    monkeypatch.setattr(ck, "get", unlogged)
    fails("jax._src.cache_key.get no longer hashes through hashlib.sha256")
    monkeypatch.setattr(cc, "get_cache_key", lambda module, devices, options, backend, x: 0)
    fails("compilation_cache.get_cache_key no longer calls cache_key.get")

    def renamed(module: Any, devices: Any, options: Any, backend: Any, x: Any = 0) -> Any:
        return cache_key.get(module)  # type: ignore[name-defined]  # noqa: F821 - never run: only its names are read

    monkeypatch.setattr(cc, "get_cache_key", renamed)
    fails("unexpected get_cache_key signature ['module', 'devices', 'options', 'backend', 'x']")

    def extra(module: Any, devices: Any, compile_options: Any, backend: Any) -> Any:
        return cache_key.get(module)  # type: ignore[name-defined]  # noqa: F821 - never run: only its names are read

    monkeypatch.setattr(cc, "get_cache_key", extra)
    fails("unexpected get_cache_key signature ['module', 'devices', 'compile_options', 'backend']")
    monkeypatch.delattr(cp, "_sharding_callbacks")
    fails("jax._src.custom_partitioning._sharding_callbacks is gone")
    # the answer is remembered for the same pair of JAX functions
    splithash.check_internals()
    monkeypatch.delattr(cp, "_sharding_callbacks")
    splithash.check_internals()
    monkeypatch.undo()


# -- recording and replaying partitioner calls, with stand-in callbacks ---------------------------


def _infer_args() -> tuple[Any, ...]:
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    shape = xc.Shape.array_shape(np.dtype("float32"), (8,))
    return [shape], [xc.HloSharding.iota_tile((2,))], shape


def test_recorded_calls_are_kept_per_expected_pointer(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    monkeypatch.setattr(replay, "_calls", {})
    monkeypatch.setattr(replay, "_overflow", set())
    results = [xc.HloSharding.replicate()]
    record = replay._recorder("infer", lambda *args: results[0])
    args = _infer_args()
    assert record(*args, b"not-expected") is results[0]  # XLA's answer passes through
    replay.expect([b"p1", b"p2"])
    record(*args, b"p1")
    record(*args, b"p1")  # the same call again is kept once
    results[0] = xc.HloSharding.iota_tile((2,))
    record(*args, b"p1")
    recorded = replay.take([b"p1", b"p2"])
    assert recorded is not None and recorded[1] == []
    first, second = recorded[0]
    assert first["fn"] == "infer" and first["args"] == json.loads(json.dumps(first["args"]))
    assert first["args"] == second["args"] and first["digest"] != second["digest"]
    assert replay.take([b"p1"]) is None  # taken: no longer recorded
    assert replay.calls_digest(recorded) != replay.calls_digest([[first], []])
    assert replay.calls_digest(recorded) == replay.calls_digest(json.loads(json.dumps(recorded)))
    # a manifest rewritten with its keys in another order commits to the same calls
    reordered = [
        [{k: call[k] for k in sorted(call, reverse=True)} for call in op] for op in recorded
    ]
    assert replay.calls_digest(reordered) == replay.calls_digest(recorded)
    # a call that cannot be recorded spoils its pointer, but never XLA's compile
    replay.expect([b"p3"])
    assert record("not", "shapes", None, b"p3") is results[0]
    assert replay.take([b"p3"]) is None
    monkeypatch.setattr(replay, "_MAX_CALLS_PER_OP", 1)
    replay.expect([b"p4"])
    record(*args, b"p4")
    assert replay.take([b"p4"]) is not None
    replay.expect([b"p4"])
    record(*args, b"p4")
    results[0] = xc.HloSharding.replicate()
    record(*args, b"p4")
    assert replay.take([b"p4"]) is None
    # expecting a pointer again starts afresh, even after an overflow
    replay.expect([b"p5"])
    record(*args, b"p5")
    results[0] = xc.HloSharding.iota_tile((2,))
    record(*args, b"p5")
    replay.expect([b"p5"])
    record(*args, b"p5")
    assert replay.take([b"p5"]) is not None


def test_replay_compares_what_the_callbacks_return_now(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    monkeypatch.setattr(replay, "_calls", {})
    monkeypatch.setattr(replay, "_overflow", set())
    answer: list[Any] = [xc.HloSharding.iota_tile((2,))]
    threads = []

    def infer(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        if isinstance(answer[0], Exception):
            raise answer[0]
        assert [str(a) for a in args[:-1]] == [str(a) for a in _infer_args()]
        assert args[-1] == b"p"  # the pointer by which JAX finds the op's callbacks
        return answer[0]

    monkeypatch.setattr(replay, "_originals", {})
    assert replay.reproduces([], []) == "the partition recorder is not installed"
    monkeypatch.setattr(replay, "_originals", dict.fromkeys(replay.ENTRY_POINTS, infer))
    replay.expect([b"p"])
    replay._recorder("infer", infer)(*_infer_args(), b"p")
    calls = replay.take([b"p"])
    assert calls is not None
    assert replay.reproduces(calls, [b"p"]) is None
    assert threads[-1] == "cachedoctor-replay"  # a fresh thread, as XLA calls the partitioner
    assert replay.reproduces(calls, []) == "1 recorded custom calls, the module has 0"
    answer[0] = xc.HloSharding.replicate()
    assert replay.reproduces(calls, [b"p"]) == "custom call 0: infer returned something else"
    answer[0] = ValueError("boom")
    assert replay.reproduces(calls, [b"p"]) == "replay raised ValueError: boom"


def test_partition_digest_ignores_debug_locations() -> None:
    """The per-shard module is compared without the locations of the Python frames that built it."""
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    def bytecode(text: str) -> bytes:
        with mlir.make_ir_context():
            return bytes(mlir.module_to_bytecode(ir.Module.parse(text)))

    body = "func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {{ return %arg0 : {} }}"
    plain = bytecode("module {" + body.format("tensor<4xf32>") + "}")
    located = bytecode("module {" + body.format('tensor<4xf32> loc("a.py":3:1)') + "}")
    other = bytecode("module {" + body.format("tensor<4xf32>").replace("@main", "@other") + "}")
    shardings = ([xc.HloSharding.replicate()], xc.HloSharding.replicate())
    digest = replay._digest("partition", (plain, *shardings))
    assert plain != located and replay._digest("partition", (located, *shardings)) == digest
    assert replay._digest("partition", (other, *shardings)) != digest
    tiled = ([xc.HloSharding.iota_tile((2,))], xc.HloSharding.replicate())
    assert replay._digest("partition", (plain, *tiled)) != digest
    assert replay._digest("infer", shardings[1]) != replay._digest("propagate", shardings[1])


def test_entry_points_are_checked_before_wrapping(monkeypatch: pytest.MonkeyPatch) -> None:
    from jax._src import custom_partitioning as cp

    found = replay._entry_points()  # installed or not (another test may have installed it)
    assert {k: fn.__name__ for k, fn in found.items()} == {
        k: name for k, (name, _) in replay.ENTRY_POINTS.items()
    }
    # from here on, as before install(): JAX's own functions in cp, no originals kept
    for kind, original in replay._originals.items():
        monkeypatch.setattr(cp, replay.ENTRY_POINTS[kind][0], original)
    monkeypatch.setattr(replay, "_originals", {})
    name = replay.ENTRY_POINTS["infer"][0]

    def renamed(arg_shapes: Any, arg_shardings: Any, result_shape: Any, pointer: Any) -> Any:
        raise AssertionError

    monkeypatch.setattr(cp, name, renamed)
    with pytest.raises(replay.ReplayUnavailable) as info:
        replay._entry_points()
    assert str(info.value) == (
        f"{name} takes ['arg_shapes', 'arg_shardings', 'result_shape', 'pointer'], expected"
        " ['arg_shapes', 'arg_shardings', 'result_shape', 'backend_string']"
    )
    monkeypatch.delattr(cp, name)
    with pytest.raises(
        replay.ReplayUnavailable, match=f"^jax._src.custom_partitioning.{name} is gone$"
    ):
        replay._entry_points()


def test_split_hash_keeps_small_components_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Components up to the limit keep their bytes (for offline checks), larger ones only the
    digest; the count starts afresh with each component."""
    monkeypatch.setattr(splithash, "_RAW_COMPONENT_LIMIT", 16)
    split = splithash._SplitHash()
    split.update(b"a" * 10)
    split.update(b"b" * 6)
    split.mark("at_limit")
    split.update(b"c" * 16)
    split.mark("again_at_limit")
    split.update(b"d" * 17)
    split.mark("over")
    split.update(b"e")
    split.mark("computation")
    assert {n: base64.b64decode(d) for n, d in splithash.component_data(split.pieces).items()} == {
        "at_limit": b"a" * 10 + b"b" * 6,
        "again_at_limit": b"c" * 16,
    }
    assert dict(split.components) == {
        name: hashlib.sha256(data).hexdigest()
        for name, data in [
            ("at_limit", b"a" * 10 + b"b" * 6),
            ("again_at_limit", b"c" * 16),
            ("over", b"d" * 17),
            ("computation", b"e"),
        ]
    }
    assert (
        split.total_hexdigest()
        == hashlib.sha256(b"a" * 10 + b"b" * 6 + b"c" * 16 + b"d" * 17 + b"e").hexdigest()
    )
