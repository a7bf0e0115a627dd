"""Entries decompressed in one call (``reader._decode_in_memory``) decode exactly as the stream
decoder decodes them, and copies of one executable are walked once."""

from __future__ import annotations

import hashlib
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import pytest
import zstandard

from cachedoctor.cache import _payload, decompress, listdir, reader
from cachedoctor.cache.model import EntryDetail, EntryInfo
from cachedoctor.core.check.runner import program_env, run_command
from tests.support.sessioncache import SharedBuilds


def _decode(path: Path, key: str | None) -> EntryInfo:
    info = reader.decode_entry(path, key=key)
    assert isinstance(info, EntryInfo)
    return info


def _streamed(path: Path, key: str | None, monkeypatch: pytest.MonkeyPatch) -> EntryInfo:
    with monkeypatch.context() as m:
        m.setattr(decompress, "WHOLE_DECODE_MAX", 0)
        return _decode(path, key)


def _variants(seed_cache: Path, tmp_path: Path) -> list[Path]:
    """Real entries, and the same entries damaged: cut short, a flipped byte, a malformed HLO
    module (recompressed: it decompresses cleanly), trailing bytes, a zstd frame without a
    declared size, zlib, a forged declared size."""
    out = []
    for item in listdir.list_cache(seed_cache).entries:
        data = (seed_cache / item.name).read_bytes()
        raw = zstandard.ZstdDecompressor().decompress(data)
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF
        forged = bytearray(data)
        forged[5] ^= 0x01  # the low byte of the frame content size
        detail = reader.decode_entry(seed_cache / item.name, detail=True)
        assert isinstance(detail, EntryDetail) and detail.hlo_module
        damaged_payload = bytearray(raw)  # the HLO module's first tag made wire type 7
        damaged_payload[raw.index(detail.hlo_module)] = 0x0F
        kinds = {
            "real": data,
            "payload": zstandard.ZstdCompressor().compress(bytes(damaged_payload)),
            "cut": data[: len(data) * 2 // 3],
            "flipped": bytes(flipped),
            "trailing": data + b"\0garbage",
            "unsized": zstandard.ZstdCompressor(write_content_size=False).compress(raw),
            "zlib": zlib.compress(raw),
            "forged": bytes(forged),
        }
        for kind, content in kinds.items():
            folder = tmp_path / kind
            folder.mkdir(exist_ok=True)
            (folder / item.name).write_bytes(content)
            out.append(folder / item.name)
    return out


@pytest.mark.slow
def test_whole_decode_equals_the_stream_decoder(
    seed_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _variants(seed_cache, tmp_path)
    whole_used = 0
    for path in paths:
        key = path.name[: -len("-cache")]
        reader._PAYLOAD_MEMO.clear()
        assert _decode(path, key) == _streamed(path, key, monkeypatch), path
        with path.open("rb") as fh:
            whole_used += decompress.decompress_whole(fh, 1 << 40) is not None
    assert whole_used >= len(paths) // 7  # the real entries, at least, took the fast path


@pytest.mark.slow
def test_copies_are_walked_once(
    seed_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies of one executable keep their own key, path, time and mtime, and the payload is
    walked once. The copies: the seed's three runs (one executable on jax >= 0.10; older
    releases write some differing bytes), and a rerun of the first with another compile time
    (the 4-byte prefix), as JAX writes it when the same program compiles again."""
    items = [i for i in listdir.list_cache(seed_cache).entries if i.name.startswith("jit_f-")]
    assert len(items) == 3
    paths = [(seed_cache / i.name, i.key) for i in items]
    raw = zstandard.ZstdDecompressor().decompress(paths[0][0].read_bytes())
    rerun_key = "jit_f-" + "0" * 64
    rerun = tmp_path / f"{rerun_key}-cache"
    rerun.write_bytes(zstandard.ZstdCompressor().compress((12345).to_bytes(4, "big") + raw[4:]))
    paths.append((rerun, rerun_key))
    expected = [_streamed(path, key, monkeypatch) for path, key in paths]
    distinct = len({e.executable_digest for e in expected})
    assert distinct < len(paths) and expected[-1].compile_time_s == 12345
    walks = 0
    real_walk = _payload._walk_payload_buffer

    def counting_walk(*args: object) -> None:
        nonlocal walks
        walks += 1
        real_walk(*args)  # type: ignore[arg-type]

    reader._PAYLOAD_MEMO.clear()
    monkeypatch.setattr(reader, "_walk_payload_buffer", counting_walk)
    assert [_decode(path, key) for path, key in paths] == expected
    assert walks == distinct


@pytest.mark.slow
def test_equal_files_are_decompressed_once(
    seed_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files equal byte for byte under other keys (unstable keys, same compile time) are served
    from the first one's decode by their digest: not decompressed again, each with its own key,
    path, size and mtime, every tier as the stream decoder gives it. A first-tier decode is not
    served (its second copy gets every tier); a copy with a flipped byte is decoded alone."""
    from cachedoctor.cache import travel

    item = next(i for i in listdir.list_cache(seed_cache).entries if i.name.startswith("jit_f-"))
    data = (seed_cache / item.name).read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    paths = []
    for n, content in enumerate([data] * 4 + [bytes(flipped)] + [data]):
        key = f"jit_f-{n:064x}"
        path = tmp_path / f"{key}-cache"
        path.write_bytes(content)
        paths.append((path, key))
    # the flipped copy as the reader decodes it alone (the stream decoder may tell its damage
    # otherwise: test_whole_decode_equals_the_stream_decoder)
    expected = [
        _decode(p, k) if n == 4 else _streamed(p, k, monkeypatch) for n, (p, k) in enumerate(paths)
    ]
    reader.clear_memos()  # the flipped copy's first tier, as if no other file were decoded
    alone = reader.decode_entry(paths[4][0], key=paths[4][1], defer_hlo=True)
    decompressions = 0
    real_whole = decompress.decompress_whole

    def counting_whole(*args: object) -> object:
        nonlocal decompressions
        decompressions += 1
        return real_whole(*args)  # type: ignore[arg-type]

    reader.clear_memos()
    monkeypatch.setattr(reader, "decompress_whole", counting_whole)
    first_tier = [travel.decode_digested(str(p), k, 1 << 40, True)[0] for p, k in paths]
    # the first copy's first tier, its second copy with every tier, the flipped one alone
    assert decompressions == 3
    assert first_tier[0].hlo_deferred and not any(e.hlo_deferred for e in first_tier[1:4])
    assert [*first_tier[1:4], first_tier[5]] == [*expected[1:4], expected[5]]
    # the flipped copy: decoded alone, with its first tier (readable or not: where the flip
    # lands depends on the JAX release that wrote the entry)
    assert first_tier[4] == alone and first_tier[4].key == paths[4][1]
    reader.clear_memos()
    decompressions = 0
    full = [travel.decode_digested(str(p), k, 1 << 40)[0] for p, k in paths]
    assert full == expected and decompressions == 2
    # a scan with a smaller cap than the decode it would be served from decodes the file
    cap = (expected[0].decompressed_size or 0) - 1
    capped = travel.decode_digested(str(paths[3][0]), paths[3][1], cap)[0]
    assert capped.problems and capped == reader.decode_entry(
        paths[3][0], key=paths[3][1], max_decompressed=cap
    )


@pytest.mark.slow
def test_small_sized_frames_take_one_call_through_one_context_per_thread(
    seed_cache: Path, tmp_path: Path
) -> None:
    """A zstd frame that declares a size under 1 MiB is decompressed in one call, whatever its
    ratio, by this thread's one context: damaged frames between real ones (cut short, bytes
    after the frame) are refused and leave nothing behind; each real entry comes out as
    zstandard's own decoder gives it. Another thread has a context of its own."""
    real = [(seed_cache / i.name).read_bytes() for i in listdir.list_cache(seed_cache).entries]
    assert all(zstandard.get_frame_parameters(d).content_size <= 1 << 20 for d in real)
    path = tmp_path / "entry"
    results = []
    for data in real:
        for content in (data[: len(data) // 2], data, data + b"\0garbage", data):
            path.write_bytes(content)
            with path.open("rb") as fh:
                results.append(decompress._zstd_sized_whole(fh, 1 << 30))
    expected = [zstandard.ZstdDecompressor().decompress(d) for d in real]
    assert results[1::4] == expected and results[3::4] == expected
    assert results[0::4] == results[2::4] == [None] * len(real)
    mine = decompress._one_shot_zstd()
    assert decompress._one_shot_zstd() is mine
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(decompress._one_shot_zstd).result() is not mine


LARGE = """
import numpy as np
import jax, jax.numpy as jnp
weights = (np.arange(600_000) % 7).astype(np.float32)  # 2.4 MB, compressible as HLO is
@jax.jit
def project(x):
    return jnp.tanh(x * weights).sum()
print(float(project(jnp.float32(0.5))))
"""


@pytest.fixture(scope="module")
def large_cache(shared_builds: SharedBuilds) -> Path:
    """A real entry over 1 MiB decompressed, compressed over 4 x (2.4 MB of weights)."""

    def make(root: Path) -> None:
        (root / "large.py").write_text(LARGE)
        cache = root / "cache"
        cache.mkdir()
        run = run_command([sys.executable, str(root / "large.py")], program_env(str(cache)))
        assert run.returncode == 0, run.stderr[-3000:]

    root, _ = shared_builds("whole-decode-large", make, LARGE)
    return root / "cache"


@pytest.mark.slow
def test_large_entries_decompress_in_one_call_and_decode_as_streamed(
    large_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over 1 MiB and compressed 4 x or more, a sized zstd frame is decompressed in one call:
    the entry decodes as the stream decoder decodes it, damaged or not, and the one-call path
    refuses (the stream decoder then names the problem) a cut frame and bytes after it."""
    item = max(listdir.list_cache(large_cache).entries, key=lambda i: i.size)
    data = (large_cache / item.name).read_bytes()
    size = zstandard.get_frame_parameters(data).content_size
    assert size > 1 << 20 and size >= 4 * len(data)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    variants = {
        "real": data,
        "cut": data[: len(data) - 100],
        "flipped": bytes(flipped),
        "trailing": data + b"\0garbage",
        "two frames": data + zstandard.ZstdCompressor().compress(b"more"),
    }
    one_call = []
    real_sized_whole = decompress._zstd_sized_whole

    def counting(fh: BinaryIO, limit: int) -> bytes | None:
        whole = real_sized_whole(fh, limit)
        one_call.append(whole is not None)
        return whole

    monkeypatch.setattr(decompress, "_zstd_sized_whole", counting)
    for kind, content in variants.items():
        path = tmp_path / kind / item.name
        path.parent.mkdir()
        path.write_bytes(content)
        reader._PAYLOAD_MEMO.clear()
        one_call.clear()
        assert _decode(path, item.key) == _streamed(path, item.key, monkeypatch), kind
        if kind != "flipped":  # may decompress all the same (no checksum): not asserted
            assert one_call[:1] == [kind == "real"], kind
    info = _decode(tmp_path / "real" / item.name, item.key)
    raw = zstandard.ZstdDecompressor().decompress(data)
    assert info.ok and info.decompressed_size == len(raw)
    assert info.executable_digest == hashlib.sha256(raw[4:]).hexdigest()


def test_a_small_declared_size_in_front_of_a_huge_file_is_not_read_whole(tmp_path: Path) -> None:
    """A damaged or forged entry: a zstd frame declaring 100 bytes, then 512 MiB (sparse). The
    one-call path must not read the file whole to find that out; the stream decoder names it."""
    import tracemalloc

    path = tmp_path / f"jit_forged-{'f' * 64}-cache"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"x" * 100))
    with open(path, "r+b") as fh:
        fh.truncate(512 << 20)
    tracemalloc.start()
    try:
        info = reader.decode_entry(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    assert isinstance(info, EntryInfo) and info.problems and not info.ok
