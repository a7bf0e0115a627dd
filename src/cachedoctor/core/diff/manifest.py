"""The key manifests of both entries compared: each hashed component, the volatile inputs the
hook canonicalised, versions, and the recorded module texts.
"""

from __future__ import annotations

import difflib

from cachedoctor.core.diff.report import (
    NO_MANIFEST,
    ComponentDiff,
    EntrySide,
    ManifestSection,
    VolatileInput,
)
from cachedoctor.formats import wire
from cachedoctor.stablekeys.manifest import Manifest, load_ir, load_manifest
from cachedoctor.xla import optiondiff, optionschema


def _render_component(name: str, data: str | None) -> str | None:
    if data is None:
        return None
    import base64

    try:
        raw = base64.b64decode(data)
    except ValueError:
        return None
    if name == "compile_options":
        return f"<{len(raw)} bytes of serialized CompileOptionsProto>"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.hex()
    return text if text.isprintable() else raw.hex()


def _component_fields(name: str, a: str | None, b: str | None) -> tuple[optiondiff.FieldDiff, ...]:
    if name != "compile_options" or a is None or b is None:
        return ()
    import base64

    try:
        return tuple(
            optiondiff.diff_messages(
                base64.b64decode(a), base64.b64decode(b), optionschema.COMPILE_OPTIONS
            )
        )
    except (ValueError, wire.WireError):
        return ()


def _ir_backend_configs(text: str) -> list[tuple[str, str]]:
    """(target, backend_config) of each custom call in a recorded module's text."""
    import re

    out = []
    for line in text.splitlines():
        if "custom_call" not in line:
            continue
        target = re.search(r'call_target_name\s*=\s*"([^"]*)"', line) or re.search(
            r"custom_call\s*@(\w+)", line
        )
        config = re.search(r'backend_config\s*=\s*"([^"]*)"', line)
        if target and config:
            out.append((target.group(1), config.group(1)))
    return out


def _components(ma: Manifest, mb: Manifest) -> list[ComponentDiff]:
    """Each hashed key component of either manifest, in A's order then B's extra ones."""
    ca = {c["name"]: c for c in ma.components}
    cb = {c["name"]: c for c in mb.components}
    order = [c["name"] for c in ma.components] + [
        c["name"] for c in mb.components if c["name"] not in ca
    ]
    components = []
    for name in order:
        x, y = ca.get(name, {}), cb.get(name, {})
        same = x.get("digest") == y.get("digest")
        xa, yb = x.get("data"), y.get("data")
        if name == "XLA flags":
            ra = " ".join(ma.xla_flags) if name in ca else None
            rb = " ".join(mb.xla_flags) if name in cb else None
        else:
            ra, rb = _render_component(name, xa), _render_component(name, yb)
        components.append(
            ComponentDiff(
                name,
                same,
                x.get("digest"),
                y.get("digest"),
                ra,
                rb,
                () if same else _component_fields(name, xa, yb),
            )
        )
    return components


def manifest_section(a: EntrySide, b: EntrySide, context: int) -> ManifestSection:
    try:
        ma = load_manifest(a.cache_dir, a.key)
        mb = load_manifest(b.cache_dir, b.key)
    except (OSError, ValueError) as exc:
        return ManifestSection(False, f"{NO_MANIFEST} (a manifest is unreadable: {exc})")
    if ma is None or mb is None:
        which = "either entry" if ma is None and mb is None else ("A" if ma is None else "B")
        return ManifestSection(
            False,
            f"{NO_MANIFEST} (no manifest for {which})",
            stable_keys=(_of(ma, "stable_key"), _of(mb, "stable_key")),
            jax_keys=(_of(ma, "jax_key"), _of(mb, "jax_key")),
            hooked=(_hooked(ma), _hooked(mb)),
        )
    components = _components(ma, mb)
    va = {v["field"]: v for v in ma.volatile}
    vb = {v["field"]: v for v in mb.volatile}
    volatile = tuple(
        VolatileInput(
            f,
            va.get(f, {}).get("raw"),
            vb.get(f, {}).get("raw"),
            va.get(f, {}).get("canonical"),
            vb.get(f, {}).get("canonical"),
        )
        for f in sorted(set(va) | set(vb))
    )
    versions = tuple(
        (k, ma.versions.get(k), mb.versions.get(k))
        for k in sorted(set(ma.versions) | set(mb.versions))
        if ma.versions.get(k) != mb.versions.get(k)
    )
    ir_diff: tuple[str, ...] = ()
    configs: list[tuple[str, str, str]] = []
    ir_a = load_ir(a.cache_dir, a.key) if ma.has_ir else None
    ir_b = load_ir(b.cache_dir, b.key) if mb.has_ir else None
    if ir_a is not None and ir_b is not None:
        ir_diff = tuple(
            difflib.unified_diff(
                ir_a.splitlines(),
                ir_b.splitlines(),
                "A (recorded module)",
                "B (recorded module)",
                n=context,
                lineterm="",
            )
        )
        for (ta, xa_), (_tb, xb_) in zip(
            _ir_backend_configs(ir_a), _ir_backend_configs(ir_b), strict=False
        ):
            configs.append((ta, xa_, xb_))
    note = "manifests recorded by the stable-key hook"
    if not (ir_a and ir_b):
        note += " (no recorded module text: the hook ran without record_ir)"
    return ManifestSection(
        available=True,
        note=note,
        stable_keys=(ma.stable_key, mb.stable_key),
        jax_keys=(ma.jax_key, mb.jax_key),
        components=tuple(components),
        volatile=volatile,
        versions=versions,
        ir_diff=ir_diff,
        backend_configs=tuple(configs),
        hooked=(_hooked(ma), _hooked(mb)),
    )


def _of(m: Manifest | None, name: str) -> str | None:
    return None if m is None else getattr(m, name)


def _hooked(m: Manifest | None) -> bool:
    """The entry's key is the hook's stable key: a stable-mode manifest whose key is not the
    hook's fallback to JAX's own (as ``core/usage/lookups.looked_up_by_hook`` reads it)."""
    return m is not None and m.mode == "stable" and m.key_mode != "fallback"
