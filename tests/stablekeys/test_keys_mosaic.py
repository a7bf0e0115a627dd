"""Canonicalisation 3: a Pallas TPU kernel's key no longer holds its source path and lines.

The kernels are lowered for the TPU on this CPU machine (JAX lowers Mosaic kernels without a
chip), from program files written into different folders, so the Mosaic bodies hold real debug
locations. JAX's own key is the oracle: up to jax 0.10 it differs between the folders (the bug);
from 0.11, where JAX strips the locations itself, JAX's own keys agree, and the stable hasher
then changes nothing. The compat session runs this file under every supported release.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cachedoctor.stablekeys import keys
from tests.support.scripts import load_script

jax = pytest.importorskip("jax")

KERNEL = """\
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
{comment}
def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + {rhs}


def add(x, y):
    return pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)
"""
VARIANTS = {
    "a": ("a", "", "y_ref[...]"),
    "b": ("b", "", "y_ref[...]"),  # the same file in another folder
    "a-comment": ("a2", "# one line more: the kernel moves down\n", "y_ref[...]"),
    "a-changed": ("a3", "", "y_ref[...] * 2"),  # the kernel's body changes
}


def _lowered(folder: Path, comment: str, rhs: str, unzipped: bool = False) -> Any:
    """The program's module, lowered for the TPU here (no chip needed), from ``folder``."""
    path = folder / "kernels.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(KERNEL.format(comment=comment, rhs=rhs))
    program = load_script(path, f"kernels_{folder.name}")
    x = jax.numpy.ones((8, 128), jax.numpy.float32)
    jitted = jax.jit(program.add)
    if not hasattr(jitted, "trace"):
        pytest.skip(f"jax {jax.__version__} cannot lower for another platform (jit(...).trace)")
    # jax 0.12 moves the locations out of the body into the config ("debug_locations"); kept
    # in the body here, as jax up to 0.10 writes it (and JAX's own strip falls back to it)
    unzip = getattr(jax.config, "jax_mosaic_unzip_debug_locations", None)
    if unzip is not None:
        jax.config.update("jax_mosaic_unzip_debug_locations", unzipped)
    try:
        return jitted.trace(x, x).lower(lowering_platforms=("tpu",)).compiler_ir("stablehlo")
    finally:
        if unzip is not None:
            jax.config.update("jax_mosaic_unzip_debug_locations", unzip)


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("kernels")
    return {name: _lowered(root / folder, c, r) for name, (folder, c, r) in VARIANTS.items()}


def _keys(module: Any) -> tuple[str, str, keys.KeyResult]:
    """(JAX's own key, the stable key, the stable hasher's result) for a CPU compile."""
    from jax._src import cache_key, compiler, xla_bridge

    backend = xla_bridge.get_backend()
    devices = np.array(jax.devices()[:1])
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    result = keys.stable_key(module, devices, options, backend, cache_dir="/tmp/cache")
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    return cache_key.get(module, devices, options, backend), result.key, result


def test_the_kernel_body_holds_its_source_path(modules: dict[str, Any]) -> None:
    """The premise: the lowered module's kernel config holds the program's path (base64 MLIR
    bytecode), and the folders give different configs."""
    import base64
    import json

    configs = {}
    for name, module in modules.items():
        (op,) = keys._mosaic_ops(module)
        from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

        config = json.loads(ir.StringAttr(op.attributes["backend_config"]).value)
        body = base64.b64decode(config["custom_call_config"]["body"])
        assert b"kernels.py" in body
        configs[name] = body
    assert len(set(configs.values())) == 4


def test_moved_kernels_share_a_key_and_a_changed_one_does_not(modules: dict[str, Any]) -> None:
    jax_keys, stable = {}, {}
    for name, module in modules.items():
        jax_keys[name], stable[name], _ = _keys(module)
    assert stable["a"] == stable["b"] == stable["a-comment"]
    assert stable["a-changed"] != stable["a"]  # never stale: a new body is a new key
    assert jax_keys["a-changed"] != jax_keys["a"]
    if keys.jax_strips_kernels():  # jax >= 0.11: JAX's own keys agree too
        assert jax_keys["a"] == jax_keys["b"] == jax_keys["a-comment"]
    else:  # the bug the hook fixes: each folder and line is a key of its own
        assert len({jax_keys["a"], jax_keys["b"], jax_keys["a-comment"]}) == 3


def test_the_hasher_changes_nothing_where_jax_strips_itself(modules: dict[str, Any]) -> None:
    _, _, result = _keys(modules["a"])
    stripped = [v for v in result.volatile if v.field.startswith("tpu_custom_call[")]
    if keys.jax_strips_kernels():
        assert stripped == [] and not result.changed
    else:
        assert [v.field for v in stripped] == ["tpu_custom_call[0].body"]
        assert stripped[0].canonical.startswith("stripped:") and result.sound


def test_the_program_module_is_left_as_it_was(modules: dict[str, Any]) -> None:
    """Invisible to the program: its module and its context come back unchanged."""
    module = modules["b"]
    before = module.operation.get_asm(enable_debug_info=True)
    allowed = module.context.allow_unregistered_dialects
    _keys(module)
    assert module.operation.get_asm(enable_debug_info=True) == before
    assert module.context.allow_unregistered_dialects == allowed


def test_stripped_exactly_as_jax_strips(modules: dict[str, Any]) -> None:
    """Where JAX has its own ``_strip_mosaic_debug_info`` (0.11 on), the hasher's strip gives the
    very config JAX's does, byte for byte."""
    from jax._src import cache_key as ck
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    if not hasattr(ck, "_strip_mosaic_debug_info"):
        pytest.skip(
            f"jax {jax.__version__} has no _strip_mosaic_debug_info; the compat session on "
            "jax 0.12 runs this comparison"
        )
    module = modules["a-comment"]
    with module.context:
        ours, theirs = keys._clone(module), keys._clone(module)
        keys._strip_kernels(ours, module.context)
        ck._strip_mosaic_debug_info(getattr(theirs, "opview", theirs))

        def config(op: Any) -> str:
            (kernel,) = keys._mosaic_ops(op)
            return str(ir.StringAttr(kernel.attributes["backend_config"]).value)

        assert config(ours) == config(theirs)


def test_unzipped_locations_stripped_exactly_as_jax_strips(tmp_path: Path) -> None:
    """jax 0.12 keeps a kernel's locations beside its body (``debug_locations``): the hasher
    drops them as JAX does, byte for byte."""
    from jax._src import cache_key as ck
    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    if getattr(jax.config, "jax_mosaic_unzip_debug_locations", None) is None:
        pytest.skip(f"jax {jax.__version__} keeps the locations in the body (no unzipping)")
    module = _lowered(tmp_path / "u", "", "y_ref[...]", unzipped=True)
    with module.context:
        ours, theirs = keys._clone(module), keys._clone(module)
        keys._strip_kernels(ours, module.context)
        ck._strip_mosaic_debug_info(getattr(theirs, "opview", theirs))  # type: ignore[attr-defined]
        (a,), (b,) = keys._mosaic_ops(ours), keys._mosaic_ops(theirs)
        config = str(ir.StringAttr(a.attributes["backend_config"]).value)
        assert config == str(ir.StringAttr(b.attributes["backend_config"]).value)
        assert "debug_locations" not in config


def test_a_kernel_that_does_not_parse_keeps_jax_key(modules: dict[str, Any]) -> None:
    """A body this jaxlib cannot read: the hasher refuses (the hook then keeps JAX's key and
    says so in one line), never hashing a half-stripped module."""
    if keys.jax_strips_kernels():
        pytest.skip(f"jax {jax.__version__} strips kernels itself: the hasher never parses one")
    holder = _unreadable_kernel(modules["a"])
    with modules["a"].context, pytest.raises(keys.KernelsNotStripped, match="does not parse"):
        _keys(holder)


def _unreadable_kernel(module: Any) -> Any:
    """A copy of ``module`` whose kernel body is MLIR's magic and nothing more: no jaxlib reads
    it."""
    import json

    from jax._src.lib.mlir import ir  # type: ignore[attr-defined]

    with module.context:
        broken = keys._clone(module)
        holder = getattr(broken, "opview", broken)
        (op,) = keys._mosaic_ops(holder)
        config = json.loads(ir.StringAttr(op.attributes["backend_config"]).value)
        config["custom_call_config"]["body"] = "TUzvUgAAAA=="
        op.attributes["backend_config"] = ir.StringAttr.get(json.dumps(config))
    return holder


def test_the_hook_gives_moved_kernels_one_key(
    modules: dict[str, Any], tmp_path: Path, capsys: Any
) -> None:
    """Through JAX's own ``get_cache_key`` with the hook installed, as a compile calls it: the
    moved kernels share a key, the changed one does not; a body the hook cannot strip keeps
    JAX's own key, and says so in one line."""
    from jax._src import compilation_cache as cc
    from jax._src import compiler, xla_bridge

    from cachedoctor.stablekeys import hook, hook_replay

    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    backend = xla_bridge.get_backend()
    devices = np.array(jax.devices()[:1])

    def key(module: Any) -> str:
        options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
        return str(cc.get_cache_key(module, devices, options, backend))

    plain = {name: key(m) for name, m in modules.items()}
    assert hook.install("stable", manifests=False)
    hook_replay._state.said.discard("mosaic")
    try:
        hooked = {name: key(m) for name, m in modules.items()}
        holder = _unreadable_kernel(modules["a"])
        capsys.readouterr()
        fallback = key(holder)
        said = capsys.readouterr().err
        options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
        original = cc.get_cache_key.__cachedoctor_original__  # type: ignore[attr-defined]
        jax_own = str(original(holder, devices, options, backend))
    finally:
        hook.uninstall()
        jax.config.update("jax_compilation_cache_dir", None)
    assert hooked["a"] == hooked["b"] == hooked["a-comment"] != hooked["a-changed"]
    assert hooked["a"] != plain["a"]  # the stable key, not JAX's
    if not keys.jax_strips_kernels():
        assert fallback == jax_own  # JAX's own key for the kernel it cannot strip
        assert said.count("\n") == 1 and "cannot strip the Pallas kernels' debug locations" in said
