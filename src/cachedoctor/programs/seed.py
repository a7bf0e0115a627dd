"""The seed program: a custom_partitioning op under jax.jit on 8 devices.

Its CustomSPMDPartitioning custom call carries a Python object address in backend_config, so
plain JAX writes a new cache entry on every run. ``CACHEDOCTOR_SEED_ADD`` changes what the
partitioned computation adds (default 1.0), to show stale hits.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import setup_jax

jax = setup_jax()
import jax.numpy as jnp  # noqa: E402
from jax.experimental.custom_partitioning import custom_partitioning  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

ADD = float(os.environ.get("CACHEDOCTOR_SEED_ADD", "1.0"))


def compute_shard(x):
    return x + ADD


def infer_sharding_from_operands(mesh, arg_shapes, result_shape):
    return NamedSharding(mesh, P("x"))


def partition(mesh, arg_shapes, result_shape):
    return mesh, compute_shard, NamedSharding(mesh, P("x")), (NamedSharding(mesh, P("x")),)


@custom_partitioning
def custom_op(x):
    return x  # only its output shape matters


_kwargs = {"infer_sharding_from_operands": infer_sharding_from_operands, "partition": partition}
try:
    custom_op.def_partition(sharding_rule="i -> i", **_kwargs)
except TypeError:  # jax without Shardy sharding rules
    custom_op.def_partition(**_kwargs)


def f(x):
    return custom_op(x)


mesh = Mesh(jax.devices(), ("x",))
x = jax.device_put(jnp.arange(8, dtype=jnp.float32), NamedSharding(mesh, P("x")))
out = jax.jit(
    f, in_shardings=NamedSharding(mesh, P("x")), out_shardings=NamedSharding(mesh, P("x"))
)(x)
print("result:", [float(v) for v in out])
