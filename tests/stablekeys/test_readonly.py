"""Read-only use of a cache (``CACHEDOCTOR_READ_ONLY``, ``enable --read-only``): with JAX as the
oracle, a read-only run hits what a normal run hits (JAX's own "Persistent compilation cache
hit" log lines) and leaves the cache byte for byte as it was: every file's name, bytes and
mtime, ``-atime`` files and ``.lockfile`` of JAX's LRU included; the stats record goes to the
records folder, saying why its misses were not written."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachedoctor.cli import cli
from tests.support.buckets import Servers
from tests.support.hookrun import base_env
from tests.support.keylog import hits, run_logged

pytestmark = pytest.mark.slow

SEED_MODULES = {"jit_f", "jit_iota", "jit__multi_slice"}  # jit_f: custom_partitioning


def _seed() -> Path:
    from cachedoctor.programs import program_path

    return Path(program_path("seed"))


def snapshot(cache: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``cache``: its bytes' digest and mtime (ns)."""
    out = {}
    for path in sorted(cache.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(cache))] = (
                hashlib.sha256(path.read_bytes()).hexdigest(),
                st.st_mtime_ns,
            )
    return out


def read_only(records: Path, **extra: str) -> dict[str, str]:
    return {"CACHEDOCTOR_READ_ONLY": "1", "CACHEDOCTOR_RECORDS_DIR": str(records), **extra}


def records_in(folder: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("cachedoctor-stats/*.json"))]


LRU = {"JAX_COMPILATION_CACHE_MAX_SIZE": str(10**9)}


@pytest.mark.parametrize("hook", ["stats", "stable"])
def test_a_read_only_run_hits_what_a_normal_run_hits_and_writes_nothing(
    tmp_path: Path, hook: str
) -> None:
    """JAX's LRU on (the -atime files and the lock JAX's own get writes on every hit): the
    seed program under the stats recorder (jit_f's pointer key never hits) and the stable hook
    (jit_f hits by replay)."""
    cache, records = tmp_path / "cache", tmp_path / "records"
    run_logged(cache, hook, program=_seed(), env=LRU)
    normal = hits(run_logged(cache, hook, program=_seed(), env=LRU))
    assert normal == (SEED_MODULES if hook == "stable" else SEED_MODULES - {"jit_f"})
    assert any(p.name.endswith("-atime") for p in cache.iterdir())
    before = snapshot(cache)
    log = run_logged(cache, hook, program=_seed(), env={**LRU, **read_only(records)})
    assert hits(log) == normal, log[-3000:]
    assert snapshot(cache) == before
    (record,) = records_in(records)
    assert record["read_only"] is True and record["cache_dir"] == str(cache)
    modules = record["modules"]
    assert isinstance(modules, dict)
    missed = {m for m, c in modules.items() if c["misses"]}
    assert missed == SEED_MODULES - normal
    assert all(modules[m]["refused_read_only"] == 1 for m in missed)


def test_read_only_stable_hook_reads_entries_plain_jax_wrote(tmp_path: Path) -> None:
    """A normal stable-hook run re-keys the entries plain JAX wrote (and hits); a read-only one
    may not rename, so it reads them under JAX's own keys: the same hits, nothing moved."""
    cache, records = tmp_path / "cache", tmp_path / "records"
    run_logged(cache, None, program=_seed())  # plain JAX: its own keys
    before = snapshot(cache)
    log = run_logged(cache, "stable", program=_seed(), env=read_only(records))
    assert hits(log) == SEED_MODULES - {"jit_f"}, log[-3000:]  # jit_f: a pointer key
    assert snapshot(cache) == before


def test_a_missing_cache_dir_is_not_made_and_the_misses_say_why(tmp_path: Path) -> None:
    cache, records = tmp_path / "absent", tmp_path / "records"
    run_logged(cache, "stats", program=_seed(), env=read_only(records))
    assert not cache.exists()
    done = CliRunner().invoke(cli, ["stats", str(records), "--json"])
    doc = json.loads(done.output)
    assert doc["totals"]["refused_read_only"] == doc["totals"]["misses"] > 0
    assert {m["reason_kind"] for m in doc["modules"]} == {"read-only"}, doc["modules"]


def test_a_typo_in_the_variable_is_read_only_and_said(tmp_path: Path) -> None:
    cache, records = tmp_path / "cache", tmp_path / "records"
    run_logged(cache, "stats", program=_seed())
    before = snapshot(cache)
    log = run_logged(
        cache, "stats", program=_seed(), env=read_only(records, CACHEDOCTOR_READ_ONLY="ture")
    )
    assert "CACHEDOCTOR_READ_ONLY='ture' is not" in log and "taken as read-only" in log
    assert snapshot(cache) == before


def test_unknown_internals_turn_the_cache_off_not_writable(tmp_path: Path) -> None:
    """A JAX whose cache is not made through get_file_cache: nothing read, nothing written."""
    cache = tmp_path / "cache"
    cache.mkdir()
    program = (
        "from jax._src import compilation_cache as cc\n"
        "cc._initialize_cache = lambda: None\n"  # made otherwise: unknown to read-only
        "from cachedoctor.stablekeys import readonly\n"
        "assert readonly.install() is False\n"
        "import jax, jax.numpy as jnp\n"
        "print(jax.config.jax_enable_compilation_cache)\n"
        "jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env=base_env(cache),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"
    assert "the persistent cache is off in this process" in proc.stderr
    assert list(cache.iterdir()) == []


@pytest.mark.remote
def test_a_read_only_run_on_a_bucket(servers: Servers, tmp_path: Path) -> None:
    """s3://: the same hits as a normal run, the bucket's objects unchanged, the record local."""
    from cachedoctor.storage import stores

    url = servers.url("s3", f"readonly/{tmp_path.name}/cache")
    records = tmp_path / "records"
    run_logged(url, "stable", program=_seed(), env=servers.env)
    normal = hits(run_logged(url, "stable", program=_seed(), env=servers.env))
    assert normal == SEED_MODULES

    def listing() -> dict[str, str]:
        store = stores.open_store(url)
        out = {}
        for item in store.list():
            if not item.is_dir:
                with store.open_read(item.name) as f:
                    out[item.name] = hashlib.sha256(f.read()).hexdigest()
        return out

    before = listing()
    log = run_logged(url, "stable", program=_seed(), env={**servers.env, **read_only(records)})
    assert hits(log) == normal, log[-3000:]
    assert listing() == before
    (record,) = records_in(records)
    assert record["read_only"] is True


def test_status_and_enable_say_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("CACHEDOCTOR_CONFIG", str(config))
    for name in ("CACHEDOCTOR_READ_ONLY", "CACHEDOCTOR_RECORDS_DIR", "CACHEDOCTOR_HOOK"):
        monkeypatch.delenv(name, raising=False)
    cache, records = tmp_path / "cache", tmp_path / "records"
    cache.mkdir()
    runner = CliRunner()
    done = runner.invoke(
        cli, ["enable", "--dir", str(cache), "--read-only", "--records-dir", str(records)]
    )
    assert done.exit_code == 0, done.output
    text = config.read_text()
    assert "read_only = true" in text and f'records_dir = "{records}"' in text
    status = runner.invoke(cli, ["status"])
    assert "read-only: yes" in status.output, status.output
    assert f"records go to {records}/cachedoctor-stats/" in status.output
    env = runner.invoke(cli, ["enable", "--dir", str(cache), "--read-only", "--print-env"])
    assert "CACHEDOCTOR_READ_ONLY=1" in env.output
    again = runner.invoke(cli, ["enable", "--dir", str(cache), "--min-compile-time", "0"])
    assert again.exit_code == 0 and "read_only = true" in config.read_text(), again.output
    assert "kept from the previous config: " in again.output and "read_only" in again.output
    writable = runner.invoke(cli, ["enable", "--dir", str(cache), "--writable"])
    assert writable.exit_code == 0 and "read_only" not in config.read_text()
    assert os.environ.get("CACHEDOCTOR_READ_ONLY") is None
