"""Byte formats against independent oracles (protobuf, the reference Riegeli writer, zstandard)."""
