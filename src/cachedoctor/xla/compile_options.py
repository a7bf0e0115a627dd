"""XLA's CompileOptionsProto in an entry: the fields cachedoctor reads, and a canonical form."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

from cachedoctor.formats import wire

# DebugOptions field numbers (xla/xla.proto), see docs/format.md.
DEBUG_DEVICE_COUNT = 102
DEBUG_DUMP_TO = 109
DEBUG_KERNEL_CACHE_FILE = 306
DEBUG_AUTOTUNE_DIR = 310
DEBUG_AUTOTUNE_MODE = 324
DEBUG_AUTOTUNER_CACHE_DIR = 407

AUTOTUNE_MODES = {0: "unspecified", 1: "update", 2: "read"}

# DebugOptions fields derived from the cache directory (docs/format.md): a different value with
# the same last component means the cache was moved or copied.
CACHE_PATH_FIELDS = frozenset(
    {DEBUG_AUTOTUNE_DIR, DEBUG_KERNEL_CACHE_FILE, DEBUG_AUTOTUNER_CACHE_DIR}
)
# DebugOptions fields JAX clears before hashing (jax/_src/cache_key.py,
# ``_hash_serialized_compile_options``, the same list in jax 0.10.2 and 0.12), see
# docs/format.md: xla_gpu_cuda_data_dir (61), xla_force_host_platform_device_count (102), the
# xla_dump_* options (109-116, 118, 132, 144, 149, 151, 153, 154, 164) and the autotune cache
# mode (324). The autotune dir (310), cleared from 0.12 on, is a relocation (CACHE_PATH_FIELDS).
CLEARED_BY_JAX = frozenset(
    {
        61,
        102,
        *range(DEBUG_DUMP_TO, 117),
        118,
        132,
        144,
        149,
        151,
        153,
        154,
        164,
        DEBUG_AUTOTUNE_MODE,
    }
)


def debug_field_number(numbers: tuple[int, ...]) -> int | None:
    """The DebugOptions field number of a field path through CompileOptionsProto
    (3 executable_build_options, 3 debug_options) or HloModuleConfigProto (14 debug_options)."""
    if len(numbers) == 3 and numbers[:2] == (3, 3):
        return numbers[2]
    if len(numbers) == 2 and numbers[0] == 14:
        return numbers[1]
    return None


def _decode_debug_options(buf: wire.Buffer, out: dict[str, object]) -> None:
    f = wire.fields_by_number(buf)
    out["host_device_count"] = wire.as_int(wire.first(f, DEBUG_DEVICE_COUNT))
    out["autotune_dir"] = wire.as_str(wire.first(f, DEBUG_AUTOTUNE_DIR)) or None
    out["kernel_cache_file"] = wire.as_str(wire.first(f, DEBUG_KERNEL_CACHE_FILE)) or None
    mode = wire.as_int(wire.first(f, DEBUG_AUTOTUNE_MODE))
    out["autotune_mode"] = AUTOTUNE_MODES.get(mode, str(mode)) if mode is not None else None
    out["debug_fields"] = number_ranges(f)


def number_ranges(numbers: Iterable[int]) -> str:
    """Field numbers as sorted ranges, ``1-3,5,7-9``: which DebugOptions fields an entry's
    compile options set. JAX serializes every default of the jaxlib that compiled it, so a
    number the installed jaxlib does not define shows an entry of another jaxlib."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(set(numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(_span(run))
        run = [n]
    if run:
        out.append(_span(run))
    return ",".join(out)


def _span(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def parse_ranges(text: str) -> frozenset[int]:
    """The numbers of :func:`number_ranges`' text (an empty text: none)."""
    numbers: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        numbers.update(range(int(low), int(high or low) + 1))
    return frozenset(numbers)


def decode_compile_options(buf: wire.Buffer) -> dict[str, object]:
    """The fields of CompileOptionsProto that matter to findings (docs/format.md)."""
    out: dict[str, object] = {}
    f = wire.fields_by_number(buf)
    ebo = wire.first(f, 3)
    if ebo is None or isinstance(ebo, int):
        return out
    ef = wire.fields_by_number(ebo)
    out["num_replicas"] = wire.as_int(wire.first(ef, 4))
    out["num_partitions"] = wire.as_int(wire.first(ef, 5))
    spmd = wire.as_int(wire.first(ef, 6))
    out["use_spmd_partitioning"] = bool(spmd) if spmd is not None else None
    shardy = wire.as_int(wire.first(ef, 19))
    out["use_shardy"] = bool(shardy) if shardy is not None else None
    out["process_index"] = wire.as_int(wire.first(ef, 22))
    out["process_count"] = wire.as_int(wire.first(ef, 23))
    debug = wire.first(ef, 3)
    if debug is not None and not isinstance(debug, int):
        _decode_debug_options(debug, out)
    return out


def canonical_compile_options(buf: wire.Buffer) -> bytes:
    """Compile options with cache-dir-derived paths reduced to their last component.

    This is what makes a relocated entry compare equal to the original in ``program_digest``.
    """
    f_out = bytearray()
    for number, wt, value in wire.iter_fields(buf):
        if number == 3 and wt == wire.LEN and not isinstance(value, int):
            inner = bytearray()
            for n2, wt2, v2 in wire.iter_fields(value):
                if n2 == 3 and wt2 == wire.LEN and not isinstance(v2, int):
                    v2 = memoryview(_canonical_debug_options(bytes(v2)))
                inner += wire.encode_field(n2, wt2, v2)
            value = memoryview(bytes(inner))
        f_out += wire.encode_field(number, wt, value)
    return bytes(f_out)


@functools.lru_cache(maxsize=64)
def _canonical_debug_options(buf: bytes) -> bytes:
    """DebugOptions in a canonical encoding: map entries sorted, cache paths reduced.

    Memoised: distinct programs of one run share their DebugOptions byte for byte, and
    re-encoding them costs ~4 ms an entry.

    Map fields (e.g. 357, latency-estimator options) serialize in hash order, so two runs of
    the same program can differ only in map order (seen with jax 0.6.2).
    """
    grouped: dict[int, list[tuple[int, wire.FieldValue]]] = {}
    for number, wt, value in wire.iter_fields(buf):
        if number in (DEBUG_DUMP_TO, DEBUG_AUTOTUNE_MODE):
            continue  # JAX clears these before hashing too
        if number in (DEBUG_AUTOTUNE_DIR, DEBUG_KERNEL_CACHE_FILE, DEBUG_AUTOTUNER_CACHE_DIR) and (
            not isinstance(value, int)
        ):
            value = memoryview(os.path.basename(bytes(value).rstrip(b"/")))
        grouped.setdefault(number, []).append((wt, value))
    out = bytearray()
    for number in sorted(grouped):
        values = grouped[number]
        if len(values) > 1 and all(wt == wire.LEN for wt, _ in values):
            values = sorted(values, key=lambda item: bytes(item[1]))
        for wt, value in values:
            out += wire.encode_field(number, wt, value)
    return bytes(out)
