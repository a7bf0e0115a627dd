"""The JAX cache: listing, decoding every entry layout, the scan index, parallel decoding."""
