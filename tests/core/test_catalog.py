"""The catalog of finding kinds (core/catalog_entries.py, its cases in core/catalog.py): one
entry per kind, every case of it raised by some function of the package, no finding made outside
it, and docs/findings.md generated from it. The code is read as Python compiles it (the names
its functions load), not searched as text: a comment or a docstring that names a case does not
count.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import cachedoctor
from cachedoctor.core import catalog, catalog_entries
from cachedoctor.core.findings import Case, FindingKind, Producer, Severity
from tests.support.caches import REPO
from tests.support.scripts import load_script

PACKAGE = Path(cachedoctor.__file__).parent
CASES = {name: value for name, value in vars(catalog).items() if isinstance(value, Case)}
# Where a Finding may be built: the cases themselves, and the decoders of findings stored by
# the scan memo and the stats records' fold (made by the cases when first scanned or read).
BUILDS_FINDINGS = {"core/findings.py", "core/scan/memo.py", "core/usage/fold.py"}


def _functions(code: types.CodeType) -> Iterator[types.CodeType]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _functions(const)


def names_loaded_by_functions() -> dict[str, set[str]]:
    """Each module of the package (by path) -> the names its functions load (not its imports)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = compile(path.read_text(), str(path), "exec")
        names: set[str] = set()
        for function in _functions(module):
            names |= set(function.co_names)
        found[path.relative_to(PACKAGE).as_posix()] = names
    return found


def test_every_finding_kind_has_exactly_one_entry() -> None:
    kinds = [entry.kind for entry in catalog_entries.ENTRIES]
    assert sorted(kinds) == sorted(FindingKind), "a kind with no entry, or with two"
    assert {entry.kind: entry for entry in catalog_entries.ENTRIES} == catalog_entries.BY_KIND


def test_every_case_is_in_its_entry_and_named_in_the_catalog() -> None:
    """A case is one constant of core/catalog.py (so rules name it) and one case of one entry."""
    listed = [case for entry in catalog_entries.ENTRIES for case in entry.cases]
    assert len(listed) == len(set(map(id, listed))), "a case in two entries"
    assert {id(c) for c in listed} == {id(c) for c in CASES.values()}
    assert len({id(c) for c in CASES.values()}) == len(CASES), "a case under two names"
    for entry in catalog_entries.ENTRIES:
        assert all(case.kind is entry.kind for case in entry.cases)


def test_every_case_is_raised_by_a_function_of_the_package() -> None:
    loaded = names_loaded_by_functions()
    del loaded["core/catalog.py"], loaded["core/catalog_entries.py"]
    raised = set().union(*loaded.values())
    unraised = sorted(set(CASES) - raised)
    assert not unraised, f"cases of core/catalog.py no function raises: {unraised}"


# Where each producer's code lives (CatalogEntry.raised_by): scan's rules, the stats records'.
PRODUCED_IN = {
    Producer.SCAN: ("core/scan/rules/",),
    Producer.STATS_RECORDS: ("core/stats.py", "core/usage/"),
}


def test_every_case_is_raised_where_its_entry_says() -> None:
    """An entry's ``raised_by`` is true: its cases are raised by functions of that producer's
    modules, and a stats records' case by no scan rule (whose kinds test_registry.py binds)."""
    loaded = names_loaded_by_functions()
    name_of = {id(case): name for name, case in CASES.items()}
    for entry in catalog_entries.ENTRIES:
        for case in entry.cases:
            name = name_of[id(case)]
            where = sorted(path for path, names in loaded.items() if name in names)
            home = [p for p in where if p.startswith(PRODUCED_IN[entry.raised_by])]
            assert home, f"{name} ({entry.raised_by}) is raised in none of {where}"
            if entry.raised_by is not Producer.SCAN:
                scan = [p for p in where if p.startswith(PRODUCED_IN[Producer.SCAN])]
                assert not scan, f"{name} is raised by scan ({scan}), not {entry.raised_by}"


def test_findings_are_made_by_the_table_only() -> None:
    """No function builds a Finding of its own words: it takes them from its case."""
    loaded = names_loaded_by_functions()
    builders = sorted(path for path, names in loaded.items() if "Finding" in names)
    assert set(builders) <= BUILDS_FINDINGS, f"modules that build a Finding: {builders}"
    assert "core/scan/memo.py" in builders  # the check sees a call where there is one


def test_a_case_is_raised_only_at_its_severities() -> None:
    young = catalog.CORRUPT.finding("k: cut short", problem="truncated", severity=Severity.WARNING)
    assert (young.severity, young.evidence) == (Severity.WARNING, "decoding the file: truncated")
    assert catalog.CORRUPT.finding("k", problem="truncated").severity is Severity.ERROR
    with pytest.raises(ValueError, match="not a severity"):
        catalog.CORRUPT.finding("k", problem="truncated", severity=Severity.INFO)
    with pytest.raises(KeyError):  # a template field the rule did not fill
        catalog.CORRUPT.finding("k")


def test_each_example_fills_its_templates() -> None:
    for entry in catalog_entries.ENTRIES:
        example = entry.example
        given = {name for name, _ in example.fill} | ({"module"} if example.module else set())
        assert example.case.fields() <= given | {"module"}, entry.kind
        finding = example.finding()
        assert "{" not in finding.advice + finding.evidence, entry.kind


def _findings_doc() -> types.ModuleType:
    return load_script(REPO / "tools" / "findings_doc.py")


def test_docs_findings_md_is_generated_from_the_table() -> None:
    doc = _findings_doc()
    assert list(doc.problems()) == [], "run `python tools/check_docs.py --write`"
    text = (REPO / "docs" / "findings.md").read_text()
    for entry in catalog_entries.ENTRIES:
        assert f"### `{entry.kind.value}`" in text
        assert entry.example.finding().message in text  # the example, as scan prints it
