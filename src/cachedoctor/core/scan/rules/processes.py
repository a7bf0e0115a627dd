"""Findings about the processes of ``jax.distributed`` jobs that share the cache, from the key
manifests (each names its process and the autotune sub-cache mode its compile options carried):
seed 004's roles (only process 0 updates the autotune sub-cache) and keys of processes > 0
that differ from process 0's only in what JAX hashes per process.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding
from cachedoctor.errors import count
from cachedoctor.stablekeys.manifest import Manifest
from cachedoctor.stablekeys.processes import PER_PROCESS_COMPONENTS, per_process_keys

Manifests = Sequence[Mapping[str, object] | None]


def _parsed(manifests: Manifests) -> list[Manifest]:
    out = []
    for m in manifests:
        if m is None:
            continue
        try:
            out.append(Manifest.from_dict(dict(m)))
        except (TypeError, ValueError):  # a manifest of another shape: not evidence here
            continue
    return out


def first_process_only(manifests: Manifests) -> list[Mapping[str, object] | None]:
    """The manifests not written by a process > 0 of a job (JAX stores only from process 0, so
    theirs never have an entry: that is not "not stored" but one key per process)."""
    return [m for m in manifests if m is None or not _of_later_process(m)]


def _of_later_process(m: Mapping[str, object]) -> bool:
    index = m.get("process_index")
    return isinstance(index, int) and index > 0


def process_findings(manifests: Manifests) -> list[Finding]:
    parsed = [m for m in _parsed(manifests) if m.process_index is not None]
    if not parsed:
        return []
    return [*_autotune_role_findings(parsed), *_per_process_findings(parsed)]


def _autotune_role_findings(manifests: list[Manifest]) -> list[Finding]:
    updating: dict[int, set[str]] = defaultdict(set)
    for m in manifests:
        if (m.process_index or 0) > 0 and m.autotune_mode == "UPDATE":
            updating[int(m.process_index or 0)].add(m.module_name)
    if not updating:
        return []
    processes = ", ".join(str(p) for p in sorted(updating))
    modules = sorted(set().union(*updating.values()))
    return [
        catalog.MULTI_PROCESS_AUTOTUNE.finding(
            f"process(es) {processes} of a jax.distributed job compiled with the autotune "
            "sub-cache in UPDATE mode: every process writes it (JAX gives processes other "
            f"than 0 READ), e.g. {', '.join(modules[:3])}",
            entries=tuple(
                m.key
                for m in manifests
                if (m.process_index or 0) > 0 and m.autotune_mode == "UPDATE"
            ),
        )
    ]


def _per_process_findings(manifests: list[Manifest]) -> list[Finding]:
    found = per_process_keys(manifests)
    if not found:
        return []
    fields = sorted({f for k in found for f in k.fields})
    modules = sorted({k.module for k in found})
    processes = sorted({k.process_index for k in found})
    shown = ", ".join(modules[:5]) + (", …" if len(modules) > 5 else "")
    return [
        catalog.MULTI_PROCESS_KEYS.finding(
            f"{count(len(modules), 'module has', 'modules have')} keys in process(es) "
            f"{', '.join(map(str, processes))} that differ from process 0's only in "
            f"{', '.join(fields)}: {shown}",
            entries=tuple(k.key for k in found),
            what_jax_hashes_per_process="; ".join(PER_PROCESS_COMPONENTS[f] for f in fields),
        )
    ]
