"""Modules JAX refuses to store beside ones it stores (issue 29): run with
``JAX_COMPILATION_CACHE_DIR`` set; argv names the functions to jit (default: all).

``jit_printing`` (jax.debug.print), ``jit_pure`` (pure_callback) and ``jit_io`` (io_callback)
carry host callbacks, which JAX never writes; ``jit_plain`` and ``jit_other`` have none.
``CALLBACKS_MIN_COMPILE_SECS`` sets JAX's minimum compile time (default 0: write everything).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

jax.config.update(
    "jax_persistent_cache_min_compile_time_secs",
    float(os.environ.get("CALLBACKS_MIN_COMPILE_SECS", "0")),
)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def printing(x):
    jax.debug.print("printing {x}", x=x)
    return x + 1


def pure(x):
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.pure_callback(lambda v: np.asarray(v) * 2, shape, x)


def io(x):
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return io_callback(lambda v: np.asarray(v) * 3, shape, x)


def plain(x):
    return jnp.sin(x) * 4


def other(x):
    return jnp.cos(x) + jnp.arange(x.shape[0], dtype=x.dtype)


FUNCTIONS = {f.__name__: f for f in (printing, pure, io, plain, other)}

if __name__ == "__main__":
    x = np.arange(3, dtype=np.float32)
    for name in sys.argv[1:] or list(FUNCTIONS):
        print(f"result: {name} {np.asarray(jax.jit(FUNCTIONS[name])(x)).tolist()}")
