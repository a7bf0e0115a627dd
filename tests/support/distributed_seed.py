"""One process of an N-process ``jax.distributed`` job on CPU running the seed's custom op.

argv: process_id port [num_processes, default 2]. The mesh spans 8 CPU devices, 8/N in each
process. Prints the process's shards of a custom_partitioning op (+1) and of a control without
one (*2).
"""

import contextlib
import os
import sys

process_id, port = int(sys.argv[1]), sys.argv[2]
num_processes = int(sys.argv[3]) if len(sys.argv) > 3 else 2
devices = f"--xla_force_host_platform_device_count={8 // num_processes}"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {devices}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

# older jax: multi-process CPU computations need gloo (newer ones use it by default)
with contextlib.suppress(Exception):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=num_processes, process_id=process_id)
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import numpy as np  # noqa: E402
from jax.experimental.custom_partitioning import custom_partitioning  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


@custom_partitioning
def add_one(x):
    return x


def partition(mesh, arg_shapes, result_shape):
    spec = NamedSharding(mesh, P("x"))
    return mesh, lambda x: x + 1, spec, (spec,)


def infer(mesh, arg_shapes, result_shape):
    return NamedSharding(mesh, P("x"))


kwargs = {"partition": partition, "infer_sharding_from_operands": infer}
try:
    add_one.def_partition(sharding_rule="i -> i", **kwargs)
except TypeError:  # jax without Shardy sharding rules
    add_one.def_partition(**kwargs)

mesh = Mesh(np.array(jax.devices()), ("x",))
sharding = NamedSharding(mesh, P("x"))
data = np.arange(8, dtype=np.float32)
x = jax.make_array_from_callback((8,), sharding, lambda index: data[index])


def custom(v):
    return add_one(v)


def plain(v):  # a control without custom_partitioning
    return v * 2


for fn in (custom, plain):
    out = jax.jit(fn, in_shardings=sharding, out_shardings=sharding)(x)
    local = sorted(float(v) for s in out.addressable_shards for v in np.asarray(s.data))
    print(f"{fn.__name__}:", local, flush=True)
jax.distributed.shutdown()
