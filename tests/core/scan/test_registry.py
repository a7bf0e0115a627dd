"""scan's one registry of rules (core/scan/rules/registry.py), bound to the catalog both ways:
every kind the catalog says scan raises is named by a rule, every kind a rule names is an entry
of the catalog that says scan raises it, and a rule cannot raise a kind it does not name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from cachedoctor.cache import listdir
from cachedoctor.cache.jaxenv import installed_jax
from cachedoctor.core import catalog
from cachedoctor.core.catalog_entries import BY_KIND, ENTRIES
from cachedoctor.core.findings import Finding, Producer
from cachedoctor.core.scan.rules.registry import SCAN_RULES, ScanInput, ScanRule, run_rules


def test_every_kind_scan_raises_is_named_by_a_rule() -> None:
    named = {kind for rule in SCAN_RULES for kind in rule.kinds}
    of_scan = {entry.kind for entry in ENTRIES if entry.raised_by is Producer.SCAN}
    unraised = sorted(k.value for k in of_scan - named)
    assert not unraised, f"catalog kinds of scan that no rule of SCAN_RULES raises: {unraised}"


def test_every_rule_names_entries_of_the_catalog_that_scan_raises() -> None:
    assert len({rule.name for rule in SCAN_RULES}) == len(SCAN_RULES), "two rules of one name"
    for rule in SCAN_RULES:
        assert rule.kinds, f"scan rule {rule.name} names no catalog entry"
        for kind in rule.kinds:
            assert kind in BY_KIND, f"scan rule {rule.name}: {kind.value} has no catalog entry"
            producer = BY_KIND[kind].raised_by
            assert producer is Producer.SCAN, f"{rule.name}: {kind.value} is raised by {producer}"


def _input(folder: Path) -> ScanInput:
    listing = listdir.list_cache(folder)
    return ScanInput(listing, [], installed_jax(), 0.0, None, (), (), str(folder))


def test_a_rule_that_raises_a_kind_it_does_not_name_fails_the_scan(tmp_path: Path) -> None:
    orphan = catalog.ORPHAN_ATIME.finding("1 -atime file has no entry")
    liar = ScanRule("liar", (catalog.UNKNOWN_FILE.kind,), lambda s, _: [orphan])
    with pytest.raises(ValueError, match="scan rule liar raised orphan: not its kinds"):
        run_rules(_input(tmp_path), (liar,))
    honest = ScanRule("honest", (orphan.kind,), lambda s, _: [orphan])
    assert run_rules(_input(tmp_path), (honest,)) == [orphan]


def test_a_rule_sees_the_findings_of_the_rules_before_it(tmp_path: Path) -> None:
    """``not-stored`` reads the earlier rules' findings (an unstable key is its reason)."""
    first = catalog.UNKNOWN_FILE.finding("1 file that is not part of a JAX cache")
    seen: list[tuple[Finding, ...]] = []

    def second(scan: ScanInput, earlier: Sequence[Finding]) -> list[Finding]:
        seen.append(tuple(earlier))
        return []

    rules = (
        ScanRule("first", (first.kind,), lambda s, _: [first]),
        ScanRule("second", (first.kind,), second),
    )
    assert run_rules(_input(tmp_path), rules) == [first]
    assert seen == [(first,)]
