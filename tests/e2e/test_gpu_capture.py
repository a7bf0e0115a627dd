"""tools/gpu_capture.py is run only on a lent GPU machine, where a broken import costs the whole
device session: its decoding step (2) runs here on a cache with a CPU entry, a GPU-shaped entry
and an autotune file, and its --help runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cachedoctor import layout
from cachedoctor.xla import gpu
from tests.support.caches import REPO
from tests.support.gpu_vectors import (
    BUFFERS,
    CC_H100,
    CUBIN,
    DNN,
    PTX,
    THUNKS,
    TRITON,
    f_bytes,
    file_name,
    gpu_compile_options,
    gpu_entry_file,
    key,
    manifest,
    riegeli_file,
)
from tests.support.scripts import load_script

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

SCRIPT = REPO / "tools" / "gpu_capture.py"


def load_capture() -> ModuleType:
    return load_script(SCRIPT)


def test_help_runs() -> None:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "--out" in res.stdout


def test_decode_step_on_a_mixed_cache(
    tmp_path: Path,
    seed_cache: Path,
    real_hlo_with_config: bytes,
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cpu_entry = next(seed_cache.glob("jit_g-*-cache"))
    shutil.copy(cpu_entry, cache)
    rest = f_bytes(1, real_hlo_with_config) + f_bytes(2, BUFFERS) + CC_H100 + b"".join(THUNKS)
    executable = riegeli_file(
        [manifest(gpu.GPU_EXECUTABLE, [3, 4, "merge", "merge"]), PTX, CUBIN, b"".join(DNN), rest],
        "snappy",
    )
    tail = f_bytes(2, gpu_compile_options(cache)) + f_bytes(3, gpu.GPU_CLIENT_NAME)
    payload = riegeli_file([manifest(gpu.EXECUTABLE_AND_OPTIONS, [1, "merge"]), executable, tail])
    gpu_entry = gpu_entry_file(cache, payload, header=True, name="b")
    (cache / layout.AUTOTUNE_DIR).mkdir()
    (cache / layout.AUTOTUNE_DIR / file_name(key("fusion.1"))).write_text(TRITON)

    decoded = load_capture().decode_all(cache)
    json.dumps(decoded)  # what the script writes to decode.json
    entries = {e["file"]: e for e in decoded["entries"]}
    on_gpu = entries[gpu_entry.name]
    assert "error" not in on_gpu, on_gpu["error"]
    assert on_gpu["pjrt_is_riegeli"] and on_gpu["client_name"] == gpu.GPU_CLIENT_NAME
    assert {c["chunk_type"] for c in on_gpu["executable_chunks"]} == {"r"}
    assert on_gpu["executable"]["layout"] == "gpu_executable_thunks"
    assert on_gpu["executable"]["compute_capability"] == "9.0"
    assert on_gpu["hlo_text_head"][0].startswith("HloModule jit_g")
    assert "CPU CompilationResultProto" in entries[cpu_entry.name]["error"]
    assert [e["result"]["kind"] for e in decoded["autotune"]["entries"]] == ["triton"]
    assert decoded["kernel_cache"] is None
