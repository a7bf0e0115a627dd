"""The framing of an entry's payload, around the executable: private to ``reader``.

After the 4-byte compile-time prefix a payload is an ``ExecutableAndOptionsProto``, preceded
from jax 0.9.1 by a varint-length ``pjrt_ifrt`` metadata header and on GPU from 0.9.1 written
as a Riegeli split proto (see docs/format.md). This module recognises the header on evidence
(``_payload_prefix``), reassembles a split payload (``_unsplit``) and walks the payload's
fields, as a stream (``_walk_payload``) or sliced from a buffer (``_walk_payload_buffer``),
handing the executable to ``_executable_walk``. It is separate from ``reader`` because it is
the one part of the decode that knows the framing; only ``reader`` imports it.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable

from cachedoctor.cache._executable_walk import (
    RIEGELI_MAGIC,
    _capped,
    _format_problem_kind,
    _Walk,
    _walk_executable,
    _walk_executable_buffer,
)
from cachedoctor.cache.decompress import DecodeFailure
from cachedoctor.cache.model import FieldDigest
from cachedoctor.formats import wire
from cachedoctor.formats.errors import FormatError
from cachedoctor.xla import gpu, tpu

MAX_OPTIONS_BYTES = 64 << 20
MAX_HEADER_BYTES = 64 << 20
# A reassembled split-proto payload: fixed at 8 GiB (reader.DEFAULT_MAX_DECOMPRESSED's value),
# whatever cap the caller set on decompression.
MAX_UNSPLIT_BYTES = 8 << 30
IFRT_RUNTIME = b"pjrt_ifrt"  # SerializedXlaExecutableMetadata.runtime_name of jaxlib's header


def _ifrt_header_at(window: bytes) -> tuple[int, bytes] | None:
    """``(prefix length, header)`` when ``window`` starts with a ``pjrt_ifrt`` header, else None.

    Evidence, not one byte: the varint length must parse, the header must decode as a
    ``SerializedXlaExecutableMetadata`` (field 1 a version number, field 2 if present a runtime
    name), and what follows must open an ``ExecutableAndOptionsProto`` (field 1) or a Riegeli
    file. A bare proto's first bytes (``0a`` + length; field 1 is then not a number) and a
    header of 131 bytes (``83 01``) pass or fail on these grounds, not on their first byte.
    """
    try:
        length, start = wire.read_varint(window, 0, len(window))
    except wire.WireError:
        return None
    end = start + length
    if length == 0 or end >= len(window):
        return None
    header = window[start:end]
    try:
        fields = wire.fields_by_number(header)
    except wire.WireError:
        return None
    version, runtime = wire.first(fields, 1), wire.first(fields, 2)
    if not isinstance(version, int) or isinstance(runtime, int):
        return None
    try:
        bytes(runtime or b"").decode("utf-8")
    except UnicodeDecodeError:
        return None
    if runtime is not None and bytes(runtime) == IFRT_RUNTIME:
        return start, header  # what follows is the plugin's own: libtpu's, or a layout unknown
    if not _opens_payload(window[end:]):
        return None
    return start, header


def _opens_payload(data: bytes) -> bool:
    """Whether ``data`` can start an ``ExecutableAndOptionsProto``: plain (field 1) or Riegeli."""
    if data.startswith(RIEGELI_MAGIC):
        return True
    if data[:1] != b"\x0a":
        return False
    try:
        wire.read_varint(data, 1, len(data))
    except wire.WireError:
        return False
    return True


def _payload_prefix(peek: Callable[[int], bytes]) -> tuple[int, bytes] | None:
    """``(prefix length, header)`` when the payload opens with a ``pjrt_ifrt`` header, else
    None. ``peek(n)`` shows up to ``n`` bytes of the payload. Raises DecodeFailure when there
    is nothing after the compile-time prefix."""
    head = peek(wire.MAX_VARINT_BYTES + len(RIEGELI_MAGIC))
    if not head:
        raise DecodeFailure("truncated", "no executable after the compile-time prefix")
    if head.startswith(RIEGELI_MAGIC):
        return None
    try:
        claimed, start = wire.read_varint(head, 0, len(head))
    except wire.WireError:
        claimed, start = -1, 0
    if 0 < claimed <= MAX_HEADER_BYTES:
        return _ifrt_header_at(peek(start + claimed + wire.MAX_VARINT_BYTES + 8))
    return None


def _not_executable_and_options(head: bytes) -> bool:
    """Whether the executable (after any header) is not an ``ExecutableAndOptionsProto`` nor a
    Riegeli file: then it is libtpu's layout, or one cachedoctor does not know."""
    return not head.startswith(RIEGELI_MAGIC) and not _opens_payload(head)


def _note_plugin_payload(walk: _Walk, data: memoryview, header: bool) -> None:
    """A payload in a plugin's own layout: libtpu's is read whole (``xla.tpu``); any other is
    ``unknown-layout`` after a pjrt_ifrt header (a newer libtpu, another plugin: no verdict),
    and damage without one (neither JAX's header nor any payload JAX writes)."""
    try:
        walk.tpu_executable = tpu.decode_tpu_executable(data)
    except tpu.UnknownLayout as exc:
        if not header:
            raise DecodeFailure(
                "header",
                "payload is neither an ExecutableAndOptionsProto, a Riegeli file, libtpu's"
                f" executable nor a pjrt_ifrt header (starts {bytes(data[:8]).hex(' ')})",
            ) from exc
        raise DecodeFailure(
            "unknown-layout",
            "after its pjrt_ifrt header the payload is in a layout cachedoctor does not know"
            f" ({exc}; starts {bytes(data[:8]).hex(' ')}): no verdict on it",
        ) from exc
    except FormatError as exc:
        raise DecodeFailure("protobuf", f"TPU executable: {exc}") from exc
    executable = walk.tpu_executable
    if walk.hash_fields:  # detail decodes: each message's digest (diff compares them)
        for index, message in enumerate(tpu.read_messages(data)):
            digest = hashlib.sha256(message).hexdigest()
            walk.digests.append(FieldDigest(index, len(message), digest))
    walk.hlo_module = executable.hlo_module
    walk.hlo_config = executable.hlo_config
    walk.compile_options = executable.compile_options
    walk.fields["payload_format"] = "ifrt" if header else "pjrt"


def _note_ifrt_header(walk: _Walk, header: bytes) -> None:
    hf = wire.fields_by_number(header)
    walk.ifrt_header = header
    walk.fields["ifrt_version"] = wire.as_int(wire.first(hf, 1))
    walk.fields["runtime_name"] = wire.as_str(wire.first(hf, 2))


def _walk_payload(stream: wire.ByteStream, walk: _Walk) -> None:
    found = _payload_prefix(stream.peek)
    if found is not None:
        prefix, header = found
        stream.skip(prefix + len(header))
        _note_ifrt_header(walk, header)
    if _not_executable_and_options(stream.peek(wire.MAX_VARINT_BYTES)):
        _note_plugin_payload(walk, memoryview(_read_rest(stream)), found is not None)
        return
    if stream.peek(len(RIEGELI_MAGIC)) == RIEGELI_MAGIC:
        stream = _unsplit_payload(stream, walk)
    walk.fields["payload_format"] = "pjrt" if found is None else "ifrt"
    for number, _wt, value in wire.iter_stream_fields(stream):
        if not isinstance(value, wire.StreamField):
            continue
        if number == 1:
            try:
                _walk_executable(value, walk)
            except wire.StreamEnd as exc:
                raise value._runaway() from exc
            except wire.WireError as exc:
                # not a proto we know (e.g. TPU's opaque payload): skip it, keep the rest
                walk.fields["opaque_executable"] = str(exc)
                value.skip_rest()
        elif number == 2:
            walk.compile_options = value.read(MAX_OPTIONS_BYTES)
        elif number == 3:
            walk.fields["pjrt_client_name"] = value.read(4096).decode("utf-8", "replace")


def _walk_payload_buffer(payload: memoryview, walk: _Walk) -> None:
    """``_walk_payload`` over a payload held in memory: the same steps, with fields sliced out
    of the buffer by ``wire.field_list`` instead of read from a stream one by one (a CPU
    executable holds hundreds of small object files; streaming them cost a quarter of a large
    program's decode).

    Raises WireError or DecodeFailure wherever the stream walk would note or report something
    (an executable that is not a proto we know, a field over its limit): the caller then lets
    the stream decoder say it, in its words and offsets.
    """
    found = _payload_prefix(lambda n: bytes(payload[:n]))
    if found is not None:
        prefix, header = found
        payload = payload[prefix + len(header) :]
        _note_ifrt_header(walk, header)
    if _not_executable_and_options(bytes(payload[: wire.MAX_VARINT_BYTES])):
        _note_plugin_payload(walk, payload, found is not None)
        return
    if payload[: len(RIEGELI_MAGIC)] == RIEGELI_MAGIC:
        payload = memoryview(_unsplit(bytes(payload), walk))
    walk.fields["payload_format"] = "pjrt" if found is None else "ifrt"
    for number, wt, value in wire.field_list(payload):
        if wt != wire.LEN:
            continue
        assert isinstance(value, memoryview)
        if number == 1:
            _walk_executable_buffer(value, walk)
        elif number == 2:
            walk.compile_options = bytes(_capped(value, MAX_OPTIONS_BYTES))
        elif number == 3:
            walk.fields["pjrt_client_name"] = bytes(_capped(value, 4096)).decode("utf-8", "replace")


def _unsplit_payload(stream: wire.ByteStream, walk: _Walk) -> wire.ByteStream:
    """A GPU payload written as a Riegeli split proto: reassemble it, walk the result."""
    return wire.ByteStream(io.BytesIO(_unsplit(_read_rest(stream), walk)))


def _read_rest(stream: wire.ByteStream) -> bytes:
    """The rest of the payload, for the layouts read whole (a split proto, libtpu's)."""
    parts = []
    read = 0
    while chunk := stream.read_some(1 << 20):
        read += len(chunk)
        if read > MAX_UNSPLIT_BYTES:
            raise DecodeFailure("too-large", f"payload over {MAX_UNSPLIT_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _unsplit(data: bytes, walk: _Walk) -> bytes:
    try:
        unwrapped = gpu.unwrap_pjrt_payload(data, max_bytes=MAX_UNSPLIT_BYTES)
    except FormatError as exc:
        raise DecodeFailure(_format_problem_kind(exc), f"split-proto payload: {exc}") from exc
    walk.payload_split = True
    return unwrapped.executable_and_options
