"""`enable --max-size` never breaks programs (issue 28, item 1).

JAX's LRU eviction imports ``filelock`` (``jax/_src/lru_cache.py``); without it every compile
warns and nothing is cached. The README's ``pip install .`` must bring it, and ``enable`` and
``status`` must say so when an environment lacks it. The environment without it is made by a
``filelock`` package on PYTHONPATH that fails to import, so JAX sees exactly what it would see.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from cachedoctor.programs import program_path
from tests.support.caches import SCRIPT, cli_env


def _env(tmp_path: Path, *, without_filelock: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in cli_env().items() if not k.startswith(("JAX_", "CACHEDOCTOR_"))}
    env.update(CACHEDOCTOR_CONFIG=str(tmp_path / "config.toml"), JAX_PLATFORMS="cpu", **extra)
    if without_filelock:
        shadow = tmp_path / "no-filelock" / "filelock"
        shadow.mkdir(parents=True, exist_ok=True)
        (shadow / "__init__.py").write_text("raise ImportError('filelock hidden by the test')\n")
        env["PYTHONPATH"] = f"{shadow.parent}:{env.get('PYTHONPATH', '')}"
    return env


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)


def test_filelock_is_installed_with_cachedoctor() -> None:
    requires = [Requirement(r) for r in importlib.metadata.requires("cachedoctor") or []]
    core = {r.name for r in requires if r.marker is None}  # not an extra
    assert "filelock" in core


@pytest.mark.slow
def test_without_filelock_jax_caches_nothing(tmp_path: Path) -> None:
    """The oracle: JAX itself, with a size limit and no filelock, warns and writes nothing."""
    cache = tmp_path / "cache"
    env = _env(
        tmp_path,
        without_filelock=True,
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_COMPILATION_CACHE_MAX_SIZE=str(10**10),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        CACHEDOCTOR_DISABLE="1",
    )
    proc = subprocess.run(
        [sys.executable, str(program_path("plain"))], capture_output=True, text=True, env=env
    )
    assert "Please install the `filelock` package" in proc.stderr, proc.stderr[-2000:]
    assert not list(cache.glob("*-cache"))


@pytest.mark.slow
def test_enable_refuses_a_size_limit_jax_cannot_honour(tmp_path: Path) -> None:
    env = _env(tmp_path, without_filelock=True)
    proc = run("enable", "--dir", str(tmp_path / "cache"), "--max-size", "10GB", env=env)
    assert proc.returncode == 2, proc
    assert proc.stderr.startswith("cachedoctor: needs-filelock: --max-size needs the filelock")
    assert not (tmp_path / "config.toml").exists()
    ok = run("enable", "--dir", str(tmp_path / "cache"), env=env)  # no limit: nothing to lock
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow
def test_status_says_when_the_size_limit_lacks_filelock(tmp_path: Path) -> None:
    env = _env(tmp_path, without_filelock=True, JAX_COMPILATION_CACHE_MAX_SIZE=str(10**10))
    proc = run("status", env=env)
    assert proc.returncode == 1, proc
    assert "the filelock package is missing" in proc.stderr, proc.stderr
    with_it = _env(tmp_path, without_filelock=False, JAX_COMPILATION_CACHE_MAX_SIZE=str(10**10))
    assert run("status", env=with_it).returncode == 0


@pytest.mark.slow
def test_max_size_zero_is_refused() -> None:
    proc = run("enable", "--dir", "/tmp/x", "--max-size", "0", "--print-env", env=cli_env())
    assert proc.returncode == 2 and "turns JAX's cache off" in proc.stderr, proc


@pytest.mark.slow
def test_enable_max_size_caches_with_lru_eviction(tmp_path: Path) -> None:
    """The README's path: enable with a size limit, run a program; JAX writes the entries and
    its LRU's -atime files (jax/_src/lru_cache.py), so eviction is really on."""
    cache = tmp_path / "cache"
    env = _env(tmp_path, without_filelock=False)
    enabled = run(
        "enable", "--dir", str(cache), "--max-size", "10GB", "--min-compile-time", "0", env=env
    )
    assert enabled.returncode == 0, enabled.stderr
    proc = subprocess.run(
        [sys.executable, str(program_path("plain"))], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0 and "filelock" not in proc.stderr, proc.stderr[-2000:]
    entries = list(cache.glob("*-cache"))
    assert entries and len(list(cache.glob("*-atime"))) == len(entries)
