"""GPU executables of every documented layout, built from docs/format-gpu.md with the test encoders
(no GPU here), plain and as split protos, plus damaged input.
"""

from __future__ import annotations

import contextlib
import random

import pytest

from cachedoctor.formats.errors import CorruptFormat, FormatError, TooLarge, UnsupportedFormat
from cachedoctor.formats.wire import fields_by_number
from cachedoctor.xla import gpu
from tests.support.gpu_vectors import (
    BUFFERS,
    CC_H100,
    CONFIG,
    CUBIN,
    DNN,
    HLO,
    PTX,
    THUNKS,
    WITH_CONFIG,
    f_bytes,
    f_varint,
    manifest,
    riegeli_file,
)

CONSTANTS = [f_bytes(12, f_bytes(1, f"const_{i}") + f_varint(3, i)) for i in range(2)]


COMPILATION_RESULT = (
    f_bytes(1, WITH_CONFIG)
    + f_bytes(2, BUFFERS)
    + f_bytes(3, PTX)
    + f_bytes(4, CUBIN)
    + b"".join(DNN)
)


COMPILATION_RESULT_V0 = (
    f_bytes(1, HLO) + f_bytes(2, BUFFERS) + f_bytes(3, PTX) + f_bytes(4, CUBIN) + f_bytes(5, CONFIG)
)


LEGACY = COMPILATION_RESULT + CC_H100 + f_bytes(8, "jit_matmul")


THUNKS_PLAIN = LEGACY + b"".join(THUNKS) + b"".join(CONSTANTS) + f_bytes(10, f_bytes(1, b""))


def split_gpu_executable() -> bytes:
    """As WriteSplitGpuExecutable: manifest, asm_text, binary, dnn graphs, constants, rest."""
    kinds: list[object] = [3, 4, "merge", *(["merge"] * len(CONSTANTS)), "merge"]
    rest = (
        f_bytes(1, WITH_CONFIG)
        + f_bytes(2, BUFFERS)
        + CC_H100
        + f_bytes(8, "jit_matmul")
        + b"".join(THUNKS)
    )
    records = [manifest(gpu.GPU_EXECUTABLE, kinds), PTX, CUBIN, b"".join(DNN), *CONSTANTS, rest]
    return riegeli_file(records, "snappy")


def pjrt_payload(executable: bytes, *, split: bool) -> bytes:
    autotune_dir = "/tmp/cache/xla_gpu_per_fusion_autotune_cache_dir"
    options = f_bytes(3, f_bytes(3, f_bytes(310, autotune_dir)))
    rest = f_bytes(2, options) + f_bytes(3, gpu.GPU_CLIENT_NAME)
    if not split:
        return f_bytes(1, executable) + rest
    return riegeli_file([manifest(gpu.EXECUTABLE_AND_OPTIONS, [1, "merge"]), executable, rest])


def test_compilation_result_proto() -> None:
    ex = gpu.decode_gpu_executable(COMPILATION_RESULT)
    assert ex.layout == "compilation_result"
    assert ex.hlo_module == HLO
    assert ex.module_name == "jit_matmul"
    assert (ex.ptx_size, ex.cubin_size) == (len(PTX), len(CUBIN))
    assert ex.cudnn_graph_count == 2
    assert ex.compute_capability is None
    assert (ex.thunk_count, ex.was_split) == (0, False)


def test_oldest_compilation_result_has_a_bare_module() -> None:
    ex = gpu.decode_gpu_executable(COMPILATION_RESULT_V0)
    assert ex.layout == "compilation_result_v0"
    assert ex.hlo_module == HLO
    assert ex.cudnn_graph_count == 0  # field 5 is the config there, not a graph map
    assert ex.module_name == "jit_matmul"


def test_gpu_executable_legacy() -> None:
    ex = gpu.decode_gpu_executable(LEGACY)
    assert ex.layout == "gpu_executable_legacy"
    assert ex.compute_capability == "9.0"
    assert ex.hlo_module == HLO
    assert ex.thunk_count == 0


def test_gpu_executable_with_thunks() -> None:
    ex = gpu.decode_gpu_executable(THUNKS_PLAIN)
    assert ex.layout == "gpu_executable_thunks"
    assert (ex.thunk_count, ex.constant_count) == (5, 2)


def test_split_gpu_executable() -> None:
    data = split_gpu_executable()
    ex = gpu.decode_gpu_executable(data)
    assert ex.was_split
    assert ex.layout == "gpu_executable_thunks"
    assert (ex.ptx_size, ex.cubin_size, ex.cudnn_graph_count) == (len(PTX), len(CUBIN), 2)
    assert (ex.thunk_count, ex.constant_count) == (5, 2)
    assert ex.compute_capability == "9.0"
    assert ex.hlo_module == HLO


def test_rocm_compute_capability() -> None:
    rocm = f_bytes(6, f_bytes(2, f_bytes(1, "gfx90a")))
    ex = gpu.decode_gpu_executable(COMPILATION_RESULT + rocm)
    assert ex.compute_capability == "gfx90a"
    assert ex.layout == "gpu_executable_legacy"


@pytest.mark.parametrize("split_payload", [False, True])
@pytest.mark.parametrize("split_executable", [False, True])
def test_pjrt_payload_layouts(split_payload: bool, split_executable: bool) -> None:
    executable = split_gpu_executable() if split_executable else LEGACY
    payload = pjrt_payload(executable, split=split_payload)
    assert gpu.is_riegeli_payload(payload) is split_payload
    entry = gpu.decode_gpu_pjrt_payload(payload)
    assert entry.payload.was_split is split_payload
    assert entry.client_name == gpu.GPU_CLIENT_NAME
    assert entry.executable.was_split is split_executable
    assert entry.executable.module_name == "jit_matmul"
    eao = fields_by_number(entry.payload.executable_and_options)
    assert bytes(eao[1][-1]) == executable


def test_plain_payload_is_returned_unchanged() -> None:
    payload = pjrt_payload(LEGACY, split=False)
    assert gpu.unwrap_pjrt_payload(payload).executable_and_options == payload


def test_split_payload_of_the_wrong_type() -> None:
    data = riegeli_file([manifest(gpu.GPU_EXECUTABLE, ["merge"]), LEGACY])
    with pytest.raises(UnsupportedFormat):
        gpu.unwrap_pjrt_payload(data)
    data = riegeli_file([manifest(gpu.EXECUTABLE_AND_OPTIONS, ["merge"]), b""])
    with pytest.raises(UnsupportedFormat):
        gpu.decode_gpu_executable(data)


def test_cpu_executable_is_refused() -> None:
    cpu = f_bytes(1, WITH_CONFIG) + f_bytes(3, "main.1") + f_varint(5, 2)
    with pytest.raises(UnsupportedFormat, match="CPU"):
        gpu.decode_gpu_executable(cpu)


def test_payload_without_executable() -> None:
    with pytest.raises(CorruptFormat, match="serialized_executable"):
        gpu.decode_gpu_pjrt_payload(f_bytes(3, gpu.GPU_CLIENT_NAME))


def test_size_limit_applies_to_split_executables() -> None:
    with pytest.raises(TooLarge):
        gpu.decode_gpu_executable(split_gpu_executable(), max_bytes=len(CUBIN))


@pytest.mark.parametrize("data", [b"", b"\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f", b"\x07"])
def test_garbage(data: bytes) -> None:
    with pytest.raises(CorruptFormat):
        gpu.decode_gpu_executable(data)


def test_mutations_never_escape() -> None:
    rng = random.Random(21)
    for base in (LEGACY, split_gpu_executable(), pjrt_payload(THUNKS_PLAIN, split=True)):
        for _ in range(300):
            data = bytearray(base)
            for _ in range(rng.randrange(1, 3)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            with contextlib.suppress(FormatError):
                gpu.decode_gpu_pjrt_payload(bytes(data), max_bytes=1 << 20)


def test_extracted_module_renders_as_hlo_text() -> None:
    # A real HloModuleProto (from jax on CPU) placed where GPU entries keep it.
    import jax
    import jax.numpy as jnp
    from jax._src.lib import xla_client  # type: ignore[attr-defined]

    lowered = jax.jit(lambda x: x * 2 + 1).lower(jnp.ones(4))
    hlo = lowered.compiler_ir("hlo")
    assert hlo is not None
    module = hlo.as_serialized_hlo_module_proto()
    executable = f_bytes(1, f_bytes(1, module) + f_bytes(2, CONFIG)) + f_bytes(3, PTX) + CC_H100
    ex = gpu.decode_gpu_executable(executable)
    assert ex.hlo_module == module
    text = xla_client.XlaComputation(ex.hlo_module).as_hlo_text()
    assert text.startswith("HloModule jit__lambda")
    assert ex.module_name == "jit__lambda"
