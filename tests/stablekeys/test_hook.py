"""The runtime hook against real JAX processes (the issue's "done when" list)."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest

from cachedoctor.core.findings import FindingKind
from cachedoctor.core.prune.options import PruneOptions
from cachedoctor.core.prune.planner import plan_prune
from cachedoctor.core.scan.run import scan_directory
from cachedoctor.stablekeys import manifest
from cachedoctor.storage.location import Location
from tests.support.hookrun import Run, base_env, entries, run_program
from tests.support.sessioncache import SharedBuilds

pytestmark = pytest.mark.slow

SEED_RESULT = "result: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]"


@pytest.fixture(scope="session")
def seed_ten(shared_builds: SharedBuilds) -> tuple[Path, list[Run]]:
    """The seed program run 10 times with the hook in one cache dir (shared, do not modify)."""
    cache, runs = shared_builds(
        "seed-ten", lambda cache: [run_program("seed", cache) for _ in range(10)]
    )
    return cache, runs


def test_seed_ten_runs_one_entry_and_hits(seed_ten: tuple[Path, list[Run]]) -> None:
    cache, runs = seed_ten
    assert len(entries(cache, "jit_f")) == 1
    assert "jit_f" in runs[0].misses
    for run in runs[1:]:
        assert run.misses == [], run.stderr[-2000:]
        assert run.result == SEED_RESULT
    # the manifest recomputes to the same key offline
    key = entries(cache, "jit_f")[0]
    m = manifest.load_manifest(Location.parse(cache), key)
    assert m is not None and m.sound and m.mode == "stable"
    assert manifest.recompute_key(m) == key
    fields = {v["field"] for v in m.volatile}
    assert "custom_call[0].backend_config" in fields


def test_seed_without_hook_never_hits(tmp_path: Path) -> None:
    """Control: the bug the hook fixes (a new jit_f entry per run)."""
    runs = [run_program("seed", tmp_path, mode="none") for _ in range(2)]
    assert len(entries(tmp_path, "jit_f")) == 2
    assert "jit_f" in runs[1].misses


def test_changed_partition_gives_new_key_and_result(
    seed_ten: tuple[Path, list[Run]], tmp_path: Path
):
    cache = tmp_path / "cache"
    shutil.copytree(seed_ten[0], cache)
    old_key = entries(cache, "jit_f")[0]
    old_bytes = (cache / f"{old_key}-cache").read_bytes()

    # a module-level constant read by the partitioned computation
    env = base_env(cache, CACHEDOCTOR_SEED_ADD="5")
    run = run_program("seed", cache, env=env)
    assert run.result == "result: [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]"
    assert "jit_f" in run.misses
    after_const = entries(cache, "jit_f")
    assert len(after_const) == 2 and old_key in after_const

    # the code of the partitioned computation
    from cachedoctor.programs import PROGRAMS_DIR

    prog = tmp_path / "prog"
    shutil.copytree(PROGRAMS_DIR, prog, ignore=shutil.ignore_patterns("__pycache__"))
    text = (prog / "seed.py").read_text()
    assert "return x + ADD" in text
    (prog / "seed.py").write_text(text.replace("return x + ADD", "return x + ADD + ADD"))
    run = run_program(prog / "seed.py", cache)
    assert run.result == "result: [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]"
    assert "jit_f" in run.misses
    assert len(entries(cache, "jit_f")) == 3
    assert (cache / f"{old_key}-cache").read_bytes() == old_bytes

    # the unchanged program, copied elsewhere, still hits the old entry
    (prog / "seed.py").write_text(text)
    run = run_program(prog / "seed.py", cache)
    assert run.result == SEED_RESULT and run.misses == []


def _jax_hashes_autotune_dir() -> bool:
    from jax._src import cache_key

    src = inspect.getsource(cache_key._hash_serialized_compile_options)
    return "xla_gpu_per_fusion_autotune_cache_dir" not in src


def test_copied_cache_hits_at_new_path(seed_ten: tuple[Path, list[Run]], tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere" / "cache"
    shutil.copytree(seed_ten[0], moved)
    before = entries(moved)
    run = run_program("seed", moved)
    assert run.misses == [] and run.result == SEED_RESULT
    assert entries(moved) == before
    # JAX hits them at the new path, so they are not relocated, and prune keeps them
    report = scan_directory(Location.parse(str(moved)), use_index=False)
    assert not [f for f in report.findings if f.kind is FindingKind.RELOCATED]
    assert (
        plan_prune(
            Location.parse(str(moved)), PruneOptions(relocated=True, duplicates=True)
        ).actions
        == ()
    )

    # without the hook a copied cache misses where JAX hashes the autotune path (jax <= 0.10)
    plain = tmp_path / "plain"
    run_program("plain", plain, mode="none")
    plain_moved = tmp_path / "plain-moved"
    shutil.copytree(plain, plain_moved)
    run = run_program("plain", plain_moved, mode="none")
    if _jax_hashes_autotune_dir():
        assert "jit_g" in run.misses
    else:
        assert run.misses == []


def _assert_re_keyed(cache: Path, stable_keys: list[str], jax_keys: list[str]) -> None:
    """Each stable key's manifest names the JAX key it was re-keyed from, with the same bytes."""
    for key in stable_keys:
        m = manifest.load_manifest(Location.parse(cache), key)
        assert m is not None and m.migrated_from in jax_keys
        assert (cache / f"{key}-cache").read_bytes() == (
            cache / f"{m.migrated_from}-cache"
        ).read_bytes()


def test_warm_cache_migrates_without_recompiling(tmp_path: Path) -> None:
    run_program("plain", tmp_path, mode="none")
    jax_keys = entries(tmp_path)
    run = run_program("plain", tmp_path, mode="stable")
    assert run.misses == [], run.stderr[-2000:]
    assert run.stats["migrated"] == len(jax_keys)
    stable_keys = sorted(set(entries(tmp_path)) - set(jax_keys))
    assert len(stable_keys) == len(jax_keys)
    _assert_re_keyed(tmp_path, stable_keys, jax_keys)
    # both worlds keep hitting: the hook on stable keys, plain JAX on its own
    again = run_program("plain", tmp_path, mode="stable")
    assert again.misses == [] and again.stats["migrated"] == 0
    # warm keys (manifests known) leave their entries to JAX's lookup: no stat of the hook's
    assert run.stats["entry_checks"] >= len(jax_keys) and again.stats["entry_checks"] == 0
    without = run_program("plain", tmp_path, mode="none")
    assert without.misses == []
    assert sorted(entries(tmp_path)) == sorted(jax_keys + stable_keys)


def test_an_entry_gone_from_under_its_manifest_is_re_keyed_on_jax_s_miss(tmp_path: Path) -> None:
    """A warm key (its manifest known) is left to JAX's own lookup; when that misses (the entry
    was evicted, and a process without the hook wrote JAX's own), the hook still re-keys it."""
    run_program("plain", tmp_path, mode="stable")
    stable_keys = entries(tmp_path)
    for key in stable_keys:
        assert manifest.load_manifest(Location.parse(tmp_path), key) is not None
        (tmp_path / f"{key}-cache").unlink()
    run_program("plain", tmp_path, mode="none")
    jax_keys = entries(tmp_path)
    assert jax_keys and not set(jax_keys) & set(stable_keys)

    run = run_program("plain", tmp_path, mode="stable")
    assert run.misses == [], run.stderr[-2000:]  # read again after the re-keying: JAX's hit
    assert run.stats["migrated"] == len(stable_keys)
    assert sorted(entries(tmp_path)) == sorted(jax_keys + stable_keys)
    _assert_re_keyed(tmp_path, stable_keys, jax_keys)


def test_observe_mode_keeps_jax_keys(tmp_path: Path) -> None:
    control = tmp_path / "control"
    run_program("plain", control, mode="none")
    observed = tmp_path / "observed"
    run = run_program("plain", observed, mode="observe")
    assert run.stats["mode"] == "observe"
    # same names as plain JAX at that path, apart from the path itself on jax <= 0.10
    assert [k.rsplit("-", 1)[0] for k in entries(observed)] == [
        k.rsplit("-", 1)[0] for k in entries(control)
    ]
    for key in entries(observed):
        m = manifest.load_manifest(Location.parse(observed), key)
        assert m is not None and m.mode == "observe" and m.jax_key == key
        assert m.stable_key != key and manifest.recompute_key(m) == m.stable_key


def test_hasher_failure_falls_back_to_jax_key(tmp_path: Path) -> None:
    control = tmp_path / "control"
    run_program("plain", control, mode="none")
    env = base_env(tmp_path / "broken", CACHEDOCTOR_TEST_BREAK_HASHER="1")
    run = run_program("plain", tmp_path / "broken", env=env)
    assert run.stats["installed"] is True and run.stats["fallbacks"] >= 1
    assert run.result.startswith("result: 4.58")
    assert len(entries(tmp_path / "broken")) == len(entries(control))


def test_copied_cache_with_all_xla_caches_hits(tmp_path: Path) -> None:
    """With the kernel cache on, its path is hashed (jax 0.12 too); the hook makes it relative."""
    first = tmp_path / "a"
    env = base_env(first, JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="all")
    run_program("plain", first, env=env)
    second = tmp_path / "b"
    shutil.copytree(first, second)
    env = base_env(second, JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="all")
    run = run_program("plain", second, env=env)
    assert run.misses == [] and entries(second) == entries(first)
    key = entries(second, "jit_g")[0]
    m = manifest.load_manifest(Location.parse(second), key)
    assert m is not None
    raw = {v["field"]: v["raw"] for v in m.volatile}
    assert raw.get("debug_options.xla_gpu_kernel_cache_file") == str(
        first / "xla_gpu_kernel_cache_file"
    )
    # control: plain JAX misses at the new path
    control = run_program(
        "plain",
        tmp_path / "c",
        env=base_env(tmp_path / "c", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="all"),
        mode="none",
    )
    shutil.copytree(tmp_path / "c", tmp_path / "d")
    moved = run_program(
        "plain",
        tmp_path / "d",
        env=base_env(tmp_path / "d", JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES="all"),
        mode="none",
    )
    assert control.misses and "jit_g" in moved.misses


def test_record_ir_keeps_the_canonical_module(tmp_path: Path) -> None:
    env = base_env(tmp_path, CACHEDOCTOR_RECORD_IR="1")
    run_program("seed", tmp_path, env=env)
    key = entries(tmp_path, "jit_f")[0]
    m = manifest.load_manifest(Location.parse(tmp_path), key)
    assert m is not None and m.has_ir
    text = manifest.load_ir(Location.parse(tmp_path), key)
    assert text is not None and "CustomSPMDPartitioning" in text
    canonical = next(v["canonical"] for v in m.volatile if v["field"].startswith("custom_call"))
    assert canonical.startswith("cachedoctor-cp-v") and canonical in text
    assert next(v["raw"] for v in m.volatile if v["field"].startswith("custom_call")) not in text


def test_process_settings_that_do_not_change_the_program_still_hit(
    seed_ten: tuple[Path, list[Run]], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(seed_ten[0], cache)
    env = base_env(
        cache,
        JAX_LOG_COMPILES="1",
        JAX_TRACEBACK_FILTERING="off",
        # JAX's own workaround: replay replaces it (with one warning)
        JAX_REMOVE_CUSTOM_PARTITIONING_PTR_FROM_CACHE_KEY="1",
    )
    run = run_program("seed", cache, env=env)
    assert run.misses == [] and run.result == SEED_RESULT
    assert run.stderr.count("replaces it with verified reuse") == 1, run.stderr[-2000:]
    assert entries(cache) == entries(seed_ten[0])
