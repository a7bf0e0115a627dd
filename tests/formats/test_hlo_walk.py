"""The fast field walk (``wire.field_list``) against the streaming one (``wire.iter_fields``) on
real HLO modules written by JAX, and on the same modules damaged or with non-UTF-8 names."""

from __future__ import annotations

from pathlib import Path

import pytest

from cachedoctor.formats import wire
from cachedoctor.xla import hlo
from tests.support.caches import hlo_modules

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess


def _modules(cache: Path) -> list[bytes]:
    out = hlo_modules(cache)
    assert out, "the seed cache holds HLO modules"
    return out


def _messages(module: bytes) -> list[wire.Buffer]:
    """The module, its computations and their instructions: every message the HLO walk reads."""
    found: list[wire.Buffer] = [module]
    for comp in wire.fields_by_number(module).get(3, []):
        assert not isinstance(comp, int)
        found.append(comp)
        found += [i for i in wire.fields_by_number(comp).get(2, []) if not isinstance(i, int)]
    return found


def _walk(buf: wire.Buffer) -> tuple[list[tuple[int, int, object]], str | None]:
    fields: list[tuple[int, int, object]] = []
    try:
        for number, wt, value in wire.iter_fields(buf):
            fields.append((number, wt, value if isinstance(value, int) else bytes(value)))
    except wire.WireError as exc:
        return fields, str(exc)
    return fields, None


def test_field_list_matches_iter_fields_on_real_modules(seed_cache: Path) -> None:
    for module in _modules(seed_cache):
        for message in _messages(module):
            fast = [
                (n, wt, v if isinstance(v, int) else bytes(v))
                for n, wt, v in wire.field_list(message)
            ]
            assert fast == _walk(message)[0]


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 64, 200])
def test_field_list_fails_like_iter_fields_on_truncated_bytes(seed_cache: Path, cut: int) -> None:
    module = _modules(seed_cache)[0]
    for message in _messages(module)[:50]:
        damaged = bytes(message)[: max(0, len(message) - cut)] + b"\xff"
        expected, error = _walk(damaged)
        if error is None:
            assert [
                (n, wt, v if isinstance(v, int) else bytes(v))
                for n, wt, v in wire.field_list(damaged)
            ] == expected
        else:
            with pytest.raises(wire.WireError) as caught:
                wire.field_list(damaged)
            assert str(caught.value) == error


def _with_names(message: wire.Buffer, depth: int) -> bytes:
    """The module re-encoded with every instruction's name (field 1) replaced by as many 0xff
    bytes: not UTF-8. (Computation names stay: the entry is found by its name.)"""
    out = []
    for number, wt, value in wire.field_list(message):
        new: wire.FieldValue | bytes = value
        if number == 1 and not isinstance(value, int) and depth == 2:
            new = b"\xff" * len(value)
        elif depth < 2 and number == (3 if depth == 0 else 2) and not isinstance(value, int):
            new = _with_names(value, depth + 1)
        out.append(wire.encode_field(number, wt, new))
    return b"".join(out)


def test_non_utf8_names_change_neither_summary_counts_nor_canonical_lines(
    seed_cache: Path,
) -> None:
    """Instruction names are identity, not definition: names that are not
    UTF-8 (which upb would refuse) leave the canonical lines and the summary's counts as they
    were, and the walk raises nothing."""
    for module in _modules(seed_cache):
        renamed = _with_names(module, 0)
        assert renamed != module
        before, after = hlo.canonicalize(module), hlo.canonicalize(renamed)
        assert after.lines == before.lines
        assert after.digest == before.digest
        s_before, s_after = hlo.summarize(module), hlo.summarize(renamed)
        assert (s_after.instructions, s_after.opcodes, s_after.parameters, s_after.result) == (
            s_before.instructions,
            s_before.opcodes,
            s_before.parameters,
            s_before.result,
        )


def test_module_facts_is_summarize_and_canonicalize(seed_cache: Path) -> None:
    """The scan's single walk gives what the two separate walks give (``diff`` uses one)."""
    for module in _modules(seed_cache):
        assert hlo.module_facts(module) == (hlo.summarize(module), hlo.canonicalize(module))
