"""Compile options, the executable's module config and the IFRT header, compared field by field;
which differences JAX clears before hashing and which only say the cache moved.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from cachedoctor.cache.model import EntryDetail
from cachedoctor.core.diff.report import OptionsSection
from cachedoctor.formats import wire
from cachedoctor.xla import compile_options, optionschema

# DebugOptions fields derived from the cache directory (docs/format.md): a different value with
# the same last component means the cache was moved or copied.
CACHE_PATH_FIELDS = {
    compile_options.DEBUG_AUTOTUNE_DIR,
    compile_options.DEBUG_KERNEL_CACHE_FILE,
    compile_options.DEBUG_AUTOTUNER_CACHE_DIR,
}


# DebugOptions fields JAX clears before hashing (jax/_src/cache_key.py), see docs/format.md.
CLEARED_BY_JAX = {compile_options.DEBUG_DUMP_TO, compile_options.DEBUG_AUTOTUNE_MODE, 61}


_DEBUG_PATHS = {(3, 3): "compile_options", (14,): "module_config"}


def options_section(a: EntryDetail, b: EntryDetail) -> OptionsSection:
    sch = optionschema.schema()

    def diff(x: bytes | None, y: bytes | None, message: str) -> tuple[optionschema.FieldDiff, ...]:
        if x == y:
            return ()
        try:
            return tuple(optionschema.diff_messages(x, y, message, sch))
        except wire.WireError as exc:
            return (optionschema.FieldDiff("(malformed)", (), str(exc), str(exc), False),)

    return OptionsSection(
        compile_options=diff(a.compile_options, b.compile_options, optionschema.COMPILE_OPTIONS),
        module_config=diff(a.hlo_config, b.hlo_config, optionschema.MODULE_CONFIG),
        ifrt_header=diff(a.ifrt_header, b.ifrt_header, optionschema.IFRT_METADATA),
        names_from=sch.source,
    )


def _debug_field(d: optionschema.FieldDiff) -> int | None:
    """The DebugOptions field number of a compile-options or module-config difference."""
    if len(d.numbers) == 3 and d.numbers[:2] == (3, 3):
        return d.numbers[2]
    if len(d.numbers) == 2 and d.numbers[0] == 14:
        return d.numbers[1]
    return None


def is_relocation(d: optionschema.FieldDiff) -> bool:
    """A cache-dir-derived path that differs only above its last component."""
    number = _debug_field(d)
    if number not in CACHE_PATH_FIELDS or not d.a or not d.b:
        return False
    return os.path.basename(d.a.rstrip("/")) == os.path.basename(d.b.rstrip("/"))


def is_volatile_option(d: optionschema.FieldDiff) -> bool:
    return is_relocation(d) or _debug_field(d) in CLEARED_BY_JAX


def first_option(diffs: Sequence[optionschema.FieldDiff]) -> str:
    d = diffs[0]
    more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
    va = d.a if d.a is not None else "(unset)"
    vb = d.b if d.b is not None else "(unset)"
    return f"{d.path} {va} vs {vb}{more}"
