"""``cachedoctor pack`` / ``unpack`` output (``core.bundle``): what went into a bundle and what
was left out, and before (or after) an unpack what will hit here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from cachedoctor.core.bundle import PackReport, UnpackReport
from cachedoctor.units import format_bytes

BUNDLE_SCHEMA_VERSION = 1
_SAID = {"hit": "will hit", "miss": "will miss", "unknown": "cannot tell"}
_SHOWN = 20  # entries listed one per line


def bundle_document(report: PackReport | UnpackReport) -> dict[str, Any]:
    return {"schema_version": BUNDLE_SCHEMA_VERSION, **report.to_dict()}


def bundle_lines(report: PackReport | UnpackReport) -> Iterator[str]:
    if isinstance(report, PackReport):
        yield from _pack_lines(report)
    else:
        yield from _unpack_lines(report)


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _shown(value: object) -> str:
    """Text from a bundle's header as one line a terminal shows as it is: control characters
    and lone surrogates escaped (the header is the packer's, not ours)."""
    text = str(value)
    if text.isprintable():
        return text
    escaped = (c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return "".join(escaped)


def _pack_lines(report: PackReport) -> Iterator[str]:
    yield (
        f"packed {_count(len(report.entries), 'entry', 'entries')} of {report.source} and"
        f" {_count(report.companions, 'manifest or record', 'manifests and records')} into"
        f" {report.bundle} ({format_bytes(report.bytes)})"
    )
    platforms = Counter(e.platform for e in report.entries)
    devices = Counter(e.devices for e in report.entries)
    jaxlibs = Counter(e.jaxlib or "not recorded" for e in report.entries)
    if report.entries:
        yield "  platforms: " + ", ".join(f"{p} {n}" for p, n in platforms.most_common())
        yield "  devices: " + ", ".join(f"{d or '?'} ×{n}" for d, n in devices.most_common())
        yield "  written by jaxlib: " + ", ".join(f"{j} ×{n}" for j, n in jaxlibs.most_common())
    if report.left_out:
        why = Counter(e.why for e in report.left_out)
        yield (
            f"left out {_count(len(report.left_out), 'entry', 'entries')} that would not hit"
            " elsewhere: "
            + ", ".join(f"{w} {n}" for w, n in why.most_common())
            + " (--include "
            + "|".join(sorted(why))
            + " packs them)"
        )
        for e in report.left_out[:_SHOWN]:
            yield f"  {e.why:<13} {e.key}: {e.words}"
        if len(report.left_out) > _SHOWN:
            yield f"  … and {len(report.left_out) - _SHOWN} more"
    if report.links:
        yield (
            f"not packed: {_count(len(report.links), 'symbolic link')} named -cache (no entry:"
            " never followed)"
        )


def _unpack_lines(report: UnpackReport) -> Iterator[str]:
    h = report.header
    packed = h.get("packed_by") or {}
    yield _shown(
        f"{report.bundle}: {_count(len(report.entries), 'entry', 'entries')} of {h.get('source')},"
        f" packed by jax {packed.get('jax')} / jaxlib {packed.get('jaxlib')}"
    )
    spelled = (
        "" if report.cache_dir == report.target else f" (as the jobs spell it: {report.cache_dir})"
    )
    if report.problem:
        yield f"into {report.target}{spelled}: cannot predict here: {report.problem}"
    else:
        counts = report.counts()
        said = ", ".join(f"{counts[v]} {_SAID[v]}" for v in _SAID if counts.get(v))
        yield f"into {report.target}{spelled}: {said or 'nothing to judge'}"
    order = {"miss": 0, "unknown": 1, "hit": 2}
    shown = sorted(report.entries, key=lambda e: (order.get(e.verdict, 3), e.module or "", e.key))
    for e in shown[:_SHOWN]:
        said = _SAID.get(e.verdict, e.verdict)
        yield _shown(f"  {said:<12} {e.action:<8} {e.module or e.key}: {e.words}")
    if len(report.entries) > _SHOWN:
        yield f"  … and {len(report.entries) - _SHOWN} more"
    actions = report.actions()
    kept = _kept(actions)
    if report.applied:
        yield (
            f"wrote {_count(actions.get('written', 0), 'entry', 'entries')},"
            f" {_count(report.companions, 'manifest')} and"
            f" {_count(report.records, 'stats record')}"
            + (f"; {kept}" if kept else "")
            + (f"; {actions['failed']} failed" if actions.get("failed") else "")
            + (
                f"; {_count(report.atime_files, '-atime file')} beside them (JAX's LRU eviction"
                " runs here)"
                if report.atime_files
                else ""
            )
        )
        for name, reason in report.failed_files:
            yield f"  not written: {name}: {reason}"
        if report.moved:
            yield (
                f"moved {_count(len(report.moved), 'relocated entry', 'relocated entries')} to"
                " their stable keys: they hit with `cachedoctor enable` (stable mode)"
            )
    else:
        writes = actions.get("write", 0)
        yield (
            (
                f"dry run: would write {_count(writes, 'entry', 'entries')}"
                if writes
                else "dry run: nothing to write"
            )
            + (f" ({kept})" if kept else "")
            + ("; --apply writes them" if writes else "")
        )
    for note in report.notes:
        yield f"note: {note}"


def _kept(actions: dict[str, int]) -> str:
    """The entries no write touches: there already, refused, blocked by a non-file."""
    parts = [
        f"{actions[a]} {words}"
        for a, words in (
            ("present", "there already"),
            ("refused", "refused: not entries JAX loads"),
            ("blocked", "blocked by a link or other non-file"),
        )
        if actions.get(a)
    ]
    return ", ".join(parts)
