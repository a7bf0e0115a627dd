"""Evidence in tiers: which entries' deferred HLO facts a verdict needs (issue 26).

A first-tier decode (``reader.decode_entry(defer_hlo=True)``) reads what every entry needs:
decompression, header, compile options, a fast digest of the payload (XXH3-128: the reader's
memo, so copies are decoded once), the executable's fields, and of the HLO module only its
*signature* (``hlo_facts.signature``: which computations are the entry, each one's number of
instructions, the host program shape, all covered by the program digest). The second tier, the
HLO summary, the program digest, the volatile fields and the payload's SHA-256 (the executable
digest: evidence that two executables are identical, and shown), is what the verdicts that
compare entries rest on:
``duplicate_groups`` groups entries by module and program digest, and a module's number of
programs counts distinct digests.

Two entries of one module hold the same program only if their signatures are equal (the
signature and the program digest both cover the platform and the canonical compile options,
and the signature's HLO parts are functions of what the program digest hashes). So an entry
whose signature no other entry of its module shares is in no group, and counts as one program
whatever its digest: its second tier can wait for a command that shows it (``scan --json``,
``show``, ``diff``, ``check``, the API). Entries whose signatures tie get every tier; an entry
that shares its module and file size with another (a likely copy) gets them at once
(``parallel.first_tier_only``), and copies of one payload get them from one decode.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from cachedoctor.cache.model import EntryInfo, MosaicKernel, updated
from cachedoctor.formats.wire import WireError
from cachedoctor.xla import mosaic


def tied(entries: Sequence[EntryInfo]) -> list[int]:
    """Positions of the entries whose second tier was deferred and that a verdict needs: in a
    module with several entries whose signatures tie."""
    groups: dict[tuple[str | None, str], list[int]] = defaultdict(list)
    for n, e in enumerate(entries):
        if e.program_signature is not None:
            groups[(e.module, e.program_signature)].append(n)
    return sorted(
        n for group in groups.values() if len(group) > 1 for n in group if entries[n].hlo_deferred
    )


def complete(
    entries: list[EntryInfo],
    positions: Iterable[int],
    decode: Callable[[list[int]], Iterable[EntryInfo]],
) -> list[int]:
    """Every tier for ``entries[n]``, n in ``positions``, in place: ``decode`` decodes the given
    positions again with all tiers; copies of a payload decoded (same executable digest) take
    its facts, which are a function of the payload's bytes. Returns the positions changed."""
    first: dict[str, int] = {}
    todo: list[int] = []
    copies: list[int] = []
    for n, e in enumerate(entries):  # a copy decoded with every tier already (reader's memo)
        if e.executable_digest is not None and e.program_digest is not None:
            first.setdefault(e.executable_digest, n)
    for n in positions:
        digest = entries[n].executable_digest
        if digest is None or digest not in first:
            todo.append(n)
            if digest is not None:
                first[digest] = n
        else:
            copies.append(n)
    for n, info in zip(todo, decode(todo), strict=True):
        entries[n] = info
    again = []
    for n in copies:
        source = entries[first[entries[n].executable_digest]]  # type: ignore[index]
        if source.executable_digest != entries[n].executable_digest or source.hlo_deferred:
            again.append(n)  # the file changed between the two reads: decode it alone
            continue
        entries[n] = updated(
            entries[n],
            hlo=source.hlo,
            program_digest=source.program_digest,
            volatile=source.volatile,
            program_signature=source.program_signature,
            problems=source.problems,
            hlo_deferred=False,
        )
    for n, info in zip(again, decode(again), strict=True):
        entries[n] = info
    return sorted([*todo, *copies])


# --- the kernel tier: Pallas kernels' bodies read where a verdict compares them -------------


def kernel_candidates(entries: Sequence[EntryInfo]) -> list[int]:
    """Positions of TPU entries whose Pallas kernels must be read with jaxlib's MLIR: in a
    module with several entries equal up to their kernel bodies (their program digests with
    the bodies masked) whose bodies differ. Only there can debug locations be all that differs
    (scan's ``kernel-locations``); jaxlib's MLIR is imported for those alone."""
    groups: dict[tuple[str | None, str], list[int]] = defaultdict(list)
    for n, e in enumerate(entries):
        t = e.tpu
        if t is not None and t.kernels and t.masked_program_digest and e.ok:
            groups[(e.module, t.masked_program_digest)].append(n)
    out = []
    for group in groups.values():
        bodies = {tuple(k.body_sha256 for k in entries[n].tpu.kernels) for n in group}  # type: ignore[union-attr]
        if len(bodies) > 1:
            out += [n for n in group if not _kernels_read(entries[n])]
    return sorted(out)


def _kernels_read(e: EntryInfo) -> bool:
    kernels = e.tpu.kernels if e.tpu is not None else ()
    return all(k.stripped_sha256 is not None or k.unreadable is not None for k in kernels)


def with_known_kernels_read(info: EntryInfo) -> EntryInfo | None:
    """``info`` with its kernels read from the bodies this process kept when it decoded the
    entry (``mosaic.remember_body``), or None when one is not kept (decoded in a worker)."""
    if info.tpu is None:
        return None
    kernels = []
    for kernel in info.tpu.kernels:
        body = mosaic.known_body(kernel.body_sha256)
        if body is None or kernel.body_size == 0:
            return None
        kernels.append(_read(kernel, mosaic.KernelConfig(kernel.instruction, b"", body)))
    return replace(info, tpu=replace(info.tpu, kernels=tuple(kernels)))


def with_kernels_read(info: EntryInfo, module: bytes | None) -> EntryInfo:
    """``info`` with each kernel's name, stripped digest and locations, read from ``module``
    (the entry's optimised HLO module) with jaxlib's MLIR."""
    if info.tpu is None or module is None:
        return info
    try:
        found = mosaic.kernels_in_module(module)
    except WireError:
        return info
    if [k.instruction for k in found] != [k.instruction for k in info.tpu.kernels]:
        return info  # another module than the one decoded (the file changed): no claim
    kernels = tuple(_read(k, config) for k, config in zip(info.tpu.kernels, found, strict=True))
    return replace(info, tpu=replace(info.tpu, kernels=kernels))


def _read(kernel: MosaicKernel, config: mosaic.KernelConfig) -> MosaicKernel:
    if config.body is None:
        return replace(kernel, unreadable="no Mosaic body in its config")
    try:
        d = mosaic.describe(config.body)
    except mosaic.MosaicUnreadable as exc:
        return replace(kernel, unreadable=str(exc))
    places = tuple(dict.fromkeys(str(loc) for loc in d.locations))
    return replace(kernel, name=d.name, stripped_sha256=d.stripped_sha256, locations=places)
