"""The scan: list a cache, decode its entries (index and memo first), judge them by rules."""
