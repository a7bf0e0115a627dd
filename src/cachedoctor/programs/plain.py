"""A plain jitted program with no custom partitioning; its cache key is stable.

``CACHEDOCTOR_PLAIN_SIZE`` sets the input length (default 16), to make programs of other shapes;
several lengths, comma-separated, compile one entry each in one process.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import setup_jax

jax = setup_jax()
import jax.numpy as jnp  # noqa: E402

SIZES = [int(s) for s in os.environ.get("CACHEDOCTOR_PLAIN_SIZE", "16").split(",") if s.strip()]


@jax.jit
def g(x):
    return jnp.sin(x) * 2.0 + jnp.cos(x)


for size in SIZES:
    out = g(jnp.arange(size, dtype=jnp.float32))
    print("result:", float(out.sum()))
