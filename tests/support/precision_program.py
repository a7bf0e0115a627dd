"""A program for preflight's precision tests: two jitted functions, neither with a dot in its
source. ``jit_plain_math`` has none at all; ``jit_vector_dot`` takes a vector dot product, which
XLA rewrites into a multiply and a reduce, so its compiled module holds no dot instruction
though JAX lowered one (and JAX's key changes with ``JAX_DEFAULT_MATMUL_PRECISION``)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def plain_math(x):
    return jnp.tanh(x) * 2.0 + 1.0


def vector_dot(x, w):
    return jnp.tanh(jnp.dot(x[0], w[:, 0])) * 2.0


x = np.ones((64, 16), np.float32)
w = np.ones((16, 16), np.float32)
print("result:", float(jax.jit(plain_math)(x).sum()), float(jax.jit(vector_dot)(x, w)))
