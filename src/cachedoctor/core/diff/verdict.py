"""The verdict: the strongest statement the evidence allows, each reason naming its data."""

from __future__ import annotations

from cachedoctor.cache.model import EntryDetail
from cachedoctor.core.diff.options import first_option, is_relocation, is_volatile_option
from cachedoctor.core.diff.report import (
    ENABLE_ADVICE,
    BytesSection,
    HloSection,
    KernelSection,
    ManifestSection,
    OptionsSection,
    Verdict,
    VerdictKind,
)
from cachedoctor.xla import executable
from cachedoctor.xla.executable import cpu_layout_eras
from cachedoctor.xla.hlo_identity import identities


def _pair(label: str, x: object, y: object) -> str:
    return f"{label} {x} vs {y}"


def _cpu_target(detail: EntryDetail) -> tuple[str | None, str | None, frozenset[str]]:
    for number, data in detail.small_fields:
        if number == executable.CPU_TARGET_MACHINE_FIELD and detail.info.platform == "cpu":
            return executable.cpu_target_machine(data) or (None, None, frozenset())
    return None, None, frozenset()


def _custom_partitioning_evidence(detail: EntryDetail) -> str | None:
    if detail.hlo_module is None:
        return None
    found = [
        i for i in identities(detail.hlo_module) if i.op_name and "custom_partitioning" in i.op_name
    ]
    if not found:
        return None
    return (
        f"the compiled module's metadata names a custom_partitioning op "
        f"(op_name {found[0].op_name!r} on {len(found)} instructions); its "
        "CustomSPMDPartitioning call carries a per-process pointer in backend_config that JAX "
        "hashes into the key, and is partitioned away before the module is stored"
    )


def decide(
    a: EntryDetail,
    b: EntryDetail,
    same_file: bool,
    options: OptionsSection,
    hlo: HloSection,
    execs: BytesSection,
    manifest: ManifestSection,
    dirs: tuple[str, str],
    kernels: KernelSection | None = None,
) -> Verdict:
    """The strongest statement the evidence allows: same file, same bytes, same program, else
    what differs (platform, JAX era, topology, target, program, options). ``dirs``: the cache
    directories of A and B, as the report names them; ``kernels``: their Pallas kernels."""
    ia, ib = a.info, b.info
    if same_file:
        return Verdict(
            VerdictKind.IDENTICAL, "identical: A and B are the same file", (), None, True
        )
    if ia.executable_digest == ib.executable_digest:
        return _same_executable_verdict(a, b, manifest, dirs)
    if ia.program_digest is not None and ia.program_digest == ib.program_digest:
        return _same_program_verdict(options, hlo, execs)
    if kernels is not None and (ia.platform, ia.format_label) == (ib.platform, ib.format_label):
        moved = _kernels_moved_verdict(kernels, options, execs)
        if moved is not None:
            return moved
    claims = [
        *_platform_claims(a, b),
        *_era_claims(a, b),
        *_topology_claims(a, b, options),
        *_target_claims(a, b),
        *_kernel_claims(kernels, options),
        *_program_claims(hlo, options),
    ]
    kind: VerdictKind | None = None
    line = ""
    because: list[str] = []
    for claimed, text in claims:  # the first claim is the verdict, the rest are reasons
        if claimed is not None and kind is None:
            kind, line = claimed, text
        else:
            because.append(text)
    if kind is None:
        sec = [s.name for s in execs.sections if not s.same]
        kind = VerdictKind.DIFFERENT_PROGRAM
        line = "different entries: " + (", ".join(sec) or "payloads") + " differ"
    relocated = [d for d in options.compile_options if is_relocation(d)]
    if relocated:
        because.append("also relocated: " + first_option(relocated))
    return Verdict(kind, line, tuple(because), None, False)


# A verdict step's output: (a verdict it supports, or None for a plain reason; the sentence)
_Claim = tuple[VerdictKind | None, str]


def _same_executable_verdict(
    a: EntryDetail, b: EntryDetail, manifest: ManifestSection, dirs: tuple[str, str]
) -> Verdict:
    """Byte-identical payloads: identical under one key, else a key input the entry lacks."""
    ia, ib = a.info, b.info
    digest = (ia.executable_digest or "")[:16]
    if ia.key == ib.key:
        return Verdict(
            VerdictKind.IDENTICAL,
            f"identical: same key and byte-identical payloads (sha256 {digest}…)",
            (f"A is in {dirs[0]}, B in {dirs[1]}",),
            None,
            True,
        )
    because = [
        f"the decompressed payloads are byte-identical (sha256 {digest}…): same compiled "
        "module, compile options and object code"
    ]
    pair = _stable_and_plain(manifest, ia.key, ib.key)
    if pair is not None:
        return _stable_and_plain_verdict(a, pair, because)
    changed = [c for c in manifest.components if not c.same]
    if manifest.available and changed:
        because.append("the key manifests differ in: " + ", ".join(c.name for c in changed))
    moved = [v for v in manifest.volatile if v.a_raw != v.b_raw]
    cp = _custom_partitioning_evidence(a)
    if moved:
        v = moved[0]
        line = (
            "same executable under different keys: keys differ only in volatile input "
            f"{v.field} {v.a_raw} vs {v.b_raw} (key instability)"
        )
        because.append(
            f"the manifests record {v.field} = {v.a_raw} (A) and {v.b_raw} (B); the hook "
            "canonicalises it to "
            + ("the same value" if v.a_canonical == v.b_canonical else "different values")
        )
    elif cp:
        line = (
            "same executable under different keys: the keys differ in an input not stored "
            "in the entry; the module's metadata shows a custom_partitioning op, whose "
            "CustomSPMDPartitioning backend_config is a per-run pointer (key instability)"
        )
    else:
        # nothing shows a key input that changes per run: as scan's same-program, no instability
        line = (
            "same executable under different keys: the keys differ in an input not stored "
            "in the entry"
        )
    if cp:
        because.append(cp)
    if not manifest.available:
        because.append(
            "JAX's key also hashes the pre-compilation module, the jaxlib version, XLA "
            "flags, platform version, device topology and compression; the entries do not "
            "store these inputs"
        )
    if manifest.available and manifest.stable_keys[0] == manifest.stable_keys[1]:
        advice = (
            "the stable keys are equal: with `cachedoctor enable` (stable mode) both runs "
            "use one entry"
        )
    elif manifest.available:
        advice = "the stable keys differ too: see the key components below"
    else:
        advice = f"{ENABLE_ADVICE}; with record_ir its manifests name the differing input"
    return Verdict(VerdictKind.SAME_EXECUTABLE, line, tuple(because), advice, True)


def _stable_and_plain(manifest: ManifestSection, key_a: str, key_b: str) -> str | None:
    """Why one key is the hook's stable key and the other plain JAX's key, or None: one
    program under the two keys ``cachedoctor enable`` and plain JAX give it (scan's
    ``same-program``, never instability)."""
    if manifest.hooked[0] == manifest.hooked[1]:
        return None
    s, p = (0, 1) if manifest.hooked[0] else (1, 0)
    name, keys = "AB", (key_a, key_b)
    said = (
        f"{name[s]}'s key is the stable-key hook's (its manifest: stable mode); {name[p]}'s is "
        f"JAX's own (no stable-mode manifest: a run without the hook wrote it)"
    )
    if manifest.jax_keys[s] == keys[p]:
        said += f"; the hook recorded JAX's own key of {name[s]}'s compile: {keys[p]}, {name[p]}'s"
    return said


def _stable_and_plain_verdict(a: EntryDetail, pair: str, because: list[str]) -> Verdict:
    because.append(pair)
    cp = _custom_partitioning_evidence(a)
    if cp:
        because.append(cp)
    return Verdict(
        VerdictKind.SAME_EXECUTABLE,
        "same executable under two keys: the stable key of `cachedoctor enable` and plain "
        "JAX's key (one program, not key instability)",
        tuple(because),
        "nothing to fix: runs with the hook look up the stable key, runs without it JAX's own",
        True,
    )


def _same_program_verdict(options: OptionsSection, hlo: HloSection, execs: BytesSection) -> Verdict:
    """Equal canonical HLO and options: name the volatile difference that remains."""
    volatile_opts = [d for d in options.compile_options if is_volatile_option(d)]
    relocated = [d for d in volatile_opts if is_relocation(d)]
    pointers = [r for r in hlo.removed if r.category == "backend_config-pointer"]
    because: list[str] = []
    advice: str | None = None
    if relocated:
        line = (
            f"same program, different compile options: {first_option(relocated)} (cache relocated)"
        )
        because.append(
            "the options differ only in paths JAX derives from the cache directory; "
            "the canonical HLO is identical"
        )
        because += _hashes_autotune_dir()
        advice = (
            "a relocated cache misses on jax versions that hash this path; "
            f"{ENABLE_ADVICE} (paths relative to the cache dir)"
        )
    elif volatile_opts:
        line = (
            f"same program, different compile options: {first_option(volatile_opts)} "
            "(JAX clears this field before hashing)"
        )
    elif pointers:
        p = pointers[0]
        value_b = p.b.split(": ", 1)[-1]
        line = (
            f"same program, keys differ only in volatile input: {p.a} vs {value_b} "
            "(key instability)"
        )
        advice = ENABLE_ADVICE if "CustomSPMDPartitioning" in p.a else None
    elif hlo.removed:
        kinds = sorted({r.what for r in hlo.removed})
        line = "same program; only " + ", ".join(kinds) + " differ (removed by normalisation)"
    else:
        sec = [s.name for s in execs.sections if not s.same]
        line = "same program, compiled to different bytes: " + (", ".join(sec) or "payload")
        because.append("the canonical HLO and compile options are identical")
    if options.ifrt_header:
        because.append("the pjrt_ifrt header differs: " + first_option(list(options.ifrt_header)))
    return Verdict(VerdictKind.SAME_PROGRAM, line, tuple(because), advice, True)


def _hashes_autotune_dir() -> list[str]:
    """Whether the installed JAX hashes the autotune path, as a reason (empty when unknown)."""
    from cachedoctor.cache.jaxenv import installed_jax

    jax_info = installed_jax()
    if jax_info.hashes_autotune_dir is None:
        return []
    return [
        f"the installed jax {jax_info.jax_version} "
        + ("hashes" if jax_info.hashes_autotune_dir else "does not hash")
        + f" xla_gpu_per_fusion_autotune_cache_dir into the key ({jax_info.cache_key_source})"
    ]


def _platform_claims(a: EntryDetail, b: EntryDetail) -> list[_Claim]:
    ia, ib = a.info, b.info
    if ia.platform == ib.platform:
        return []
    return [
        (VerdictKind.DIFFERENT_PLATFORM, _pair("different platforms:", ia.platform, ib.platform))
    ]


def _era_claims(a: EntryDetail, b: EntryDetail) -> list[_Claim]:
    """Different JAX/XLA versions, only where the layout shows two eras."""
    ia, ib = a.info, b.info
    claims: list[_Claim] = []
    if ia.format_label != ib.format_label:
        claims.append(
            (
                VerdictKind.DIFFERENT_JAX,
                f"different JAX versions: payload format {ia.format_label} (A) vs "
                f"{ib.format_label} (B); the pjrt_ifrt header is written from jax 0.9.1",
            )
        )
    if ia.platform == ib.platform == "cpu":
        only = cpu_layout_eras(
            {d.number for d in a.executable_fields}, {d.number for d in b.executable_fields}
        )
        if only:
            claims.append(
                (
                    VerdictKind.DIFFERENT_JAX,
                    "different JAX/XLA versions: the serialized executable has " + "; ".join(only),
                )
            )
    if ia.runtime_name != ib.runtime_name and ia.runtime_name and ib.runtime_name:
        claims.append((None, _pair("runtime", ia.runtime_name, ib.runtime_name)))
    return claims


def _topology_claims(a: EntryDetail, b: EntryDetail, options: OptionsSection) -> list[_Claim]:
    ia, ib = a.info, b.info
    topo = [
        (label, x, y)
        for label, x, y in (
            ("replicas", ia.num_replicas, ib.num_replicas),
            ("partitions", ia.num_partitions, ib.num_partitions),
            ("host device count", ia.host_device_count, ib.host_device_count),
            ("process count", ia.process_count, ib.process_count),
        )
        if x != y
    ]
    device_assignment = [d for d in options.compile_options if d.numbers[:2] == (3, 9)]
    if not topo and not device_assignment:
        return []
    parts = [_pair(lbl, x, y) for lbl, x, y in topo]
    if device_assignment:
        parts.append("device assignment differs")
    return [(VerdictKind.DIFFERENT_TOPOLOGY, "different device topology: " + ", ".join(parts))]


def _target_claims(a: EntryDetail, b: EntryDetail) -> list[_Claim]:
    ta, tb = _cpu_target(a), _cpu_target(b)
    if not (ta[0] and tb[0]) or ta == tb:
        return []
    parts = []
    if ta[0] != tb[0]:
        parts.append(_pair("triple", ta[0], tb[0]))
    if ta[1] != tb[1]:
        parts.append(_pair("cpu", ta[1], tb[1]))
    if ta[2] != tb[2]:
        only_a, only_b = sorted(ta[2] - tb[2]), sorted(tb[2] - ta[2])
        parts.append(
            f"features differ ({len(only_a)} only in A, {len(only_b)} only in B"
            + (f", e.g. {(only_a or only_b)[0]}" if only_a or only_b else "")
            + ")"
        )
    return [
        (VerdictKind.DIFFERENT_TARGET, "different CPU target machine options: " + ", ".join(parts))
    ]


def _kernels_moved_verdict(
    kernels: KernelSection, options: OptionsSection, execs: BytesSection
) -> Verdict | None:
    """The modules equal but for the Pallas kernels' debug locations (what jax up to 0.10
    hashes into the key), with the same compile options; None when that is not what they show."""
    real_opts = [d for d in options.compile_options if not is_volatile_option(d)]
    moved = [p for p in kernels.pairs if not p.same_body and p.same_stripped]
    if not (kernels.only_debug_info and moved) or real_opts:
        return None
    where = "; ".join(f"Mosaic kernel `{p.name or p.instruction}`: {p.change}" for p in moved)
    because = [
        "the modules are equal once each kernel's debug information is stripped, as jax 0.11 "
        "strips it before hashing (strip-debuginfo on the Mosaic body): its source paths and "
        "lines are all that differ",
        _kernel_key_advice(),
    ]
    program = next((x for x in execs.sections if x.name == "libtpu core program"), None)
    if program is not None and program.same:
        because.append("the compiled TPU program (libtpu's core program) is byte-identical")
    relocated = [d for d in options.compile_options if is_relocation(d)]
    if relocated:
        because.append("also relocated: " + first_option(relocated))
    return Verdict(
        VerdictKind.SAME_PROGRAM,
        f"same program: differs only in the debug locations of {where}",
        tuple(because),
        f"{ENABLE_ADVICE}: its keys leave the kernels' debug locations out, as jax 0.11 does",
        True,
    )


def _kernel_claims(kernels: KernelSection | None, options: OptionsSection) -> list[_Claim]:
    """A Pallas kernel whose body changed beyond its debug locations, or why that cannot be
    told."""
    if kernels is None:
        return []
    changed = [p for p in kernels.pairs if p.same_stripped is False]
    if changed:
        names = ", ".join(f"`{p.name or p.instruction}`" for p in changed)
        return [
            (
                VerdictKind.DIFFERENT_PROGRAM,
                f"different programs: the body of Mosaic kernel {names} differs beyond its "
                "debug locations",
            )
        ]
    if kernels.note:
        return [(None, f"Pallas kernels: {kernels.note}")]
    return []


def _kernel_key_advice() -> str:
    """Whether the installed JAX hashes Mosaic debug locations into the key, as a reason."""
    from cachedoctor.cache.jaxenv import installed_jax

    version = installed_jax().jax_version
    return (
        "jax up to 0.10 hashes these locations into the key, so the same kernel run from another "
        "folder, or a line lower, compiles again (jax 0.11 strips them; `cachedoctor enable` "
        f"strips them on older jax); installed: jax {version}"
    )


def _program_claims(hlo: HloSection, options: OptionsSection) -> list[_Claim]:
    """Shapes, then compile options, then the canonical HLO."""
    claims: list[_Claim] = []
    if hlo.available and hlo.parameters[0] != hlo.parameters[1]:
        claims.append(
            (
                VerdictKind.DIFFERENT_PROGRAM,
                "different programs: parameter shapes differ: "
                f"{', '.join(hlo.parameters[0]) or '()'} vs "
                f"{', '.join(hlo.parameters[1]) or '()'}",
            )
        )
    elif hlo.available and hlo.results[0] != hlo.results[1]:
        claims.append(
            (
                VerdictKind.DIFFERENT_PROGRAM,
                f"different programs: result shapes differ: {hlo.results[0]} vs {hlo.results[1]}",
            )
        )
    real_opts = [d for d in options.compile_options if not is_volatile_option(d)]
    if real_opts:
        n = len(real_opts)
        claims.append(
            (
                VerdictKind.DIFFERENT_OPTIONS,
                f"different compile options ({n} field{'s' if n != 1 else ''}): "
                + first_option(real_opts),
            )
        )
    if hlo.available and not hlo.same_canonical:
        claims.append(
            (
                VerdictKind.DIFFERENT_PROGRAM,
                f"different programs: {hlo.changed_instructions} of "
                f"{max(hlo.instructions)} instructions differ in the canonical HLO",
            )
        )
    elif hlo.available:
        claims.append((None, "the canonical HLO is identical"))
    return claims
