"""How the cache is used, from JAX's own records: the processes' stats records."""
