"""Key manifests: round trip, offline key recomputation, atomic concurrent writes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from cachedoctor import layout
from cachedoctor.stablekeys import keys, manifest, splithash
from cachedoctor.storage.location import Location


def _result(module: str = "jit_f", compile_options: bytes = b"opts") -> keys.KeyResult:
    import hashlib

    comps = {
        "computation": hashlib.sha256(b"module").hexdigest(),
        "compile_options": hashlib.sha256(compile_options).hexdigest(),
    }
    digest = splithash.combine(list(comps.items()))
    return keys.KeyResult(
        key=f"{module}-{digest}",
        module_name=module,
        components=comps,
        component_pieces={"compile_options": [compile_options]},
        jax_equivalent_key=f"{module}-" + "0" * 64,
        volatile=[keys.VolatileField("custom_call[0].backend_config", "1234", "cachedoctor-cp")],
        canonical_ir="module @jit_f {}",
    )


def test_round_trip_and_recompute(tmp_path: Path) -> None:
    r = _result()
    m = manifest.from_key_result(r, mode="stable", stored_under=r.key, jax_key=None)
    path = manifest.write_manifest(Location.parse(tmp_path), m, ir_text=r.canonical_ir)
    assert isinstance(path, Path) and path.parent.name == layout.MANIFEST_DIRNAME
    assert not list(tmp_path.glob("*-cache"))  # nothing JAX's LRU would count
    loaded = manifest.load_manifest(Location.parse(tmp_path), r.key)
    assert loaded is not None and loaded.has_ir and loaded.volatile[0]["raw"] == "1234"
    assert manifest.recompute_key(loaded) == r.key
    assert manifest.recompute_key(loaded, hasher_version=splithash.HASHER_VERSION + 1) != r.key
    assert manifest.load_ir(Location.parse(tmp_path), r.key) == "module @jit_f {}"
    assert [x.key for x in manifest.iter_manifests(Location.parse(tmp_path))] == [r.key]
    assert manifest.load_manifest(Location.parse(tmp_path), "jit_g-" + "1" * 64) is None


def test_tampered_component_does_not_verify(tmp_path: Path) -> None:
    r = _result()
    r.component_pieces["compile_options"] = [b"tampered"]  # not what was hashed
    m = manifest.from_key_result(r, mode="stable", stored_under=r.key, jax_key=None)
    with pytest.raises(manifest.ManifestError):
        manifest.recompute_key(m)


def test_garbage_is_an_error_and_skipped(tmp_path: Path) -> None:
    folder = manifest.manifest_dir(tmp_path)
    folder.mkdir()
    (folder / "jit_x-00.json").write_text("{not json")
    with pytest.raises(manifest.ManifestError):
        manifest.load_manifest(Location.parse(tmp_path), "jit_x-00")
    assert list(manifest.iter_manifests(Location.parse(tmp_path))) == []


def _writer(args: tuple[str, int]) -> int:
    cache_dir, n = args
    r = _result(compile_options=b"x" * 5000)
    for i in range(n):
        m = manifest.from_key_result(r, mode="stable", stored_under=r.key, jax_key=str(i))
        manifest.write_manifest(Location.parse(cache_dir), m)
    return n


def test_concurrent_writers_never_expose_partial_files(tmp_path: Path) -> None:
    key = _result(compile_options=b"x" * 5000).key
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        pending = pool.map_async(_writer, [(str(tmp_path), 40)] * 4)
        reads = 0
        while not pending.ready() or reads == 0:
            m = manifest.load_manifest(Location.parse(tmp_path), key)  # raises on a torn file
            reads += m is not None
        assert pending.get() == [40] * 4
    assert manifest.load_manifest(Location.parse(tmp_path), key) is not None
    leftovers = [p.name for p in manifest.manifest_dir(tmp_path).iterdir()]
    assert leftovers == [f"{key}.json"]
