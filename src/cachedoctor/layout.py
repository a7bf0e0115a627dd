"""The names JAX, XLA and cachedoctor give to files in a cache directory: one place for each."""

from __future__ import annotations

# JAX's own files (jax/_src/lru_cache.py, compilation_cache.py)
CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
LOCKFILE = ".lockfile"

# XLA's sub-caches, placed inside the cache directory by jax_persistent_cache_enable_xla_caches
AUTOTUNE_DIR = "xla_gpu_per_fusion_autotune_cache_dir"
KERNEL_CACHE_FILE = "xla_gpu_kernel_cache_file"

# cachedoctor's own files and folders all start with this prefix
CACHEDOCTOR_PREFIX = "cachedoctor"
MANIFEST_DIRNAME = "cachedoctor-manifests"  # one key manifest per entry, written by the hook
MANIFEST_SUFFIX = ".json"
STATS_DIRNAME = "cachedoctor-stats"  # one record per process, written at exit (stablekeys/stats)
# the scan index, when it travels with the cache (cache/travel.py); never listed as a member.
# Never a name ending in CACHE_SUFFIX: JAX's LRU eviction counts and evicts what matches
# `self.path.glob(f"*{_CACHE_SUFFIX}")` (jax/_src/lru_cache.py:178 in jax 0.10.2, :176 in 0.4.38)
INDEX_DIRNAME = "cachedoctor-index"
INDEX_FILENAME = "index.sqlite"
MANIFEST_IR_SUFFIX = ".mlir.gz"
OWN_LOCKFILE = ".cachedoctor-lock"
TEMP_PREFIX = ".cachedoctor-tmp-"
