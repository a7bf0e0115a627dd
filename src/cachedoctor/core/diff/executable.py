"""The payloads compared section by section: sizes and digests of each executable field."""

from __future__ import annotations

import hashlib

from cachedoctor.cache.model import EntryDetail
from cachedoctor.core.diff.report import BytesSection, SectionDiff
from cachedoctor.xla.executable import CPU_EXECUTABLE_FIELDS, GPU_EXECUTABLE_FIELDS
from cachedoctor.xla.tpu import MESSAGES as TPU_MESSAGES


def executable_section(a: EntryDetail, b: EntryDetail) -> BytesSection:
    tpu = a.info.platform == b.info.platform == "tpu"
    if tpu:  # libtpu's six messages, by their index
        names = {i: f"libtpu {name}" for i, name in enumerate(TPU_MESSAGES)}
    else:
        names = GPU_EXECUTABLE_FIELDS if a.info.platform == "gpu" else CPU_EXECUTABLE_FIELDS
    fa = {d.number: d for d in a.executable_fields}
    fb = {d.number: d for d in b.executable_fields}
    sections: list[SectionDiff] = []

    def digest(data: bytes | None) -> str | None:
        return hashlib.sha256(data).hexdigest() if data is not None else None

    def size(data: bytes | None) -> int | None:
        return len(data) if data is not None else None

    top = [
        ("pjrt_ifrt header", a.ifrt_header, b.ifrt_header),
        ("compile options", a.compile_options, b.compile_options),
        ("HLO module", a.hlo_module, b.hlo_module),
        ("HLO module config", a.hlo_config, b.hlo_config),
    ]
    for name, x, y in top:
        if x is None and y is None:
            continue
        sections.append(SectionDiff(name, None, size(x), size(y), digest(x) == digest(y)))
    for number in sorted(set(fa) | set(fb)):
        if number == 1 and not tpu:
            continue  # shown as HLO module and config above
        da, db = fa.get(number), fb.get(number)
        sections.append(
            SectionDiff(
                names.get(number, f"field {number}"),
                number,
                da.size if da else None,
                db.size if db else None,
                da is not None and db is not None and da.sha256 == db.sha256,
                scalar=(da or db) is not None and (da or db).value is not None,  # type: ignore[union-attr]
            )
        )
    if a.info.pjrt_client_name or b.info.pjrt_client_name:
        sections.append(
            SectionDiff(
                "pjrt client name",
                None,
                len(a.info.pjrt_client_name or ""),
                len(b.info.pjrt_client_name or ""),
                a.info.pjrt_client_name == b.info.pjrt_client_name,
            )
        )
    identical = a.info.executable_digest == b.info.executable_digest
    return BytesSection(identical, tuple(sections))
