"""One process of the stale-hit suite (tests/stablekeys/test_hook_stale.py): many
custom_partitioning ops.

Each case is its own jitted function (module ``jit_case_<name>``) around a custom_partitioning op
whose partitioned computation adds a value ``v`` to its input; ``v`` comes from
``CACHEDOCTOR_STALE_V`` through a different Python route per case. Prints ``case <name> <out>``
where ``out`` is the first element of the result (the input starts at 0, so it must equal ``v``).
``CACHEDOCTOR_STALE_CASES`` (comma-separated) limits the cases.
"""

import collections
import dataclasses
import enum
import functools
import os
import pathlib
import random
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(__file__), "..", "..", "src", "cachedoctor", "programs")
)
from _common import setup_jax

jax = setup_jax()
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.custom_partitioning import custom_partitioning  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

V = float(os.environ["CACHEDOCTOR_STALE_V"])
FILE = pathlib.Path(os.environ["CACHEDOCTOR_STALE_FILE"])
FILE.write_text(str(V))  # read back at trace time by the "file" case


# --- the routes: each returns v when called inside the partition callback -----------------------


def from_env():
    return float(os.environ["CACHEDOCTOR_STALE_V"])


def from_file():
    return float(FILE.read_text())


def attr_holder():
    return None


attr_holder.v = V  # a function's __dict__


def from_function_attribute():
    return attr_holder.v


class Color(enum.Enum):
    RED = 1


Color.RED.v = V  # an enum member's attribute


def from_enum_member():
    return Color.RED.v


def _make_wrapped(value):
    @functools.wraps(jnp.add)  # looks like jax.numpy.add to anyone reading __module__
    def add(x, y):
        return jnp.add(x, y) + value

    return add


WRAPPED_ADD = _make_wrapped(V)


def from_wraps_wrapper():
    return WRAPPED_ADD(0.0, 0.0)


# same bytes, field names swapped: only the structured dtype tells the values apart
_names = ("a", "b") if V == 1.0 else ("b", "a")
STRUCTURED = np.array([(1.0, V)], dtype=[(_names[0], "f4"), (_names[1], "f4")])


def from_structured_array():
    return float(STRUCTURED["a"][0])


BF16 = np.array([V], dtype=ml_dtypes.bfloat16)


def from_ml_dtypes_array():
    return float(BF16[0])


np.random.seed(int(V))


def from_np_random_seed():
    return float(np.random.get_state()[1][0])  # the seed: reading does not advance the state


@dataclasses.dataclass(frozen=True)
class Config:
    v: float


CONFIG = Config(V)


def from_dataclass():
    return CONFIG.v


class Slotted:
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v


SLOTTED = Slotted(V)


def from_slots():
    return SLOTTED.v


class Box:
    def __init__(self, a, b):
        self.a, self.b = a, b


# the registry entry, not the value, changes: flatten picks a different field
if V == 1.0:
    jax.tree_util.register_pytree_node(Box, lambda b: ((b.a,), None), lambda _, c: Box(c[0], 0))
else:
    jax.tree_util.register_pytree_node(Box, lambda b: ((b.b,), None), lambda _, c: Box(0, c[0]))
BOX = Box(1.0, 5.0)


def from_pytree_registry():
    return jax.tree_util.tree_leaves(BOX)[0]


TYPED_KEY = jax.random.key(int(V))


def from_typed_prng_key():
    return jax.random.key_data(TYPED_KEY)[-1].astype(jnp.float32)


DEFAULTS = collections.defaultdict(lambda: V)


def from_defaultdict_factory():
    return DEFAULTS["missing"]


class Meta(type):
    v = V


class WithMeta(metaclass=Meta):
    pass


def from_metaclass():
    return type(WithMeta).v


@functools.lru_cache(maxsize=8)
def from_lru_cache():
    return V


def from_sys_argv():
    return float(sys.argv[-1])


sys.argv.append(str(V))

_g = globals  # an alias of globals(): a dynamic lookup


def from_globals_alias():
    return _g()["V"]


def from_getframe():
    return sys._getframe().f_globals["V"]


jax.config.update("jax_log_compiles", V != 1.0)  # read on XLA's thread, not jit's


def from_config_flag():
    return 5.0 if jax.config.jax_log_compiles else 1.0


ROUTES = {
    name[len("from_") :]: fn for name, fn in dict(globals()).items() if name.startswith("from_")
}


# --- one custom_partitioning op per route ------------------------------------------------------


def make_op(route, jitted, noisy=False, declared=False):
    @custom_partitioning
    def op(x):
        return x

    def lower(x):
        if noisy:  # a different (if irrelevant) constant in the module on every call
            return x + route() + jnp.float32(random.random()) * 0
        return x + route()

    def partition(mesh, arg_shapes, result_shape):
        spec = NamedSharding(mesh, P("x"))
        return mesh, jax.jit(lower) if jitted else lower, spec, (spec,)

    def infer(mesh, arg_shapes, result_shape):
        return NamedSharding(mesh, P("x"))

    if declared:  # the escape hatch, set without importing cachedoctor
        partition.cachedoctor_depends_on = lambda: "deterministic enough"
    kwargs = {"partition": partition, "infer_sharding_from_operands": infer}
    try:
        op.def_partition(sharding_rule="i -> i", **kwargs)
    except TypeError:  # jax without Shardy sharding rules
        op.def_partition(**kwargs)
    return op


mesh = Mesh(jax.devices(), ("x",))
sharding = NamedSharding(mesh, P("x"))
x = jax.device_put(jnp.zeros(8, dtype=jnp.float32), sharding)
cases = {name: (False, False, False) for name in ROUTES}  # (jitted, noisy, declared)
cases["jit_wrapped"] = (True, False, False)
cases["noisy"] = (False, True, False)
cases["noisy_declared"] = (False, True, True)
routes = {**ROUTES, "jit_wrapped": from_env, "noisy": from_env, "noisy_declared": from_env}
wanted = [c for c in os.environ.get("CACHEDOCTOR_STALE_CASES", "").split(",") if c]
for name, (jitted, noisy, declared) in cases.items():
    if wanted and name not in wanted:
        continue
    op = make_op(routes[name], jitted, noisy, declared)

    def run(x, op=op):
        return op(x)

    run.__name__ = f"case_{name}"
    out = jax.jit(run, in_shardings=sharding, out_shardings=sharding)(x)
    print("case", name, float(out[0]), flush=True)
