"""The core of each command, on real caches written by JAX."""
