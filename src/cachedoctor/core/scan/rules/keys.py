"""Findings about cache keys: the same program under several keys (unstable or not), entries
written for a cache at another path (relocated), and which keys the stable hasher made.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from cachedoctor.cache import reader
from cachedoctor.cache.jaxenv import JaxInfo
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core import catalog
from cachedoctor.core.findings import Finding
from cachedoctor.core.scan.report import KeyModeUse
from cachedoctor.errors import count

if TYPE_CHECKING:
    from cachedoctor.stablekeys.manifest import Manifest


def duplicate_groups(entries: Iterable[EntryInfo]) -> list[list[EntryInfo]]:
    """Groups of entries holding the same program (modulo volatile fields) under several keys.

    Entries are grouped by ``program_digest`` (see ``hlo.canonicalize``); within a group the
    most recently written entry comes first. The same program under two keys is not by itself
    evidence of an unstable key: JAX hashes the module before optimisation, and different
    inputs (a result name, a no-op convert, a static argument) optimise to one program.
    """
    groups: dict[tuple[str | None, str], list[EntryInfo]] = defaultdict(list)
    for e in entries:
        if e.program_digest is not None:
            groups[(e.module, e.program_digest)].append(e)
    out = [sorted(g, key=lambda e: -e.mtime_ns) for g in groups.values() if len(g) > 1]
    out.sort(key=lambda g: (g[0].module or "", g[0].key))
    return out


def unstable_key_evidence(group: list[EntryInfo]) -> dict[str, str] | None:
    """What shows that a group's keys changed between runs (the entry, where in its HLO, what:
    the fields of ``catalog.UNSTABLE_KEY``'s evidence), or None when nothing does.

    Only a key input that the stored HLO itself shows to change per process counts: a
    backend_config holding an address, or the output of a ``custom_partitioning`` op (its
    ``CustomSPMDPartitioning`` config is a Python object address that JAX hashes).
    """
    for e in sorted(group, key=lambda e: e.key):  # the same words for a copy of the cache
        for v in e.volatile:
            if v.category in reader.KEY_VOLATILE_CATEGORIES:
                return {"entry": e.key, "where": v.where, "detail": v.detail}
    return None


def unstable_groups(
    entries: Iterable[EntryInfo],
) -> list[tuple[list[EntryInfo], dict[str, str]]]:
    """Same-program groups with evidence that their key is unstable, and that evidence.

    Shared by ``scan`` (``unstable-key``) and ``prune --duplicates``: nothing else is removed.
    Groups whose compile options name different cache paths are the ``relocated`` finding's.
    """
    out = []
    for group in duplicate_groups(entries):
        if _names_other_cache_paths(group):
            continue
        evidence = unstable_key_evidence(group)
        if evidence is not None:
            out.append((group, evidence))
    return out


def _names_other_cache_paths(group: list[EntryInfo]) -> bool:
    return len({e.autotune_dir for e in group}) > 1 or len({e.kernel_cache_file for e in group}) > 1


def same_program_findings(
    entries: list[EntryInfo], manifests: Iterable[Mapping[str, object] | None] = ()
) -> list[Finding]:
    """``unstable-key`` where evidence shows it, else the information "same program, N keys".

    The key manifests say which of an unstable group's keys runs compute again (the same
    evidence ``prune --duplicates`` reads, ``usage/lookups``): a stable-mode one is the key
    hooked runs look up every run, an observe-mode one shows whether JAX's own key held the
    pointer. Reads (``-atime``, access times) are left to ``prune --duplicates``' plan: the
    scan's memo does not digest access times."""
    by_key = _manifests_by_key(manifests)
    findings = []
    for group in duplicate_groups(entries):
        if _names_other_cache_paths(group):
            continue  # one cause, one finding: see relocated_findings
        module = group[0].module or "(unnamed)"
        identical = len({e.executable_digest for e in group}) == 1
        how = "identical executables" if identical else "the same program (modulo volatile fields)"
        keys = tuple(e.key for e in group)
        evidence = unstable_key_evidence(group)
        if evidence is not None:
            findings.append(_unstable_key(module, how, group, evidence, by_key))
            continue
        findings.append(
            catalog.SAME_PROGRAM.finding(
                f"{module}: the same program under {len(group)} keys",
                module=module,
                entries=keys,
                how=how,
            )
        )
    return findings


def kernel_location_findings(entries: list[EntryInfo], jax_info: JaxInfo) -> list[Finding]:
    """``kernel-locations``: entries of one module equal but for their Pallas kernels, whose
    bodies are equal once stripped of debug information (read by the kernel tier,
    ``cache/tiers.kernel_candidates``), yet differ: the same kernels from other source places."""
    groups: dict[tuple[str | None, str, tuple[str | None, ...]], list[EntryInfo]] = defaultdict(
        list
    )
    for e in entries:
        t = e.tpu
        if t is None or not t.kernels or not t.masked_program_digest or not e.ok:
            continue
        stripped = tuple(k.stripped_sha256 for k in t.kernels)
        if None not in stripped:
            groups[(e.module, t.masked_program_digest, stripped)].append(e)
    findings = []
    for (module, _, stripped), group in sorted(groups.items(), key=lambda kv: str(kv[0][0])):
        bodies = {tuple(k.body_sha256 for k in e.tpu.kernels) for e in group}  # type: ignore[union-attr]
        if len(bodies) < 2:
            continue
        findings.append(_kernel_locations(module or "(unnamed)", group, stripped, jax_info))
    return findings


def _kernel_locations(
    module: str, group: list[EntryInfo], stripped: tuple[str | None, ...], jax_info: JaxInfo
) -> Finding:
    group = sorted(group, key=lambda e: (e.mtime_ns, e.key))
    kernels = group[0].tpu.kernels  # type: ignore[union-attr]
    moved = [
        n
        for n in range(len(kernels))
        if len({e.tpu.kernels[n].body_sha256 for e in group}) > 1  # type: ignore[union-attr]
    ]
    names = ", ".join(f"`{kernels[n].name or kernels[n].instruction}`" for n in moved)
    first = moved[0]

    def place(e: EntryInfo) -> str:
        locations = e.tpu.kernels[first].locations  # type: ignore[union-attr]
        return locations[0] if locations else "?"

    places = ", ".join(dict.fromkeys(place(e) for e in group))
    where = ", ".join(f"{place(e)} ({e.key[: len(module) + 5]}…)" for e in group)
    kind = "kernel" if len(moved) == 1 else "kernels"
    return catalog.KERNEL_LOCATIONS.finding(
        f"{module}: {len(group)} entries differ only in the debug locations of Mosaic {kind} "
        f"{names} ({places})",
        module=module,
        entries=tuple(e.key for e in group),
        stripped=", ".join((s or "?")[:12] for s in stripped),
        where=where,
        jax=str(jax_info.jax_version),
        hashes=_hashes_kernel_locations(jax_info),
    )


def _hashes_kernel_locations(jax_info: JaxInfo) -> str:
    """Whether the installed JAX hashes Mosaic debug locations (its cache_key.py, read)."""
    if jax_info.strips_kernel_locations is None:
        return "may hash (its cache_key.py could not be read)"
    return "strips" if jax_info.strips_kernel_locations else "hashes"


def _manifests_by_key(manifests: Iterable[Mapping[str, object] | None]) -> dict[str, Manifest]:
    from cachedoctor.stablekeys.manifest import Manifest

    out = {}
    for m in manifests:
        if m is None or not isinstance(m.get("key"), str):
            continue
        try:
            found = Manifest.from_dict(dict(m))
        except (TypeError, ValueError, KeyError, AttributeError):
            continue  # a manifest of another schema says nothing here
        out[found.key] = found
    return out


def _unstable_key(
    module: str,
    how: str,
    group: list[EntryInfo],
    evidence: Mapping[str, str],
    by_key: Mapping[str, Manifest],
) -> Finding:
    """The ``unstable-key`` finding: what changes per run, and which keys manifests show runs
    look up again (none: plain JAX's keys, whose use only records of reads can tell)."""
    from cachedoctor.core.usage import lookups

    stable = [e.key for e in group if lookups.looked_up_by_hook(by_key.get(e.key))]
    pointer = [e.key for e in group if lookups.pointer_evidence(by_key.get(e.key))]
    bare = len(group) - sum(1 for e in group if e.key in by_key)
    other = len(group) - len(stable) - len(pointer) - bare
    said = []
    if stable:
        said.append(
            f"{len(stable)} under a stable-key manifest, the key hooked runs look up every run"
        )
    if pointer:
        said.append(f"{len(pointer)} whose manifest shows a per-process pointer in the key")
    if other:
        said.append(f"{other} whose observe-mode manifest shows no pointer in JAX's key")
    if bare:
        said.append(f"{bare} without a manifest (plain JAX's keys)")
    return catalog.UNSTABLE_KEY.filled(
        f"{module}: {len(group)} entries hold {how} under different keys, and a key input "
        "changes from run to run",
        {
            **evidence,
            "count": str(len(group)),
            "by_manifest": ", ".join(said),
            "hooked": "hooked runs hit their stable key; " if stable else "",
        },
        module=module,
        entries=tuple(e.key for e in group),
    )


def _hit_values(root: str, option: str) -> frozenset[str]:
    """The values of ``option`` that a JAX run with the cache dir spelled ``root`` hashes.

    JAX builds ``str(Path(root) / option)`` (``storage.urls.jax_subpath``): the spelling, not the
    directory, so a relative, ``..`` or symbolic-link spelling of this directory is another key
    (JAX misses there) and a doubled or trailing slash is not. For a bucket, the local folder
    `enable` gives its sub-caches (``storage.urls.subcache_dir_for``) counts too.
    """
    from cachedoctor.storage.urls import jax_subpath, subcache_dir_for

    values = {jax_subpath(root, option)}
    local = subcache_dir_for(root)
    if local is not None:
        values.add(os.path.join(local, option))
    return frozenset(values)


def _misses(value: str, option: str, hits: frozenset[str]) -> bool:
    """Whether a stored ``option`` value shows JAX misses the entry at the spelling judged.

    A value whose last part is not the option's name was not built by JAX from a cache dir
    (``XLA_FLAGS`` set it, with JAX's sub-caches off): a run hashes it whatever the cache dir's
    spelling, so it is no evidence of a move.
    """
    return value not in hits and value.rpartition("/")[2] == option


def stable_hasher_keys(manifests: Iterable[Mapping[str, object] | None]) -> frozenset[str]:
    """Keys of entries stored under cachedoctor's stable hasher, from their manifests.

    The stable hasher makes cache-dir paths relative before hashing (``stablekeys.keys``), so
    such an entry hits wherever the cache is: its stored paths are not evidence of a move.
    """
    return frozenset(
        str(m["key"])
        for m in manifests
        if m is not None and m.get("mode") == "stable" and isinstance(m.get("key"), str)
    )


def key_modes_by_entry(
    manifests: Iterable[Mapping[str, object] | None],
) -> dict[str, tuple[str, str]]:
    """Entry key -> (key mode, why), from the manifests (``key_mode_reason`` says why)."""
    from cachedoctor.stablekeys.manifest import Manifest, key_mode_reason

    modes = {}
    for m in manifests:
        if m is None or not isinstance(m.get("key"), str):
            continue
        try:
            found = Manifest.from_dict(dict(m))
            modes[found.key] = (found.key_mode, key_mode_reason(found))
        except (TypeError, ValueError, KeyError, AttributeError):
            continue  # a manifest of another schema: no key mode to show
    return modes


def count_modes(modes: Iterable[tuple[str, str]]) -> tuple[KeyModeUse, ...]:
    counted = Counter(modes)
    return tuple(KeyModeUse(mode, reason, n) for (mode, reason), n in sorted(counted.items()))


def observe_manifest_keys(manifests: Iterable[Mapping[str, object] | None]) -> frozenset[str]:
    """Keys of entries with a manifest of the hook's observe mode: ``rekey --relocated`` can
    move such an entry to its stable key (the manifest records the key's components)."""
    return frozenset(
        str(m["key"])
        for m in manifests
        if m is not None and m.get("mode") == "observe" and isinstance(m.get("key"), str)
    )


def relocated_findings(
    root: str,
    entries: list[EntryInfo],
    jax_info: JaxInfo,
    stable_keys: frozenset[str],
    rekeyable: frozenset[str] = frozenset(),
) -> list[Finding]:
    """``relocated``: entries whose stored sub-cache path is not the string JAX builds from the
    cache dir spelled ``root`` (the spelling cachedoctor was given), for an option that this JAX
    hashes into the key: a run with that spelling misses them, whatever directory they sit in.
    ``rekeyable``: the keys ``rekey --relocated`` can move (its advice names it only for them).
    """
    checks = (
        ("autotune_dir", "xla_gpu_per_fusion_autotune_cache_dir", jax_info.hashes_autotune_dir),
        ("kernel_cache_file", "xla_gpu_kernel_cache_file", jax_info.hashes_kernel_cache_file),
    )
    hits = {option: _hit_values(root, option) for _, option, _ in checks}
    moved: dict[str, list[tuple[EntryInfo, str]]] = defaultdict(list)
    other = _OtherJaxlib()
    judged: dict[tuple[str, str], bool] = {}  # entries name few distinct paths: judge each once
    for e in entries:
        if e.key in stable_keys:
            continue  # its key hashes the paths relative to the cache: see stable_hasher_keys
        for attr, option, hashed in checks:
            value = getattr(e, attr)
            if not value or hashed is False:
                continue
            miss = judged.get((option, value))
            if miss is None:
                miss = judged[(option, value)] = _misses(value, option, hits[option])
            if miss and not other.wrote(e):
                moved[option].append((e, value))
    hashed_by_option = {option: hashed for _, option, hashed in checks}
    return [
        _relocated(root, option, pairs, jax_info, hashed_by_option[option], hits[option], rekeyable)
        for option, pairs in moved.items()
    ] + other.findings()


class _OtherJaxlib:
    """The entries another jaxlib wrote, by the DebugOptions fields their compile options set
    that the installed jaxlib does not define: JAX misses them for that, not their path."""

    def __init__(self) -> None:
        self.judged: dict[str, tuple[frozenset[int], str] | None] = {}
        self.entries: list[EntryInfo] = []
        self.fields: set[int] = set()
        self.jaxlib = ""

    def wrote(self, e: EntryInfo) -> bool:
        from cachedoctor.xla.optionschema import undefined_debug_fields

        if e.debug_fields is None:
            return False
        if e.debug_fields not in self.judged:  # one run's entries share their options
            self.judged[e.debug_fields] = undefined_debug_fields(e.debug_fields)
        found = self.judged[e.debug_fields]
        if not found or not found[0]:
            return False
        if e not in self.entries:
            self.entries.append(e)
        self.fields |= found[0]
        self.jaxlib = found[1].split(" (", 1)[0]  # "jaxlib 0.10.2 (libjax_common.so)"
        return True

    def findings(self) -> list[Finding]:
        if not self.entries:
            return []
        shown = sorted(self.fields)
        fields = ", ".join(map(str, shown[:5])) + (
            f" and {len(shown) - 5} more" if len(shown) > 5 else ""
        )
        n = len(self.entries)
        return [
            catalog.OTHER_JAXLIB.finding(
                f"{count(n, 'entry', 'entries')} for a cache at another path "
                f"{'was' if n == 1 else 'were'} written by another jaxlib than the installed "
                f"{self.jaxlib}, which never hits {'it' if n == 1 else 'them'}, wherever the "
                "cache is",
                entries=tuple(e.key for e in self.entries),
                jaxlib=self.jaxlib,
                fields=fields,
            )
        ]


def _relocated(
    root: str,
    option: str,
    pairs: list[tuple[EntryInfo, str]],
    jax_info: JaxInfo,
    hashed: bool | None,
    hits: frozenset[str],
    rekeyable: frozenset[str],
) -> Finding:
    from cachedoctor.storage.urls import jax_spelling

    elsewhere = sorted({os.path.dirname(v) or "." for v in {v for _, v in pairs}})
    certainty = "will never" if hashed else "may never"
    modules = len({e.module for e, _ in pairs})
    spelled = jax_spelling(root)
    observed = sum(1 for e, _ in pairs if e.key in rekeyable)
    case = catalog.RELOCATED_REKEYABLE if observed else catalog.RELOCATED
    return case.finding(
        f"{len(pairs)} entries ({modules} modules) were written for a cache spelled "
        f"{', '.join(elsewhere)}; their keys hash {option} and JAX "
        f"{jax_info.jax_version or '?'} {certainty} hit them with the cache dir spelled {spelled}",
        entries=tuple(e.key for e, _ in pairs),
        option=option,
        elsewhere=", ".join(elsewhere),
        stored=elsewhere[0],
        spelled=spelled,
        builds=" or ".join(sorted(hits)),
        hashed=(
            f"JAX {jax_info.jax_version} hashes that option into the key"
            if hashed
            else "whether this JAX hashes that option is unknown"
        ),
        observed=str(observed),
    )
