"""Compile options, the executable's module config and the IFRT header, compared field by field;
which differences JAX clears before hashing and which only say the cache moved.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from cachedoctor.cache.model import EntryDetail
from cachedoctor.core.diff.report import OptionsSection
from cachedoctor.formats import wire
from cachedoctor.xla import compile_options, optiondiff, optionschema


def options_section(a: EntryDetail, b: EntryDetail) -> OptionsSection:
    sch = optionschema.schema()

    def diff(x: bytes | None, y: bytes | None, message: str) -> tuple[optiondiff.FieldDiff, ...]:
        if x == y:
            return ()
        try:
            return tuple(optiondiff.diff_messages(x, y, message, sch))
        except wire.WireError as exc:
            return (optiondiff.FieldDiff("(malformed)", (), str(exc), str(exc), False),)

    return OptionsSection(
        compile_options=diff(a.compile_options, b.compile_options, optionschema.COMPILE_OPTIONS),
        module_config=diff(a.hlo_config, b.hlo_config, optionschema.MODULE_CONFIG),
        ifrt_header=diff(a.ifrt_header, b.ifrt_header, optionschema.IFRT_METADATA),
        names_from=sch.source,
    )


def is_relocation(d: optiondiff.FieldDiff) -> bool:
    """A cache-dir-derived path that differs only above its last component."""
    number = compile_options.debug_field_number(d.numbers)
    if number not in compile_options.CACHE_PATH_FIELDS or not d.a or not d.b:
        return False
    return os.path.basename(d.a.rstrip("/")) == os.path.basename(d.b.rstrip("/"))


def cleared_by_jax(d: optiondiff.FieldDiff) -> bool:
    """A DebugOptions field JAX clears before hashing the options (not an input of the key)."""
    return compile_options.debug_field_number(d.numbers) in compile_options.CLEARED_BY_JAX


def is_volatile_option(d: optiondiff.FieldDiff) -> bool:
    return is_relocation(d) or (
        compile_options.debug_field_number(d.numbers) in compile_options.CLEARED_BY_JAX
    )


def first_option(diffs: Sequence[optiondiff.FieldDiff]) -> str:
    d = diffs[0]
    more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
    va = d.a if d.a is not None else "(unset)"
    vb = d.b if d.b is not None else "(unset)"
    return f"{d.path} {va} vs {vb}{more}"
