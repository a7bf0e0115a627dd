"""The DebugOptions field numbers an entry sets, as ranges, and back (``debug_fields``); the
fields JAX clears before hashing."""

from __future__ import annotations

import random

import pytest

from cachedoctor.xla.compile_options import number_ranges, parse_ranges


def test_ranges_round_trip() -> None:
    assert number_ranges([5, 1, 2, 3, 9, 7, 8, 3]) == "1-3,5,7-9"
    assert number_ranges([]) == "" and parse_ranges("") == frozenset()
    rng = random.Random(7)
    for _ in range(200):
        numbers = {rng.randrange(1, 600) for _ in range(rng.randrange(0, 300))}
        text = number_ranges(numbers)
        assert parse_ranges(text) == numbers, text
        assert all(p for p in text.split(",")) or not numbers


def test_cleared_by_jax_holds_every_field_the_installed_jax_clears() -> None:
    """The oracle is JAX's own ``_hash_serialized_compile_options``: every DebugOptions field it
    clears before hashing (named in its source, numbered by the installed jaxlib's schema) is
    one cachedoctor does not call a key input (``diff`` lists them apart)."""
    import re

    from cachedoctor.cache.jaxenv import _function_source, _jax_src_file
    from cachedoctor.xla import compile_options, optionschema

    source = _jax_src_file("_src/cache_key.py")
    if source is None:
        pytest.skip("jax is not installed here")
    fn = _function_source(source.read_text(), "_hash_serialized_compile_options")
    assert fn is not None
    cleared = set(re.findall(r"debug_options\.(\w+)\s*=", fn))
    assert "xla_force_host_platform_device_count" in cleared  # the premise
    numbers = {name: n for n, name in optionschema.field_names(optionschema.DEBUG_OPTIONS)}
    known = compile_options.CLEARED_BY_JAX | compile_options.CACHE_PATH_FIELDS
    assert {name for name in cleared if numbers.get(name) not in known} == set()
