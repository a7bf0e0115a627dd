"""The runtime hook and the stable hasher, against real JAX processes."""
