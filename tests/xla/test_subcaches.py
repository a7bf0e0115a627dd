"""XLA's GPU sub-caches: the per-fusion autotune directory and the kernel cache file.

The autotune fixtures are written the way XLA writes them: ``AutotunerCache`` stores
``TextFormat::PrintToString(AutotuneResult)`` (xla/service/gpu/autotuning/autotuner_cache.cc),
so a file is a bare AutotuneResult in multi-line text format, fields in number order, two-space
indents. Their shape follows the ``result { ... }`` block of ``kResultText`` in
openxla/xla xla/service/gpu/autotuning/autotuner_util_test.cc and autotuner_cache_test.cc
(run_time { nanos: 31744 } and a triton block); the whole-AutotuneResults form below is that
test vector's layout (version / results { device hlo result }).
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import pytest

from cachedoctor import layout
from cachedoctor.formats import textproto
from cachedoctor.formats.errors import FormatError
from cachedoctor.xla import subcaches
from tests.support.gpu_vectors import GEMM, MODEL, TRITON, f_bytes, f_varint, file_name, key

CUDNN = """scratch_bytes: 1048576
run_time {
  seconds: 1
  nanos: 5
}
algorithm {
  algo_id: 28
  math_type: TENSOR_OP_MATH
  tuning_knobs {
    key: 2
    value: 1
  }
  is_cudnn_frontend: true
  workspace_size {
    value: 1048576
  }
}
"""


FAILURE = """failure {
  kind: DISQUALIFIED
  msg: "Slower than the best \\"cuBLAS\\" config"
}
triton {
  block_m: 128
}
"""


CUSTOM = """run_time {
  nanos: 1000
}
custom_kernel_fusion {
  kernel_index: 1
}
"""


OTHER = """run_time {
  nanos: 2000
}
other {
  name: "fission"
  config {
    [type.googleapis.com/xla.gpu.BlockLevelFusionConfig] {
      output_tiles {
        sizes: 1
        sizes: 64
      }
      num_warps: 2
    }
  }
}
"""


WHOLE_RESULTS = (
    'version: 3\nresults {\n  device: "' + MODEL + '"\n'
    '  hlo: "{\\n  tmp_0 = f16[1,16,17,3]{3,2,1,0} parameter(0)\\n}"\n'
    "  result {\n    run_time {\n      nanos: 31744\n    }\n"
    "    triton {\n      block_m: 32\n    }\n  }\n}\n"
)


def make_dir(root: Path, files: dict[str, str | bytes]) -> Path:
    d = root / layout.AUTOTUNE_DIR
    d.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
    return d


def test_real_hash_names_are_accepted() -> None:
    rng = random.Random(4)
    for _ in range(300):
        name = file_name(key(rng.randbytes(20).hex()))
        assert len(name) == 43 + len(".textproto")
        assert subcaches.is_autotune_file_name(name), name


@pytest.mark.parametrize(
    "name",
    [
        "notahash.textproto",
        file_name("x")[:-10] + ".txt",
        file_name("x").replace(".textproto", "=.textproto"),
        "+" + file_name("x")[1:],  # standard, not url-safe, base64
        file_name("x")[:42] + "B.textproto",  # 43rd character carries non-zero padding bits
        "tmp",
    ],
)
def test_bad_names(name: str) -> None:
    assert not subcaches.is_autotune_file_name(name)


def test_triton_result() -> None:
    info = subcaches.parse_autotune_text(TRITON)
    assert (info.kind, info.run_time_ns, info.scratch_bytes) == ("triton", 31744, None)
    assert info.detail is not None and "block_m=32" in info.detail and "num_warps=4" in info.detail
    assert (info.model, info.hlo, info.result_count) == (None, None, 1)


def test_gemm_result() -> None:
    info = subcaches.parse_autotune_text(GEMM)
    assert (info.kind, info.run_time_ns, info.scratch_bytes) == ("gemm", 8192, 4194304)
    assert info.detail == "algorithm=-1"


def test_cudnn_result_counts_as_conv() -> None:
    info = subcaches.parse_autotune_text(CUDNN)
    assert info.kind == "conv"
    assert info.run_time_ns == 1_000_000_005
    assert info.detail is not None and "math_type=TENSOR_OP_MATH" in info.detail


def test_failure_result() -> None:
    info = subcaches.parse_autotune_text(FAILURE)
    assert info.kind == "failure"
    assert info.failure == 'DISQUALIFIED: Slower than the best "cuBLAS" config'


def test_custom_and_other_results() -> None:
    assert subcaches.parse_autotune_text(CUSTOM).kind == "custom"
    other = subcaches.parse_autotune_text(OTHER)
    assert other.kind == "other"
    assert other.detail is not None and "BlockLevelFusionConfig" in other.detail


def test_whole_autotune_results_gives_model_and_hlo() -> None:
    info = subcaches.parse_autotune_text(WHOLE_RESULTS)
    assert info.model == MODEL
    assert info.hlo == "{\n  tmp_0 = f16[1,16,17,3]{3,2,1,0} parameter(0)\n}"
    assert (info.kind, info.run_time_ns, info.result_count) == ("triton", 31744, 1)
    assert info.version is None  # the entry carries no key version; 3 is the file format's


def test_empty_result_is_kind_none() -> None:
    assert subcaches.parse_autotune_text("scratch_bytes: 1\n").kind == "none"


@pytest.mark.parametrize(
    "text",
    [
        "run_time { nanos: ",
        "run_time { nanos: 5 ",
        "triton { block_m: 32 }}",
        '"just a string"',
        "a: 'unterminated",
        'a: "bad \\q escape"',
        "a: 08",
        'a: "\\u12"',
        "a { " * 100 + "}" * 100,
        "\x00\x01\x02",
        "[broken.ext { }",
        "a: [1, 2",
        ": 5",
    ],
)
def test_garbage_text_raises_a_format_error(text: str) -> None:
    with pytest.raises(FormatError):
        subcaches.parse_autotune_text(text)


def test_text_format_details() -> None:
    msg = textproto.parse(
        '# comment\na: 0x1F b: -2.5e1 c: "x" \'y\' d: [1, 2] e < f: inf > g: "\\101\\x42\\n"\n'
    )
    assert msg["a"] == [31]
    assert msg["b"] == [-25.0]
    assert msg["c"] == [b"xy"]
    assert msg["d"] == [1, 2]
    assert msg["e"] == [{"f": ["inf"]}]
    assert msg["g"] == [b"AB\n"]


def test_random_text_never_escapes() -> None:
    rng = random.Random(6)
    alphabet = "ab_1 {}<>[]:;,\"'\\#\n-.x/"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        with contextlib.suppress(FormatError):
            textproto.parse(text)


def test_scan_autotune_dir(tmp_path: Path) -> None:
    good = {file_name(key(f"fusion{i}")): text for i, text in enumerate([TRITON, GEMM, CUDNN])}
    broken = file_name(key("broken"))
    empty = file_name(key("empty"))
    tmp_name = f"tmp/tmp_per_fusion_cache_{file_name(key('t'))[:43]}_1732871234000000000.textproto"
    d = make_dir(
        tmp_path,
        {
            **good,
            broken: "run_time { nanos: ",
            empty: "",
            "notahash.textproto": FAILURE,
            tmp_name: TRITON[:10],
            "README": "stray",
        },
    )
    report = subcaches.scan_autotune_dir(d)
    assert report.exists
    assert len(report.entries) == 6
    assert dict(report.kind_counts) == {"triton": 1, "gemm": 1, "conv": 1, "failure": 1}
    by_name = {e.name: e for e in report.entries}
    assert by_name[broken].result is None and "does not parse" in by_name[broken].problems[0]
    assert by_name[empty].problems == ("empty file",)
    assert not by_name["notahash.textproto"].name_ok
    assert all(by_name[n].name_ok and not by_name[n].problems for n in good)
    assert report.tmp_leftovers == (tmp_name.split("/")[1],)
    assert report.other_files == ("README",)
    assert any("tmp/" in p for p in report.problems)
    assert report.total_bytes == sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def test_several_models_are_reported(tmp_path: Path) -> None:
    other = WHOLE_RESULTS.replace("CUDA: 9.0", "CUDA: 8.0")
    d = make_dir(tmp_path, {file_name("a"): WHOLE_RESULTS, file_name("b"): other})
    report = subcaches.scan_autotune_dir(d)
    assert len(report.models) == 2
    assert any("2 different GPU models" in p for p in report.problems)


def test_missing_dir(tmp_path: Path) -> None:
    report = subcaches.scan_autotune_dir(tmp_path / "nope")
    assert not report.exists and report.entries == () and report.problems == ()


def test_oversized_and_binary_files(tmp_path: Path) -> None:
    big, binary = file_name("big"), file_name("bin")
    d = make_dir(tmp_path, {big: "a: 1\n" * 100, binary: b"\xff\xfe\x00"})
    report = subcaches.scan_autotune_dir(d, max_file_bytes=100)
    by_name = {e.name: e for e in report.entries}
    assert "over the 100-byte limit" in by_name[big].problems[0]
    assert "not UTF-8" in by_name[binary].problems[0]


def test_unreadable_file(tmp_path: Path) -> None:
    d = make_dir(tmp_path, {})
    (d / file_name("dir")).mkdir()  # a directory where a file should be: open() fails
    entry = subcaches.read_autotune_file(d / file_name("dir"))
    assert entry.result is None and "cannot read" in entry.problems[0]


def kernel_entry(name: str, binary: bytes, *, dim3: bool = False) -> bytes:
    if dim3:
        launch = f_bytes(1, f_varint(1, 4) + f_varint(2, 2)) + f_bytes(2, f_varint(1, 128))
    else:
        launch = f_varint(1, 132) + f_varint(2, 256)
    entry = (
        f_bytes(1, f"fp-{name}")
        + f_bytes(2, launch)
        + f_bytes(3, f_varint(1, 2) + f_varint(2, 1) + f_varint(3, 1))
        + f_varint(4, 49152)
        + f_bytes(5, binary)
    )
    return f_bytes(1, f_bytes(1, name) + f_bytes(2, entry))


def test_kernel_cache(tmp_path: Path) -> None:
    cubin = b"\x7fELF" + bytes(3 << 20)
    data = kernel_entry("loop_add_fusion", cubin) + kernel_entry("triton_gemm", b"x" * 10)
    data += f_varint(2, 3)
    path = tmp_path / layout.KERNEL_CACHE_FILE
    path.write_bytes(data)
    report = subcaches.read_kernel_cache(path)
    assert report.parsed and report.problems == ()
    assert report.compatibility_version == 3
    assert [e.name for e in report.entries] == ["loop_add_fusion", "triton_gemm"]
    first = report.entries[0]
    assert first.fingerprint == "fp-loop_add_fusion"
    assert (first.num_blocks, first.threads_per_block) == ((132, 1, 1), (256, 1, 1))
    assert (first.cluster_dim, first.shmem_bytes) == ((2, 1, 1), 49152)
    assert first.binary_size == len(cubin)
    assert report.total_binary_bytes == len(cubin) + 10
    assert report.size == len(data)


def test_kernel_cache_with_3d_launch_dimensions() -> None:
    report = subcaches.parse_kernel_cache(kernel_entry("k", b"b", dim3=True))
    e = report.entries[0]
    assert (e.num_blocks, e.threads_per_block) == ((4, 2, 0), (128, 0, 0))
    assert report.compatibility_version is None  # written before 2026-04


def test_truncated_kernel_cache_keeps_earlier_entries() -> None:
    data = kernel_entry("a", b"1" * 100) + kernel_entry("b", b"2" * 100)
    report = subcaches.parse_kernel_cache(data[:-20])
    assert not report.parsed
    assert [e.name for e in report.entries] == ["a"]
    assert "does not parse" in report.problems[0]


@pytest.mark.parametrize(
    "data", [b"\xff" * 20, b"\x0a\xff\xff\xff\xff\x7f", b"\x0f", b"\x0a\x05\x0a"]
)
def test_garbage_kernel_cache(data: bytes) -> None:
    report = subcaches.parse_kernel_cache(data)
    assert not report.parsed and report.problems


def test_empty_and_missing_kernel_cache(tmp_path: Path) -> None:
    assert subcaches.parse_kernel_cache(b"").problems == ("empty file",)
    missing = subcaches.read_kernel_cache(tmp_path / "none")
    assert not missing.parsed and "cannot read" in missing.problems[0]


def test_kernel_cache_mutations_never_escape() -> None:
    rng = random.Random(7)
    base = kernel_entry("a", b"1" * 50) + kernel_entry("b", b"2" * 50) + f_varint(2, 3)
    for _ in range(1000):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        subcaches.parse_kernel_cache(bytes(data))


def test_scan_subcaches(tmp_path: Path) -> None:
    assert subcaches.scan_subcaches(tmp_path).paths == ()
    make_dir(tmp_path, {file_name("a"): TRITON})
    (tmp_path / layout.KERNEL_CACHE_FILE).write_bytes(kernel_entry("k", b"cubin"))
    report = subcaches.scan_subcaches(tmp_path)
    assert len(report.autotune.entries) == 1
    assert report.kernel_cache is not None and report.kernel_cache.total_binary_bytes == 5
    assert report.paths == (
        tmp_path / layout.AUTOTUNE_DIR,
        tmp_path / layout.KERNEL_CACHE_FILE,
    )
