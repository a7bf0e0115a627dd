"""A program for `why`'s tests: one jitted function over every CPU device, whose key each test
changes through one setting: ``WHY_DEVICES`` (host devices, default 8), ``WHY_EDIT=1`` (the
program computes something else), ``WHY_MOVE=N`` (N blank lines above the function: its source
lines move, the program stays), and JAX's own settings (``XLA_FLAGS``,
``JAX_DEFAULT_MATMUL_PRECISION``, ``JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY``)."""

import os

devices = os.environ.get("WHY_DEVICES", "8")
flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

SOURCE = """
def step(x, w):
    y = jnp.dot(x, w)
    return jnp.tanh(y) * SCALE + 1.0
"""
SCALE = 3.0 if os.environ.get("WHY_EDIT") == "1" else 2.0
namespace = {"jnp": jnp, "SCALE": SCALE}
exec(compile("\n" * int(os.environ.get("WHY_MOVE", "0")) + SOURCE, __file__, "exec"), namespace)

mesh = Mesh(np.array(jax.devices()), ("x",))
x = jax.device_put(np.ones((64, 16), np.float32), NamedSharding(mesh, P("x")))
w = jax.device_put(np.ones((16, 16), np.float32), NamedSharding(mesh, P()))
out = jax.jit(namespace["step"])(x, w)
print("result:", float(out.sum()))
