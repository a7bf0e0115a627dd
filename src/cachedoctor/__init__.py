"""cachedoctor: inspect, explain and repair JAX's persistent compilation cache."""

__version__ = "0.1.0"
