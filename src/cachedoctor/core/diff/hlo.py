"""The compiled modules compared: the canonical HLO's unified diff, and every value that
normalisation removed (names, ids, metadata, pointer configs), with both real values.
"""

from __future__ import annotations

import difflib
import hashlib
from collections import Counter
from collections.abc import Sequence

from cachedoctor.cache.model import EntryDetail
from cachedoctor.core.diff.report import MAX_EXAMPLES, HloSection, KernelSection, RemovedDiff
from cachedoctor.formats.wire import WireError
from cachedoctor.xla import hlo as hlo_mod
from cachedoctor.xla import mosaic
from cachedoctor.xla.hlo_identity import MODULE_FIELDS, identities, module_level_fields


def _pairs(
    a_lines: Sequence[str], b_lines: Sequence[str], matcher: difflib.SequenceMatcher[str]
) -> list[tuple[int, int]]:
    """Aligned line pairs: equal blocks, and replaced blocks of the same length."""
    out = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            out += list(zip(range(i1, i2), range(j1, j2), strict=True))
    return out


def _module_fields(a_mod: bytes, b_mod: bytes) -> list[RemovedDiff]:
    """Module-level fields that differ; the canonical lines hold only the computations."""
    fa, fb = module_level_fields(a_mod), module_level_fields(b_mod)
    out = []
    for number in sorted(set(fa) | set(fb)):
        raw_a, raw_b = fa.get(number, []), fb.get(number, [])
        if raw_a == raw_b:
            continue
        category, what = MODULE_FIELDS.get(number, ("module-field", f"field {number}"))
        out.append(RemovedDiff(category, what, "module", _short(raw_a), _short(raw_b)))
    return out


def _short(values: list[int | bytes]) -> str:
    if not values:
        return "(unset)"
    parts = []
    for v in values:
        if isinstance(v, int):
            parts.append(str(v))
        elif v.isascii() and v.decode("ascii").isprintable() and len(v) <= 80:
            parts.append(v.decode("ascii"))
        else:
            parts.append(f"<{len(v)} bytes sha256:{hashlib.sha256(v).hexdigest()[:12]}>")
    return parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"


def _removed(
    a_mod: bytes, b_mod: bytes, pairs: list[tuple[int, int]], n_a: int, n_b: int
) -> tuple[list[RemovedDiff], str | None]:
    ia, ib = identities(a_mod), identities(b_mod)
    if len(ia) != n_a or len(ib) != n_b:
        return [], "could not align removed values with the canonical lines"
    out = _module_fields(a_mod, b_mod)
    for i, j in pairs:
        x, y = ia[i], ib[j]
        kind = "computation name" if x.is_computation else "instruction name"
        if x.name != y.name:
            out.append(RemovedDiff("numbering", kind, x.where, x.name, y.name))
        if x.id != y.id:
            id_kind = "computation id" if x.is_computation else "instruction id"
            out.append(RemovedDiff("numbering", id_kind, x.where, str(x.id), str(y.id)))
        if x.is_computation:
            continue
        for what, va, vb in (
            ("source location", x.location, y.location),
            ("op_name", x.op_name, y.op_name),
            ("op_type", x.op_type, y.op_type),
        ):
            if va != vb:
                out.append(RemovedDiff("metadata", what, x.where, va or "-", vb or "-"))
        if x.config != y.config:
            out.append(
                RemovedDiff(
                    "backend_config-pointer",
                    "backend_config",
                    x.where,
                    x.config or "-",
                    y.config or "-",
                )
            )
    return out, None


def hlo_section(a: EntryDetail, b: EntryDetail, context: int, raw: bool) -> HloSection:
    if a.hlo_module is None or b.hlo_module is None or a.info.hlo is None or b.info.hlo is None:
        return HloSection(
            False,
            False,
            (0, 0),
            0,
            ((), ()),
            ("", ""),
            (),
            (),
            (),
            note="an entry holds no readable HLO module",
        )
    ca, cb = hlo_mod.canonicalize(a.hlo_module), hlo_mod.canonicalize(b.hlo_module)
    matcher = difflib.SequenceMatcher(None, ca.lines, cb.lines, autojunk=False)
    changed_a = changed_b = 0  # per side, so that "N of M instructions" never exceeds M
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            changed_a += sum(1 for line in ca.lines[i1:i2] if line.startswith("  %"))
            changed_b += sum(1 for line in cb.lines[j1:j2] if line.startswith("  %"))
    changed = max(changed_a, changed_b)
    udiff = tuple(
        difflib.unified_diff(
            ca.lines, cb.lines, "A (canonical)", "B (canonical)", n=context, lineterm=""
        )
    )
    removed, note = _removed(
        a.hlo_module,
        b.hlo_module,
        _pairs(ca.lines, cb.lines, matcher),
        len(ca.lines),
        len(cb.lines),
    )
    counts = Counter((r.category, r.what) for r in removed)
    kept: list[RemovedDiff] = []
    seen: Counter[tuple[str, str]] = Counter()
    for r in removed:
        seen[(r.category, r.what)] += 1
        if seen[(r.category, r.what)] <= MAX_EXAMPLES:
            kept.append(r)
    raw_diff: tuple[str, ...] | None = None
    if raw:
        ra, rb = hlo_mod.render_hlo(a.hlo_module), hlo_mod.render_hlo(b.hlo_module)
        if ra.text is None or rb.text is None:  # each side that has none says why, as show does
            raw_diff = tuple(
                f"{side}: ({r.refused or 'jaxlib could not render this module'})"
                for side, r in (("A", ra), ("B", rb))
                if r.text is None
            )
        else:
            raw_diff = tuple(
                difflib.unified_diff(
                    ra.text.splitlines(),
                    rb.text.splitlines(),
                    "A (HLO text)",
                    "B (HLO text)",
                    n=context,
                    lineterm="",
                )
            )
    return HloSection(
        available=True,
        same_canonical=ca.digest == cb.digest,
        instructions=(a.info.hlo.instructions, b.info.hlo.instructions),
        changed_instructions=changed,
        parameters=(a.info.hlo.parameters, b.info.hlo.parameters),
        results=(a.info.hlo.result, b.info.hlo.result),
        canonical_diff=udiff,
        removed_counts=tuple((c, w, n) for (c, w), n in sorted(counts.items())),
        removed=tuple(kept),
        raw_diff=raw_diff,
        note=note,
    )


def kernel_section(a: EntryDetail, b: EntryDetail) -> KernelSection | None:
    """The two entries' Pallas TPU kernels compared, or None when neither holds one."""
    if not (a.info.tpu and a.info.tpu.kernels) and not (b.info.tpu and b.info.tpu.kernels):
        return None
    if a.hlo_module is None or b.hlo_module is None:
        return None
    try:
        compared = mosaic.compare_kernels(a.hlo_module, b.hlo_module)
    except WireError:
        return None
    if compared is None:
        return None
    note: str | None = compared.unreadable
    if not compared.pairs and compared.only_debug_info is False:
        note = "the modules hold different tpu_custom_call instructions"
    return KernelSection(compared.pairs, compared.only_debug_info, note)
