"""A program whose cache entry has large parts (run by tests/cache/test_reader_bytes.py in a fresh
interpreter, with the environment of ``runner.program_env``).

A chain of 700 elementwise steps compiles to one kernel of about 100 KB of object code (a
section over the reader's 64 KB ``SMALL_FIELD``), and a 1.2 MB constant makes the HLO module
and the payload larger than 1 MiB (the reader's and ``extract_payload``'s read size).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

STEPS = 700
TABLE = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)


@jax.jit
def large(x):  # type: ignore[no-untyped-def]
    for i in range(STEPS):
        x = jnp.sin(x) * (1.0 + i / STEPS) + jnp.cos(x * i)
    return x + jnp.asarray(TABLE)


out = large(np.ones(300_000, np.float32))
print("result:", float(out[0]))
