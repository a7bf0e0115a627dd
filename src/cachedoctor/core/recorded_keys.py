"""What went into each entry's key when it was written, as the cache kept it: the stable hook's
key manifests (JAX's own key too, in observe mode) and the stats records' missed keys that were
then written. ``preflight`` sets it against this environment, ``unpack`` against the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cachedoctor.core.usage import records as usage_records
from cachedoctor.core.usage.model import MissedKey
from cachedoctor.storage.location import Location
from cachedoctor.storage.urls import jax_spelling

# An evidence value: the cache dir as JAX spelled it when a manifest's entry was written
WRITTEN_IN = "cache dir when written"


@dataclass(frozen=True)
class Evidence:
    """What went into an entry's key when it was written, as a record or manifest kept it."""

    source: str  # "stats record" or "key manifest"
    kind: str  # "jax" (JAX's own key) or "stable" (the stable hook's)
    components: dict[str, str]
    values: dict[str, tuple[str, ...]]
    devices: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    stable_key: str | None = None  # an observe-mode manifest's: the stable hook's key for it


def evidence_from_records(where: Location) -> dict[str, Evidence]:
    """Each written key a stats record kept the components of (the latest record wins); the
    records ``stats --zero`` archived count too."""
    found = usage_records.read_evidence(where.store())
    kept: dict[str, tuple[float, Evidence]] = {}
    for record in found:
        for m in record.missed.values():
            if m.outcome not in (None, "writes") or kept.get(m.key, (-1.0,))[0] > m.time:
                continue
            kept[m.key] = (m.time, evidence_of_miss(m))
    return {key: ev for key, (_, ev) in kept.items()}


def evidence_of_miss(m: MissedKey) -> Evidence:
    return Evidence("stats record", m.kind, dict(m.components), m.values, m.devices, m.settings)


def evidence_from_manifests(where: Location) -> dict[str, Evidence]:
    """Each key manifest's components: the stable hook's keys (and JAX's, in observe mode)."""
    from cachedoctor.stablekeys import manifest

    out: dict[str, Evidence] = {}
    for m in manifest.iter_manifests(where):
        values: dict[str, tuple[str, ...]] = {}
        if m.versions.get("jaxlib"):
            values["jax_lib version"] = (m.versions["jaxlib"],)
        if m.platform.get("platform"):
            values["backend version"] = (
                m.platform["platform"],
                m.platform.get("platform_version", ""),
            )
        values["XLA flags"] = tuple(m.xla_flags)
        for c in m.components:
            if c.get("name") == "compile_options" and c.get("data"):
                values["compile_options"] = ("b64:" + str(c["data"]),)
        if m.cache_dir:
            values[WRITTEN_IN] = (jax_spelling(m.cache_dir),)
        components = {str(c["name"]): str(c["digest"]) for c in m.components}
        kind = "stable" if m.mode == "stable" else "jax"
        twin = m.stable_key if kind == "jax" and m.stable_key != m.key else None
        out[m.key] = Evidence("key manifest", kind, components, values, stable_key=twin)
    return out


def recorded_evidence(where: Location) -> dict[str, Evidence]:
    """What went into each entry's key where the cache kept it: key manifests, then the stats
    records' written missed keys (a record wins)."""
    evidence = evidence_from_manifests(where)
    evidence.update(evidence_from_records(where))
    return evidence
