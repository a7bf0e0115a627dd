"""Evidence in tiers (issue 26): a scan that defers the HLO facts reaches the same verdicts as
one that computes them for every entry, and what it defers is filled in wherever it is shown."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from cachedoctor.cache import reader, tiers
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.scan.report import ScanReport
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.render.jsonout import dumps, scan_document
from cachedoctor.storage.location import Location
from tests.support.caches import entries_of

CACHES = {
    "seed3": "seed_cache",  # custom_partitioning: 3 jit_f under other keys, one a plain jit_g
    "evict": "evict_cache",  # jit_g of three sizes: one module, three programs, no tie
}


def _json(report: ScanReport, entries: bool = True) -> str:
    doc = scan_document(report)
    doc.pop("scanned_at")
    if not entries:
        doc.pop("entries")
    return dumps(doc)


def _cold() -> None:
    reader.clear_memos()


def _without_tier_two(e: EntryInfo) -> EntryInfo:
    return dataclasses.replace(
        e, hlo=None, program_digest=None, volatile=(), executable_digest=None, hlo_deferred=True
    )


@pytest.mark.slow
@pytest.mark.parametrize("fixture", sorted(CACHES.values()))
def test_deferred_facts_leave_every_verdict_as_it_was(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """The forced all-tiers scan and the default text scan's tiers: the same summary, modules
    and findings (the seed cache's unstable-key group needs the deferred facts of its tie), and
    entries that differ only in the facts deferred."""
    cache: Path = request.getfixturevalue(fixture)
    full = scan_directory(Location.parse(cache), now=2e9, use_index=False, all_tiers=True)
    _cold()  # a payload decoded with every tier would serve the first-tier decode
    lazy = scan_directory(Location.parse(cache), now=2e9, use_index=False, all_tiers=False)
    assert _json(lazy, entries=False) == _json(full, entries=False)
    deferred = 0
    for a, b in zip(entries_of(full), entries_of(lazy), strict=True):
        assert not a.hlo_deferred
        if b.hlo_deferred:
            deferred += 1
            assert _without_tier_two(a) == b
        else:
            assert a == b
    assert deferred  # each cache has entries whose signature no other entry of its module shares
    if fixture == "seed_cache":  # the three jit_f tie: every tier for each
        assert [e.hlo_deferred for e in entries_of(lazy) if e.module == "jit_f"] == [False] * 3


@pytest.mark.slow
def test_a_json_scan_after_a_text_scan_fills_what_the_index_deferred(seed_cache: Path) -> None:
    """A text scan stores first-tier rows in the index and keeps its report in the memo; a
    later ``--json`` scan (entries, every tier) must print what a scan without index prints."""
    expected = _json(scan_directory(Location.parse(seed_cache), now=2e9, use_index=False))
    _cold()
    text = scan_directory(
        Location.parse(seed_cache), now=2e9, entries=False
    )  # writes the index and memo
    assert text.entries is None
    _cold()
    again = scan_directory(Location.parse(seed_cache), now=2e9)
    assert _json(again) == expected
    assert not any(e.hlo_deferred for e in entries_of(again))


@pytest.mark.slow
def test_equal_program_digests_have_equal_signatures(seed_cache: Path) -> None:
    """The signature is a necessary condition of the program digest, on real entries: the
    three jit_f copies share both; different programs may share a signature, never a digest
    without it."""
    paths = sorted(seed_cache.glob("*-cache"))
    entries = [_decoded(p, False) for p in paths]
    by_digest: dict[str | None, set[str | None]] = {}
    for e in entries:
        assert e.program_digest is not None and e.program_signature is not None
        by_digest.setdefault(e.program_digest, set()).add(e.program_signature)
    assert all(len(signatures) == 1 for signatures in by_digest.values())
    assert len(by_digest) < len(entries)  # the jit_f copies share one digest
    _cold()
    first = [_decoded(p, True) for p in paths]
    # a second entry of one payload gets every tier from the bytes in hand (reader's memo);
    # the first tier leaves the executable digest out (the second tier's evidence)
    digests = [e.executable_digest for e in entries]
    assert [e.hlo_deferred for e in first] == [d not in digests[:n] for n, d in enumerate(digests)]
    assert all((e.executable_digest is None) == e.hlo_deferred for e in first)
    assert [e.executable_digest for e in first if not e.hlo_deferred] == [
        e.executable_digest for e, f in zip(entries, first, strict=True) if not f.hlo_deferred
    ]
    assert [e.program_signature for e in first] == [e.program_signature for e in entries]


def _decoded(path: Path, defer_hlo: bool) -> EntryInfo:
    info = reader.decode_entry(path, defer_hlo=defer_hlo)
    assert isinstance(info, EntryInfo)
    return info


# --- tiers.tied and tiers.complete, on made-up entries ----------------------------------------


def _entry(key: str, module: str, signature: str | None, digest: str, deferred: bool) -> EntryInfo:
    return EntryInfo(
        key=key,
        module=module,
        path=key,
        size=1,
        mtime_ns=0,
        executable_digest=digest,
        program_signature=signature,
        hlo_deferred=deferred,
    )


def _full(e: EntryInfo) -> EntryInfo:
    return dataclasses.replace(e, program_digest="p-" + e.executable_digest, hlo_deferred=False)  # type: ignore[operator]


def test_only_deferred_entries_whose_signature_ties_in_their_module_are_needed() -> None:
    entries = [
        _entry("a1", "jit_a", "s1", "x", True),
        _entry("a2", "jit_a", "s1", "y", True),  # ties with a1
        _entry("a3", "jit_a", "s2", "z", True),  # alone with its signature
        _entry("b1", "jit_b", "s1", "w", True),  # same signature, other module
        _entry("c1", "jit_c", "s3", "v", False),
        _entry("c2", "jit_c", "s3", "u", True),  # ties with an entry that has every tier
        _entry("d1", "jit_d", None, "t", False),  # undecodable: no signature
        _entry("d2", "jit_d", None, "t", False),
    ]
    assert tiers.tied(entries) == [0, 1, 5]


def test_copies_of_a_payload_take_the_facts_of_one_decode() -> None:
    entries = [
        _entry("a1", "jit_a", "s1", "x", True),
        _entry("a2", "jit_a", "s1", "x", True),
        _entry("a3", "jit_a", "s1", "y", True),
    ]
    asked: list[list[int]] = []

    def decode(positions: list[int]) -> Iterable[EntryInfo]:
        asked.append(positions)
        return [_full(entries[n]) for n in positions]

    assert tiers.complete(entries, tiers.tied(entries), decode) == [0, 1, 2]
    assert asked == [[0, 2], []]
    assert [e.program_digest for e in entries] == ["p-x", "p-x", "p-y"]
    assert [e.key for e in entries] == ["a1", "a2", "a3"]
    assert not any(e.hlo_deferred for e in entries)


def test_a_copy_whose_file_changed_between_the_reads_is_decoded_alone() -> None:
    entries = [_entry("a1", "jit_a", "s1", "x", True), _entry("a2", "jit_a", "s1", "x", True)]
    changed: Callable[[EntryInfo], EntryInfo] = lambda e: dataclasses.replace(  # noqa: E731
        _full(e), executable_digest="new"
    )
    calls: list[list[int]] = []

    def decode(positions: list[int]) -> Iterable[EntryInfo]:
        calls.append(positions)
        return [changed(entries[n]) if not calls[1:] else _full(entries[n]) for n in positions]

    tiers.complete(entries, [0, 1], decode)
    assert calls == [[0], [1]]
    assert entries[1].program_digest == "p-x" and not entries[1].hlo_deferred


@pytest.mark.slow
def test_the_signature_refuses_exactly_the_modules_the_facts_refuse(seed_cache: Path) -> None:
    """A first-tier decode must name the same damaged entries as a full one: the signature
    raises WireError on a damaged module exactly where ``scan_facts`` does (cut short at many
    offsets, a byte flipped at many places)."""
    from cachedoctor.formats import wire
    from cachedoctor.xla import hlo_facts

    detail = reader.decode_entry(next(seed_cache.glob("jit_f-*-cache")), detail=True)
    module = detail.hlo_module  # type: ignore[union-attr]
    assert module
    damaged = [module[:n] for n in range(1, len(module), max(1, len(module) // 97))]
    damaged += [
        module[:n] + bytes([module[n] ^ 0xFF]) + module[n + 1 :]
        for n in range(0, len(module), max(1, len(module) // 101))
    ]
    refused = 0
    for data in damaged:
        outcomes: list[str | None] = []
        for fn in (hlo_facts.scan_facts, hlo_facts.signature):
            try:
                fn(data)
                outcomes.append(None)
            except wire.WireError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
        refused += outcomes[0] is not None
    assert 0 < refused < len(damaged)
