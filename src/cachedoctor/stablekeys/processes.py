"""Processes of one ``jax.distributed`` job sharing a cache: who they are, and which of their
keys differ only in what JAX hashes per process.

JAX hashes ``accelerator_config``, the fingerprint of the topology of the devices it compiles
for (``jax/_src/cache_key.py``, ``_hash_accelerator_config``). On CPU that topology is the
calling process's own devices (their ids and process index), so every process of a job gets
its own key for the same program, and since JAX writes entries only from process 0
(``compiler._cache_write``), the other processes recompile on every run, with or without
cachedoctor. The manifests say which process wrote them (``process_index``), so the difference
can be shown from the evidence: two manifests of one module whose components differ only there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cachedoctor.stablekeys.entry_files import current_process as current_process
from cachedoctor.stablekeys.keys import REPLAY_COMPONENT

# key components JAX computes from the calling process (name -> why it differs per process)
PER_PROCESS_COMPONENTS = {
    "accelerator_config": (
        "JAX hashes the topology of this process's own devices, on CPU their ids and process index"
    ),
}


@dataclass(frozen=True)
class PerProcessKey:
    """A key of process ``process_index`` that differs from process 0's only in ``fields``."""

    module: str
    process_index: int
    key: str
    first_process_key: str  # process 0's key for the same program
    fields: tuple[str, ...]

    def line(self) -> str:
        """One line for ``status``, ``check`` and the hook's stderr."""
        why = "; ".join(PER_PROCESS_COMPONENTS[f] for f in self.fields)
        return (
            f"{self.module}: process {self.process_index}'s key differs from process 0's only in "
            f"{', '.join(self.fields)} ({why}); JAX writes entries only from process 0, so this "
            "process recompiles it on every run, with or without cachedoctor"
        )


def components_of(manifest: Any) -> dict[str, str]:
    """A manifest's key components by name, without its replay variant (a random digest)."""
    return {
        str(c.get("name")): str(c.get("digest"))
        for c in getattr(manifest, "components", None) or []
        if c.get("name") != REPLAY_COMPONENT
    }


def per_process_fields(mine: Mapping[str, str], first: Mapping[str, str]) -> tuple[str, ...]:
    """The components that differ, when all of them are ones JAX hashes per process; else ()."""
    if mine.keys() != first.keys():
        return ()
    differ = tuple(n for n in mine if mine[n] != first[n])
    return differ if differ and all(n in PER_PROCESS_COMPONENTS for n in differ) else ()


def against_first(result: Any, process: int, manifests: Iterable[Any]) -> PerProcessKey | None:
    """This process's key (a hasher result) against process 0's manifests of the same module:
    the first that differs from it only in what JAX hashes per process, or None."""
    for m in manifests:
        if m.process_index == 0:
            fields = per_process_fields(result.components, components_of(m))
            if fields:
                return PerProcessKey(result.module_name, process, result.key, m.key, fields)
    return None


def per_process_keys(manifests: Iterable[Any]) -> list[PerProcessKey]:
    """Keys of processes > 0 that differ from a process-0 key of the same module only in what
    JAX hashes per process (one per module and process), from the manifests' components."""
    firsts: dict[str, list[Any]] = {}
    others = []
    for m in manifests:
        if m.process_index == 0:
            firsts.setdefault(m.module_name, []).append(m)
        elif m.process_index is not None:
            others.append(m)
    found: dict[tuple[str, int], PerProcessKey] = {}
    for m in sorted(others, key=lambda m: (m.module_name, m.process_index, m.key)):
        where = (m.module_name, int(m.process_index))
        if where in found:
            continue
        mine = components_of(m)
        for first in firsts.get(m.module_name, []):
            fields = per_process_fields(mine, components_of(first))
            if fields:
                found[where] = PerProcessKey(m.module_name, where[1], m.key, first.key, fields)
                break
    return list(found.values())
