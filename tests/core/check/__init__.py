"""check -- CMD on real JAX programs."""
