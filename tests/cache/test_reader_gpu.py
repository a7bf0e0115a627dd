"""GPU entries through the one reader, built from the documented layouts (no GPU here).

The executables are made by the test encoders of test_gpu.py around a *real* HLO module taken
from a CPU entry written by the installed JAX, then wrapped exactly as JAX stores an entry
(4-byte compile time, optional pjrt_ifrt header, zstd). What a real GPU must still confirm is
listed in docs/format-gpu.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cachedoctor import layout
from cachedoctor.cache import decompress, model, reader
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.findings import FindingKind
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.storage.location import Location
from cachedoctor.xla import gpu
from tests.support.gpu_vectors import (
    BUFFERS,
    CC_H100,
    CUBIN,
    DNN,
    PTX,
    THUNKS,
    f_bytes,
    gpu_compile_options,
    gpu_entry_file,
    manifest,
    plain_gpu_entry,
    riegeli_file,
)


def _decode(path: Path) -> EntryInfo:
    """The entry decoded in memory, as a stream and in detail: the three must agree."""
    info = reader.decode_entry(path)
    assert isinstance(info, EntryInfo)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(decompress, "WHOLE_DECODE_MAX", 0)
        assert reader.decode_entry(path) == info
    detail = reader.decode_entry(path, detail=True)
    assert isinstance(detail, model.EntryDetail) and detail.info == info
    return info


@pytest.mark.slow
def test_plain_gpu_entry(tmp_path: Path, real_hlo_with_config: bytes) -> None:
    info = _decode(plain_gpu_entry(tmp_path, real_hlo_with_config))
    assert info.ok, info.problems
    assert info.platform == "gpu" and info.compile_time_s == 7
    assert info.pjrt_client_name == gpu.GPU_CLIENT_NAME
    sections = dict((s.name, s.size) for s in info.sections)
    assert (sections["PTX"], sections["cubin"]) == (len(PTX), len(CUBIN))
    assert info.hlo is not None and info.hlo.name == "jit_g"
    assert info.gpu is not None
    assert (info.gpu.layout, info.gpu.compute_capability) == ("gpu_executable_legacy", "9.0")
    assert (info.gpu.payload_split, info.gpu.executable_split) == (False, False)
    assert (info.gpu.ptx_size, info.gpu.cubin_size, info.gpu.cudnn_graphs) == (
        len(PTX),
        len(CUBIN),
        2,
    )
    assert info.format_label == "pjrt"


@pytest.mark.slow
def test_split_gpu_entry_with_split_executable(tmp_path: Path, real_hlo_with_config: bytes) -> None:
    """jax >= 0.10.1 layout: the payload and the executable are both Riegeli split protos."""
    rest = f_bytes(1, real_hlo_with_config) + f_bytes(2, BUFFERS) + CC_H100 + b"".join(THUNKS)
    executable = riegeli_file(
        [manifest(gpu.GPU_EXECUTABLE, [3, 4, "merge", "merge"]), PTX, CUBIN, b"".join(DNN), rest],
        "snappy",
    )
    tail = f_bytes(2, gpu_compile_options(tmp_path)) + f_bytes(3, gpu.GPU_CLIENT_NAME)
    payload = riegeli_file([manifest(gpu.EXECUTABLE_AND_OPTIONS, [1, "merge"]), executable, tail])
    path = gpu_entry_file(tmp_path, payload, header=True, name="b")
    info = _decode(path)
    assert info.ok, info.problems
    assert info.platform == "gpu" and info.format_label == "ifrt-v3+split"
    assert (info.pjrt_client_name, info.runtime_name) == (gpu.GPU_CLIENT_NAME, "pjrt_ifrt")
    assert info.gpu is not None and info.gpu.executable_split and info.gpu.payload_split
    assert (info.gpu.layout, info.gpu.thunks) == ("gpu_executable_thunks", len(THUNKS))
    assert (info.gpu.compute_capability, info.gpu.ptx_size, info.gpu.cubin_size) == (
        "9.0",
        len(PTX),
        len(CUBIN),
    )
    assert info.gpu.cudnn_graphs == len(DNN)
    assert info.hlo is not None and info.hlo.name == "jit_g"
    assert info.autotune_dir == f"{tmp_path}/xla_gpu_per_fusion_autotune_cache_dir"
    report = scan_directory(Location.parse(tmp_path))
    assert report.summary.platforms == (("gpu", 1),)
    assert not [f for f in report.findings if f.kind is FindingKind.CORRUPT]


def test_damaged_split_payload_is_a_problem(tmp_path: Path) -> None:
    payload = riegeli_file([manifest(gpu.EXECUTABLE_AND_OPTIONS, [1, "merge"]), b"x", b"y"])
    info = _decode(gpu_entry_file(tmp_path, payload[: len(payload) - 9], header=True, name="c"))
    assert not info.ok and "split-proto payload" in info.problems[0].message
    assert info.problems[0].kind == "protobuf"  # damage (scan calls it corrupt), not "unsupported"


@pytest.mark.slow
def test_scan_reports_subcaches(seed_cache: Path, copy_of: Callable[[Path], Path]) -> None:
    from tests.support.gpu_vectors import GEMM, TRITON, file_name, key

    cache = copy_of(seed_cache)
    tune = cache / layout.AUTOTUNE_DIR
    tune.mkdir()
    (tune / file_name(key("fusion.1"))).write_text(TRITON)
    (tune / file_name(key("fusion.2"))).write_text(GEMM)
    (cache / layout.KERNEL_CACHE_FILE).write_bytes(b"\x0a\xff\xff\xff\x0f garbage")
    report = scan_directory(Location.parse(cache))
    assert report.subcaches is not None
    assert len(report.subcaches.autotune.entries) == 2
    (finding,) = [f for f in report.findings if f.kind is FindingKind.SUBCACHE]
    assert finding.entries == (layout.KERNEL_CACHE_FILE,)
    assert "does not parse" in finding.message
    from cachedoctor.render.jsonout import dumps, scan_document

    assert '"autotune"' in dumps(scan_document(report))
