"""A plain jitted program with no custom partitioning; its cache key is stable.

``CACHEDOCTOR_PLAIN_SIZE`` sets the input length (default 16), to make programs of other shapes.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import setup_jax

jax = setup_jax()
import jax.numpy as jnp  # noqa: E402

SIZE = int(os.environ.get("CACHEDOCTOR_PLAIN_SIZE", "16"))


@jax.jit
def g(x):
    return jnp.sin(x) * 2.0 + jnp.cos(x)


out = g(jnp.arange(SIZE, dtype=jnp.float32))
print("result:", float(out.sum()))
