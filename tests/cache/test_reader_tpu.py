"""Real TPU entries (tests/fixtures/tpu-v5e) through the one reader, with JAX as the oracle.

Every entry of these caches was loaded by JAX on the TPU (a hit on the next run), so each must
decode without a problem; JAX's own log names the keys it wrote. The damaged copies were each
loaded by JAX in turn: an entry is corrupt to cachedoctor only where JAX failed on it too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import zstandard

from cachedoctor.cache import decompress, model, reader
from cachedoctor.cache.model import EntryInfo
from cachedoctor.core.scan.report import DAMAGE, real_problems
from tests.support import tpu

CACHES = ("shared/seed", "shared/hook", "shared/mix", "capture/moved", "capture/moved-stable")


def _decode(path: Path) -> EntryInfo:
    """The entry decoded in memory, as a stream and in detail: the three must agree."""
    info = reader.decode_entry(path)
    assert isinstance(info, EntryInfo)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(decompress, "WHOLE_DECODE_MAX", 0)
        streamed = reader.decode_entry(path)
    assert streamed == info
    detail = reader.decode_entry(path, detail=True)
    assert isinstance(detail, model.EntryDetail) and detail.info == info
    return info


def _entries(name: str) -> list[Path]:
    return sorted(tpu.cache(name).glob("*-cache"))


def _jax_written(name: str) -> set[str]:
    """The keys JAX wrote into a fixture cache, from JAX's own log of each run."""
    archive, folder = name.split("/")
    if archive == "shared":
        logs = tpu.unpacked() / "shared" / "logs"
        prefix = {"seed": "seed-plain", "hook": "seed-hook", "mix": "mix-"}[folder]
        return {k for log in logs.glob(f"{prefix}*.log") for k in tpu.written_keys(log)}
    runs = tpu.capture_results()[folder]["runs"].values()
    return {key for run in runs for kind, _, key in run["outcomes"] if kind == "miss"}


@pytest.mark.parametrize("name", CACHES)
def test_every_entry_jax_wrote_and_loaded_decodes(name: str) -> None:
    paths = _entries(name)
    keys = {p.name[: -len("-cache")] for p in paths}
    assert _jax_written(name) == keys  # the oracle: JAX's log names exactly these files
    for path in paths:
        info = _decode(path)
        assert info.ok, (path.name, info.problems)
        assert info.platform == "tpu" and info.format_label == "ifrt-v3"
        assert info.tpu is not None and info.tpu.chip == "TPU v5 lite"
        assert (info.tpu.chip_version, info.tpu.chip_variant) == (4, "lite")
        assert len(info.tpu.messages) == 6 and info.tpu.program_size > 0
        assert info.tpu.environment == "type.googleapis.com/xla.jellyfish.TpuCompilationEnvironment"
        assert info.hlo is not None and info.hlo.instructions > 0
        assert info.hlo.name == info.module  # the module name the key starts with
        assert info.compile_time_s is not None and 0 <= info.compile_time_s < 30  # whole seconds
        assert info.program_digest is not None


def test_compile_options_hold_the_autotune_dir_as_spelled() -> None:
    """jax 0.10 fills the autotune dir from the cache dir as the program spelled it, and hashes
    it into the key: the entries of /tmp/jaxcache/mix say that folder, wherever they lie now."""
    for name, spelled in (
        ("shared/mix", "/tmp/jaxcache/mix"),
        ("capture/moved", "/tmp/tpucap/caches/moved"),
    ):
        for path in _entries(name):
            info = reader.decode_entry(path)
            assert isinstance(info, EntryInfo)
            assert info.autotune_dir == f"{spelled}/xla_gpu_per_fusion_autotune_cache_dir"
            assert (info.num_replicas, info.num_partitions) == (1, 1)


def test_pallas_kernels_are_found_in_the_module() -> None:
    """jit_add and jit_matmul hold one tpu_custom_call each (the two pallas_calls of the
    program); the plain modules none. The body differs between the folders the program ran
    from (its debug locations), and the changed kernel's body differs too."""
    kernels: dict[str, set[str]] = {}
    for path in _entries("capture/moved"):
        info = reader.decode_entry(path)
        assert isinstance(info, EntryInfo) and info.tpu is not None
        for k in info.tpu.kernels:
            assert k.body_size > 500
            kernels.setdefault(f"{info.module} {k.instruction}", set()).add(k.body_sha256)
        if info.module not in ("jit_add", "jit_matmul"):
            assert info.tpu.kernels == ()
    # a, b and a-comment gave 3 bodies of each kernel; a-body a 4th of the add
    assert {k: len(v) for k, v in kernels.items()} == {
        "jit_add main.1/add.1": 4,
        "jit_matmul main.1/matmul.1": 3,
    }


def test_detail_keeps_the_original_module() -> None:
    (path,) = tpu.cache("capture/moved").glob("jit_step-*-cache")
    detail = reader.decode_entry(path, detail=True)
    assert isinstance(detail, model.EntryDetail)
    assert detail.original_module is not None and detail.hlo_module is not None
    assert detail.original_module != detail.hlo_module
    assert b"jit_step" in detail.original_module


def _corrupt(info: EntryInfo) -> bool:
    real = real_problems(info)
    return bool(real) and real[0].kind in DAMAGE


# The damage done on grounds that hold for any entry: each is damage JAX must fail on.
NAMED = ("cut-", "zstd-rejects-", "header-length", "-first-tag", "trailing-bytes")
IN_DEBUG_TEXT = (
    "debug-source-path",
    "debug-autotune-dir",
    "mosaic-debug-path",
    "module-name-not-utf8",
)


def test_corrupt_only_where_jax_failed_too() -> None:
    """Each damaged copy, against what JAX did with it on the TPU: never corrupt where JAX hit;
    corrupt wherever JAX failed on damage of a named kind (cut short, a byte zstd rejects, a
    message that does not parse, bytes after the last message); a byte in debug text loads and
    is not corrupt. Random bytes deep inside libtpu's own messages are caught where a message
    JAX parses fails to parse (docs/format-tpu.md says how many)."""
    variants = tpu.damage_variants()
    assert len(variants) > 40
    missed = []
    for v in variants:
        info = _decode(v["path"])
        corrupt, failed = _corrupt(info), v["jax"] == "error"
        assert v["jax"] in ("hit", "error"), v  # the oracle ran on every copy
        if corrupt:
            assert failed, (v["name"], info.problems, "JAX loaded this entry")
        if any(mark in v["name"] for mark in NAMED):
            assert failed and corrupt, (v["name"], v["errors"], info.problems)
        if any(v["name"].endswith(mark) for mark in IN_DEBUG_TEXT):
            assert v["jax"] == "hit" and not corrupt and info.ok, (v["name"], info.problems)
        if failed and not corrupt:
            missed.append(v["name"])
    # what JAX refused and cachedoctor kept: only damage inside nested messages whose schema is
    # libtpu's own (or HLO fields deeper than the reader parses), never a named kind
    assert all(name.split(".")[1].startswith(("random-", "zstd-silent-")) for name in missed)
    assert len(missed) <= 12, missed


def _made_up_payload(real: Path, tail: bytes) -> bytes:
    """``real``'s compile time and pjrt_ifrt header, then ``tail``: a layout nobody wrote."""
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(real.read_bytes())
    length, pos, shift = 0, 4, 0
    while True:
        byte = raw[pos]
        length |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            break
    return zstandard.ZstdCompressor().compress(raw[: pos + length] + tail)


@pytest.mark.parametrize(
    "tail",
    [
        b"\x7fFUTURE\x00" + bytes(range(256)) * 4,  # no varint-delimited message at all
        b"\x05hello\x03abc",  # two length-delimited parts, not a TPU program
        b"\xc8\x01" + b"\x00" * 50,  # a length that runs past the end
    ],
)
def test_a_layout_nobody_knows_is_unknown_not_corrupt(tmp_path: Path, tail: bytes) -> None:
    (real,) = tpu.cache("shared/seed").glob("jit_f-*-cache")
    path = tmp_path / real.name
    path.write_bytes(_made_up_payload(real, tail))
    info = _decode(path)
    assert [p.kind for p in info.problems] == ["unknown-layout"]
    assert "no verdict" in info.problems[0].message
    assert not _corrupt(info) and info.platform == "unknown"


def test_the_kernel_tier_reads_the_same_from_kept_bodies_and_from_the_entry() -> None:
    """A candidate's kernels read from the bodies the decode kept, or from the entry decoded
    again (a worker decoded it): the same names, stripped digests and locations."""
    from cachedoctor.cache import tiers
    from cachedoctor.xla import mosaic

    entries = [reader.decode_entry(p) for p in _entries("capture/moved")]
    infos = [e for e in entries if isinstance(e, EntryInfo)]
    positions = tiers.kernel_candidates(infos)
    assert len(positions) == 7  # the 4 jit_add and 3 jit_matmul entries
    for n in positions:
        kept = tiers.with_known_kernels_read(infos[n])
        detail = reader.decode_entry(infos[n].path, detail=True)
        assert isinstance(detail, model.EntryDetail)
        again = tiers.with_kernels_read(infos[n], detail.hlo_module)
        assert kept is not None and kept == again
        (kernel,) = kept.tpu.kernels  # type: ignore[union-attr]
        assert kernel.name in ("add_kernel", "mm_kernel") and kernel.stripped_sha256
        assert kernel.locations and kernel.locations[0].startswith("/tmp/tpucap/progs/")
    mosaic._BODIES.clear()  # as in a parent whose workers decoded the entries
    assert tiers.with_known_kernels_read(infos[positions[0]]) is None
