"""What ``cachedoctor show`` does beyond reading the entry: its Pallas kernels read with
jaxlib's MLIR, its HLO rendered, its payload written to a file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO

from cachedoctor.cache import reader
from cachedoctor.cache.model import EntryDetail
from cachedoctor.errors import CachedoctorError, path_error
from cachedoctor.storage.files import atomic_file, new_file_mode, open_regular
from cachedoctor.storage.location import Location


@dataclass(frozen=True)
class KernelView:
    """One Pallas TPU kernel of an entry, as ``show`` and ``diff`` say it."""

    instruction: str  # computation/instruction of its tpu_custom_call
    name: str | None  # the kernel function
    grid: tuple[int, ...] | None
    locations: tuple[str, ...]  # "file:line" of each debug location, in MLIR's order
    body_sha256: str | None
    stripped_sha256: str | None  # without debug information, as jax 0.11 hashes it
    problem: str | None = None  # why the body could not be read


def kernels_of(module: bytes | None) -> tuple[KernelView, ...]:
    """The Pallas TPU kernels of an HLO module, each body read with jaxlib's MLIR (which is
    imported only when a module holds one)."""
    from cachedoctor.formats.wire import WireError
    from cachedoctor.xla import mosaic

    if module is None:
        return ()
    try:
        found = mosaic.kernels_in_module(module)
    except WireError:
        return ()
    views = []
    for kernel in found:
        if kernel.body is None:
            views.append(KernelView(kernel.instruction, None, None, (), None, None, "no body"))
            continue
        try:
            d = mosaic.describe(kernel.body)
        except mosaic.MosaicUnreadable as exc:
            digest = mosaic.body_digest(kernel.body)
            views.append(KernelView(kernel.instruction, None, None, (), digest, None, str(exc)))
            continue
        views.append(
            KernelView(
                kernel.instruction,
                d.name,
                d.grid,
                tuple(str(loc) for loc in d.locations),
                mosaic.body_digest(kernel.body),
                d.stripped_sha256,
            )
        )
    return tuple(views)


def entry_kernels(detail: EntryDetail) -> tuple[KernelView, ...]:
    """The kernels ``show`` lists: only a TPU entry's module can hold one."""
    if detail.info.tpu is None or not detail.info.tpu.kernels:
        return ()
    return kernels_of(detail.hlo_module)


def hlo_text_of(hlo_module: bytes) -> str:
    """The HLO text of a module as jaxlib renders it (``show --hlo``), in a child process with
    its memory capped; else, in parentheses, what was refused and why."""
    from cachedoctor.xla.hlo import render_hlo

    rendered = render_hlo(hlo_module)
    if rendered.text is not None:
        return rendered.text
    return f"({rendered.refused or 'jaxlib could not render this module'})"


def _open_entry(entry: Location) -> BinaryIO:
    """The entry's bytes: a local file opened without following a link, or a bucket object."""
    parent = entry.parent
    if entry.local_path is not None or parent is None:
        return open_regular(entry.spelling)
    return parent.store().open_read(entry.name)


def extract_to_file(entry: Location, target: str) -> int:
    """Write the entry's decompressed serialized executable to ``target``; the byte count.

    The file appears whole or not at all (the one atomic write, ``storage/files``), as a new
    file with the mode ``open()`` gives it: an existing ``target`` is never replaced, and a
    damaged entry leaves nothing behind. An entry in a bucket is read through its folder's store.
    Errors are one-line ``CachedoctorError``s: ``exists``, ``io``, ``corrupt``.
    """
    entry_path = entry.spelling
    if os.path.lexists(target):
        raise CachedoctorError(f"{target} exists; not overwriting it", slug="exists")
    try:
        source = _open_entry(entry)
    except OSError as exc:
        raise path_error(exc, entry_path, what="file") from None
    try:
        with source, atomic_file(target, mode=new_file_mode(), create=True) as out:
            return reader.extract_payload(entry_path, out, fileobj=source)
    except ValueError as exc:
        raise CachedoctorError(f"cannot extract {entry_path}: {exc}", slug="corrupt") from exc
    except FileExistsError:
        raise CachedoctorError(f"{target} exists; not overwriting it", slug="exists") from None
    except OSError as exc:
        raise path_error(exc, target, what="file", verb="write") from None
