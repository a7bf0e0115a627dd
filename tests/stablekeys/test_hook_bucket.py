"""The hook with a ``gs://`` / ``s3://`` cache dir (local S3 and GCS servers): the seed program
hits from run 2 by replay, a changed partition rule gives its new result, concurrent writers
leave whole manifests, and the manifests are read once per process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cachedoctor.stablekeys import entry_files, manifest
from cachedoctor.storage.location import Location
from cachedoctor.storage.retry import bounded_map
from tests.support.buckets import Proxy, Servers, serve
from tests.support.hookrun import Run, base_env, entries, run_program, run_recorded

pytestmark = pytest.mark.slow

SEED_RESULT = "result: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]"


@pytest.mark.remote
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_seed_on_a_bucket_one_entry_hits_from_run_two(
    scheme: str, servers: Servers, tmp_path: Path
) -> None:
    url = servers.url(scheme, f"seed/{tmp_path.name}/cache")
    env = base_env(url, **servers.env)
    runs = [run_program("seed", url, env=env) for _ in range(3)]
    assert "jit_f" in runs[0].misses and runs[0].stats["recorded"] == 1
    for run in runs[1:]:
        assert run.result == SEED_RESULT
        assert run.misses == [], run.stderr[-2000:]
        assert run.stats["replayed"] == 1 and run.stats["unsound"] == 0
    (key,) = entries(url, "jit_f")
    m = manifest.load_manifest(Location.parse(url), key)
    assert m is not None and m.key_mode == "replay" and manifest.recompute_key(m) == key

    changed = run_program("seed", url, env={**env, "CACHEDOCTOR_SEED_ADD": "2.0"})
    assert changed.result == "result: [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]"
    assert "jit_f" in changed.misses and changed.stats["replay_misses"] == 1
    back = run_program("seed", url, env=env)
    assert back.result == SEED_RESULT and back.misses == []
    assert len(entries(url, "jit_f")) == 2


@pytest.mark.remote
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_stats_record_reaches_the_bucket(scheme: str, servers: Servers, tmp_path: Path) -> None:
    """The record is written as the process ends (on S3 none ever arrived: the write came after
    Python had shut its thread pools down, "cannot schedule new futures after shutdown")."""
    from cachedoctor.core.usage.records import read_records
    from cachedoctor.storage import stores

    url = servers.url(scheme, f"stats/{tmp_path.name}/cache")
    for mode in ("stable", "stats"):
        log = run_recorded(url, mode, "plain", **servers.env)
        assert "could not write the stats record" not in log, log[-2000:]
    records, problems = read_records(stores.open_store(url))
    assert problems == [] and sorted(r.hook for r in records) == ["stable", "stats"]
    assert all(r.modules["jit_g"].requests == 1 for r in records)


NAMES_ITS_CACHE = """
import os
import jax
import jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", os.environ["NAMED_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
print(jax.jit(lambda x: x * 2.0)(jnp.arange(4.0)))
# the record's store is then a client made at exit, as where JAX reaches the bucket with a
# backend other than fsspec: its connection goes through the thread pools Python shuts down
import fsspec
from cachedoctor.stablekeys import manifest
fsspec.AbstractFileSystem.clear_instance_cache()
manifest._jax_filesystem = lambda url: None
"""


@pytest.mark.remote
@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_a_record_reaches_a_bucket_the_program_names_itself(
    scheme: str, servers: Servers, tmp_path: Path
) -> None:
    """A program that names its bucket cache with ``jax.config.update``, after the start-up, and
    whose record goes through a client made at exit: the writer still runs before Python stops
    its thread pools ("cannot schedule new futures after shutdown" without the ordering, or
    when it is asked only at start-up); a local cache never imports them."""
    import subprocess
    import sys

    from cachedoctor.core.usage.records import read_records
    from cachedoctor.storage import stores

    url = servers.url(scheme, f"named/{tmp_path.name}/cache")
    script = tmp_path / "names_its_cache.py"
    script.write_text(NAMES_ITS_CACHE)
    env = base_env(None, CACHEDOCTOR_HOOK="stats", NAMED_CACHE=url, **servers.env)
    for name in ("AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST"):  # a host name, as a service has:
        env[name] = env[name].replace("127.0.0.1", "localhost")  # resolved in a thread pool too
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "could not write the stats record" not in proc.stderr, proc.stderr[-2000:]
    records, problems = read_records(stores.open_store(url))
    assert problems == [] and [r.hook for r in records] == ["stats"]


# the seed's custom op jitted at three shapes: three lookups of one module (three base keys)
SHAPES = """
import os, sys
sys.path.insert(0, {programs!r})
from _common import setup_jax
jax = setup_jax()
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

@custom_partitioning
def op(x):
    return x
def partition(mesh, arg_shapes, result_shape):
    s = NamedSharding(mesh, P("x"))
    return mesh, lambda x: x + 1, s, (s,)
def infer(mesh, arg_shapes, result_shape):
    return NamedSharding(mesh, P("x"))
rules = dict(partition=partition, infer_sharding_from_operands=infer)
try:
    op.def_partition(sharding_rule="i -> i", **rules)
except TypeError:  # jax without Shardy sharding rules
    op.def_partition(**rules)
mesh = Mesh(jax.devices(), ("x",))
s = NamedSharding(mesh, P("x"))
def f(x):
    return op(x)
for n in (8, 16, 24):
    x = jax.device_put(jnp.zeros(n, dtype=jnp.float32), s)
    print("result:", n, float(jax.jit(f, in_shardings=s, out_shardings=s)(x).sum()))
"""


@pytest.mark.remote
def test_manifests_are_read_once_per_process(servers: Servers, tmp_path: Path) -> None:
    """A warm process lists the manifests once and reads each of the module's replay
    manifests once, though it looks the module up three times; no request per static lookup
    (moto's requests counted by a forwarding proxy)."""
    from cachedoctor.programs import program_path

    program = tmp_path / "shapes.py"
    program.write_text(SHAPES.format(programs=str(program_path("seed").parent)))
    url = servers.url("s3", f"read-once/{tmp_path.name}/cache")
    prefix = f"/cachedoctor-s3/read-once/{tmp_path.name}/cache/"
    proxy = Proxy(servers.s3_port, every=0)
    with serve(proxy) as endpoint:
        env = base_env(url, **{**servers.env, "AWS_ENDPOINT_URL": endpoint})
        cold = run_program(program, url, env=env)
        assert cold.stats["recorded"] == 3
        proxy.log.clear()
        warm = run_program(program, url, env=env)
    assert "jit_f" not in warm.misses and warm.stats["replayed"] == 3
    manifests = [(method, path) for method, path, _ in proxy.log if "cachedoctor-manifests" in path]
    listings = [p for m, p in manifests if "list-type=2" in p]
    reads = [p for m, p in manifests if m == "GET" and p.startswith(prefix + "cachedoctor-")]
    assert len(listings) == 1, manifests
    assert sorted(reads) == sorted(set(reads)) and len(reads) == 3, manifests
    assert all("/jit_f-" in p for p in reads)
    assert not [p for m, p in manifests if m == "HEAD"], manifests


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.remote)])
def test_processes_starting_together_leave_whole_manifests(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Three independent processes start the seed at once on an empty cache: each compiles
    (none can see another's variant yet), every manifest parses, one entry per key; the next
    three, started at once too, all hit."""
    env: dict[str, str] = {}
    cache: Path | str = tmp_path / "cache"
    if where != "local":
        servers: Servers = request.getfixturevalue("servers")
        cache, env = servers.url(where, f"together/{tmp_path.name}/cache"), servers.env

    def wave() -> list[Run]:
        return list(
            bounded_map(
                lambda _: run_program("seed", cache, env=base_env(cache, **env)), [0] * 3, 3
            )
        )

    first = wave()
    assert all(run.result == SEED_RESULT for run in first)
    keys = manifest.manifest_keys(Location.parse(cache))
    found = list(manifest.iter_manifests(Location.parse(cache)))
    assert sorted(m.key for m in found) == sorted(keys)  # every manifest parses
    variants = [m for m in found if m.module_name == "jit_f"]
    assert sorted(m.key for m in variants) == entries(cache, "jit_f")
    assert 1 <= len(variants) <= 3
    again = wave()
    assert all(run.result == SEED_RESULT and run.misses == [] for run in again), [
        r.misses for r in again
    ]
    assert entries(cache, "jit_f") == sorted(m.key for m in variants)


@pytest.mark.remote
def test_the_hook_reaches_a_bucket_through_jax_s_own_filesystem(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No client of its own in a JAX process (creating one costs ~100 ms of CPU per start).

    S3 only in this process: gcsfs read GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT when the test
    modules were collected, before the servers' environment was set, so JAX's GCS instance
    here would first probe the emulator over gRPC (a minute); JAX's processes on gs:// above
    run with the environment set from the start."""
    from jax._src import path as jax_path

    monkeypatch.setattr(manifest, "_STORES", {})
    url = servers.url("s3", "shared/cache")
    jax_fs: Any = jax_path.Path(url)._backend  # type: ignore[attr-defined]
    first: Any = manifest.store_for(Location.parse(url))
    assert first.fs is not jax_fs.fs(url)
    monkeypatch.setattr(manifest, "_STORES", {})
    monkeypatch.setattr(entry_files, "_SHARE_JAX_FILESYSTEM", False)
    entry_files.share_jax_filesystem()
    store: Any = manifest.store_for(Location.parse(url))
    assert store.fs is jax_fs.fs(url)
    store.write_atomic("cachedoctor-manifests/m-0.json", b"{}", create=True)
    assert manifest.manifest_keys(Location.parse(url)) == {"m-0"}


NO_REPLAY = """
import runpy
from cachedoctor.stablekeys import replay
replay.installed = lambda: False  # as when the partitioner entry points could not be wrapped
runpy.run_path({seed!r}, run_name="__main__")
"""


def _said(run: Run) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("cachedoctor: ")]


@pytest.mark.remote
def test_without_replay_a_bucket_run_misses_and_says_why_once(
    servers: Servers, tmp_path: Path
) -> None:
    from cachedoctor.programs import program_path

    program = tmp_path / "no_replay.py"
    program.write_text(NO_REPLAY.format(seed=str(program_path("seed"))))
    url = servers.url("s3", f"no-replay/{tmp_path.name}/cache")
    for _ in range(2):
        run = run_program(program, url, env=base_env(url, **servers.env))
        assert run.result == SEED_RESULT and "jit_f" in run.misses
        (line,) = _said(run)
        assert "jit_f: custom_partitioning replay is unavailable" in line
        assert "a miss, never a stale hit" in line


def test_manifests_that_cannot_be_written_say_so_once(tmp_path: Path) -> None:
    """The replay manifest cannot be written (here a file where its folder should be): the
    variant is never reused, and the run says so once; the next run misses, never stale."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "cachedoctor-manifests").write_text("not a folder")
    for value in ("1.0", "2.0"):
        run = run_program("seed", cache, env=base_env(cache, CACHEDOCTOR_SEED_ADD=value))
        assert "jit_f" in run.misses and run.stats["replayed"] == 0
        assert run.result.startswith(f"result: [{float(value)}, ")
        (said,) = _said(run)  # one line for the folder, whichever write or read failed first
        assert "key manifests" in said and "not a folder" in said and "never a stale hit" in said
