"""Facts about the installed JAX, found without importing it (scans must start fast).

Behaviour differs between releases, so we read the installed source instead of keying on
version numbers: e.g. whether ``_hash_serialized_compile_options`` clears the autotune-cache
path (jax 0.12 does, 0.10.2 does not) decides whether a relocated cache can ever hit.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JaxInfo:
    jax_version: str | None
    jaxlib_version: str | None
    # None when the installed source could not be read: callers must say "may".
    hashes_autotune_dir: bool | None
    hashes_kernel_cache_file: bool | None
    cache_key_source: str | None
    # JAX's LRU takes an entry without its -atime file as the least recently used (0.12) rather
    # than failing its eviction pass on it (0.10.2); None: lru_cache.py could not be read
    lru_evicts_without_atime: bool | None = None
    # JAX strips Mosaic kernels' debug locations before hashing (0.11 on:
    # ``_strip_mosaic_debug_info``); None when cache_key.py could not be read
    strips_kernel_locations: bool | None = None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _jax_src_file(relative: str) -> Path | None:
    try:
        spec = importlib.util.find_spec("jax")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file():
            return candidate
    return None


def _function_source(text: str, name: str) -> str | None:
    match = re.search(rf"^def {name}\(.*?(?=^\S)", text, re.S | re.M)
    return match.group(0) if match else None


def clears_field(function_source: str, field_name: str) -> bool:
    """Whether the hashing function blanks ``debug_options.<field_name>`` before hashing."""
    return re.search(rf"\.{field_name}\s*=", function_source) is not None or (
        f'ClearField("{field_name}")' in function_source
    )


@functools.cache
def installed_jax() -> JaxInfo:
    """Versions and key-hashing behaviour of the JAX in this environment."""
    source_file = _jax_src_file("_src/cache_key.py")
    hashes_autotune: bool | None = None
    hashes_kernel: bool | None = None
    strips_kernels: bool | None = None
    if source_file is not None:
        try:
            text = source_file.read_text(encoding="utf-8")
        except OSError:
            text = ""
        fn = _function_source(text, "_hash_serialized_compile_options")
        if fn is not None:
            hashes_autotune = not clears_field(fn, "xla_gpu_per_fusion_autotune_cache_dir")
            hashes_kernel = not clears_field(fn, "xla_gpu_kernel_cache_file")
        if text:
            strips_kernels = "_strip_mosaic_debug_info(" in text
    return JaxInfo(
        lru_evicts_without_atime=_lru_evicts_without_atime(),
        jax_version=_version("jax"),
        jaxlib_version=_version("jaxlib"),
        hashes_autotune_dir=hashes_autotune,
        hashes_kernel_cache_file=hashes_kernel,
        cache_key_source=str(source_file) if source_file else None,
        strips_kernel_locations=strips_kernels,
    )


def _lru_evicts_without_atime() -> bool | None:
    """Whether the installed ``LRUCache._evict_if_needed`` checks that an entry's ``-atime``
    file exists before reading it (0.12: such an entry counts as the least recently used) or
    reads it unchecked (0.10.2: FileNotFoundError, and the put fails)."""
    source_file = _jax_src_file("_src/lru_cache.py")
    if source_file is None:
        return None
    try:
        text = source_file.read_text(encoding="utf-8")
    except OSError:
        return None
    method = re.search(r"def _evict_if_needed\(.*?(?=\n  def |\Z)", text, re.S)
    if method is None or "atime_path.read_bytes()" not in method.group(0):
        return None
    return "atime_path.exists()" in method.group(0)
