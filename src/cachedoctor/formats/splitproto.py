"""Reassemble XLA "split protos" (``xla/util/split_proto``) into the message they stand for.

From jax 0.9.1, GPU entries hold ``ExecutableAndOptionsProto`` as a Riegeli file; from 0.10.1 the
``GpuExecutableProto`` inside is split the same way (docs/format-gpu.md). Record 0 is an
``xla.SplitProtoManifest`` {1 result_proto_type, 2 records}; each manifest record says how to
apply the next file record:

* ``proto_merge_record`` (field 2): the record is a serialized message merged into the result.
  Merging serialized protos is concatenation, so we append its bytes.
* ``field_override_record`` (field 3): {1 field_path [{1 field_number}], 2 field_type}; the record
  is the raw value of a string/bytes field (type 1 = STRING). We re-encode it as that field at
  its path and append it, which gives the same result as XLA's ``SetString`` (last value wins).
* a record of a kind we do not know is skipped, as XLA's reader does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cachedoctor.formats import riegeli
from cachedoctor.formats.errors import CorruptFormat, TooLarge, UnsupportedFormat
from cachedoctor.formats.wire import LEN, VARINT, WireError, encode_field, iter_fields

Buffer = bytes | bytearray | memoryview

FIELD_TYPE_STRING = 1
DEFAULT_MAX_BYTES = 1 << 30
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class ManifestRecord:
    """How one record is applied: kind is 'merge', 'override' or 'unknown'."""

    kind: str
    field_path: tuple[int, ...] = ()
    field_type: int = 0


@dataclass(frozen=True)
class Manifest:
    result_proto_type: str
    records: tuple[ManifestRecord, ...]


@dataclass(frozen=True)
class SplitProto:
    """The reassembled message and how it was put together."""

    result_proto_type: str
    message: bytes
    record_kinds: tuple[str, ...]
    problems: tuple[str, ...]


def encode_len_field(number: int, payload: bytes) -> bytes:
    """Tag and length prefix for a LEN field, then the payload."""
    return encode_field(number, LEN, payload)


# FieldPathPart's oneof besides field_number (split_proto.proto, as embedded in jaxlib 0.10.2).
_PATH_PART_FIELDS = {2: "a repeated_field_index", 3: "a string_map_key", 4: "an int_map_key"}


def _manifest_record(raw: memoryview) -> ManifestRecord:
    kind = "unknown"
    path: tuple[int, ...] = ()
    field_type = 0
    for number, wire_type, value in iter_fields(raw):
        if number == 2 and wire_type == LEN:
            kind, path, field_type = "merge", (), 0
        elif number == 3 and wire_type == LEN:
            assert isinstance(value, memoryview)
            kind, path, field_type = "override", *_override(value)
    return ManifestRecord(kind, path, field_type)


def _override(raw: memoryview) -> tuple[tuple[int, ...], int]:
    path: list[int] = []
    field_type = 0
    for number, wire_type, value in iter_fields(raw):
        if number == 1 and wire_type == LEN:
            assert isinstance(value, memoryview)
            part: int | None = None
            for pnum, pwt, pval in iter_fields(value):
                if pnum == 1 and pwt == VARINT:
                    assert isinstance(pval, int)
                    part = pval
                else:
                    what = _PATH_PART_FIELDS.get(pnum, f"field {pnum}")
                    raise UnsupportedFormat(
                        f"field override path part has {what}; only plain field numbers are "
                        "supported"
                    )
            if part is None or not 0 < part < 1 << 29:
                raise CorruptFormat(f"field override path part has no valid field number: {part}")
            path.append(part)
        elif number == 2 and wire_type == VARINT:
            assert isinstance(value, int)
            field_type = value
    return tuple(path), field_type


def parse_manifest(record: Buffer) -> Manifest:
    """Decode record 0; raises CorruptFormat unless it is a manifest naming a message type."""
    view = record if isinstance(record, memoryview) else memoryview(record)
    type_name: str | None = None
    records: list[ManifestRecord] = []
    try:
        for number, wire_type, value in iter_fields(view):
            if number == 1 and wire_type == LEN:
                assert isinstance(value, memoryview)
                type_name = bytes(value).decode("utf-8", "strict")
            elif number == 2 and wire_type == LEN:
                assert isinstance(value, memoryview)
                records.append(_manifest_record(value))
    except (WireError, UnicodeDecodeError) as exc:
        raise CorruptFormat(f"split-proto manifest does not parse: {exc}") from None
    if not type_name or not _TYPE_NAME.fullmatch(type_name):
        raise CorruptFormat("first record is not a split-proto manifest (no result type)")
    return Manifest(type_name, tuple(records))


def reassemble(
    records: Sequence[bytes],
    *,
    expected_type: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> SplitProto:
    """Build the full message bytes from a split proto's records (record 0 is the manifest)."""
    if not records:
        raise CorruptFormat("split proto has no records (no manifest)")
    manifest = parse_manifest(records[0])
    if expected_type is not None and manifest.result_proto_type != expected_type:
        raise UnsupportedFormat(
            f"split proto holds {manifest.result_proto_type}, expected {expected_type}"
        )
    if len(records) - 1 < len(manifest.records):
        raise CorruptFormat(
            f"manifest lists {len(manifest.records)} records but the file has {len(records) - 1}"
        )
    problems: list[str] = []
    parts: list[bytes] = []
    total = 0
    for index, (spec, data) in enumerate(zip(manifest.records, records[1:], strict=False), 1):
        if spec.kind == "merge":
            piece = data
        elif spec.kind == "override":
            if spec.field_type != FIELD_TYPE_STRING:
                raise UnsupportedFormat(
                    f"record {index}: field override of type {spec.field_type} is not supported"
                )
            if not spec.field_path:
                raise CorruptFormat(f"record {index}: field override has an empty field path")
            piece = encode_len_field(spec.field_path[-1], data)
            for number in reversed(spec.field_path[:-1]):
                piece = encode_len_field(number, piece)
        else:
            problems.append(f"record {index}: unknown manifest record kind, skipped")
            continue
        total += len(piece)
        if total > max_bytes:
            raise TooLarge(f"reassembled message exceeds the {max_bytes}-byte limit")
        parts.append(piece)
    extra = len(records) - 1 - len(manifest.records)
    if extra:
        problems.append(f"{extra} record(s) after those the manifest lists were ignored")
    return SplitProto(
        manifest.result_proto_type,
        b"".join(parts),
        tuple(r.kind for r in manifest.records),
        tuple(problems),
    )


def is_split_proto(data: Buffer, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bool:
    """True if ``data`` is a Riegeli file whose first record is a split-proto manifest.

    Like XLA's ``IsSplitProto`` this never raises: anything unreadable is simply not a split
    proto. Only the first chunk is decoded, but it may hold the manifest together with megabytes
    of the records after it (Riegeli cuts chunks by size), so the limit is that of a whole file.
    """
    if not riegeli.is_riegeli(data):
        return False
    try:
        first = riegeli.read_first_record(data, max_bytes=max_bytes)
        if first is None:
            return False
        parse_manifest(first)
    except ValueError:
        return False
    return True


def read_split_proto(
    data: Buffer, *, expected_type: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> SplitProto:
    """Decode a Riegeli split proto held in memory into the full message."""
    file = riegeli.read_records(data, max_bytes=max_bytes)
    return reassemble(file.records, expected_type=expected_type, max_bytes=max_bytes)
