"""enable / disable / status: the config file, --print-env, preflight, and real activation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachedoctor.cli import cli
from cachedoctor.programs import program_path
from cachedoctor.stablekeys import activation, settings
from cachedoctor.stablekeys.resolved import resolve
from tests.support.hookrun import MISS_RE, entries


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the config file at a temp path: tests never touch the real environment's file."""
    path = tmp_path / "etc" / "config.toml"
    monkeypatch.setenv(settings.CONFIG_ENV, str(path))
    for name in list(os.environ):
        if name.startswith(("JAX_", "CACHEDOCTOR_")) and name != settings.CONFIG_ENV:
            monkeypatch.delenv(name)
    return path


def _invoke(*args: str) -> tuple[int, str, str]:
    runner = CliRunner()
    result = runner.invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_enable_writes_config_and_disable_removes_it(config: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code, out, _ = _invoke(
        "enable",
        "--dir",
        str(cache),
        "--xla-caches",
        "none",
        "--min-compile-time",
        "0",
        "--max-size",
        "1000000",
    )
    assert code == 0 and str(config) in out
    values = settings.load(config)
    assert values.pop("created_dirs").split(os.pathsep) == [str(cache), str(config.parent)]
    assert values == {
        "cache_dir": str(cache),
        "xla_caches": "none",
        "hook": "stable",
        "record_ir": False,
        "min_compile_time_secs": 0.0,
        "max_size": 1000000,
    }
    assert cache.is_dir()
    resolved = {r.key: r for r in resolve()}
    assert resolved["cache_dir"].source == "config file"
    assert resolved["min_entry_size_bytes"].source == "JAX default"
    os.environ["JAX_COMPILATION_CACHE_DIR"] = "/elsewhere"
    try:
        assert {r.key: r for r in resolve()}["cache_dir"].source.startswith("env ")
    finally:
        del os.environ["JAX_COMPILATION_CACHE_DIR"]
    (cache / "jit_f-0-cache").write_bytes(b"entry")
    code, out, _ = _invoke("disable")
    assert code == 0 and not config.exists() and not config.parent.exists()
    assert (cache / "jit_f-0-cache").exists()  # entries (and their folder) are never deleted
    code, out, _ = _invoke("disable")
    assert code == 0 and "not enabled" in out


def test_enable_without_dir_is_a_usage_error(config: Path) -> None:
    with pytest.raises(activation.ConfigError):
        activation.build_values(
            cache_dir=None,
            xla_caches=None,
            min_compile_time=None,
            min_entry_size=None,
            max_size=None,
            hook="stable",
            record_ir=False,
        )


@pytest.mark.parametrize(
    ("shell", "expected"),
    [
        ("sh", "export JAX_COMPILATION_CACHE_DIR='/c d'"),
        ("fish", "set -gx JAX_COMPILATION_CACHE_DIR '/c d'"),
        ("github", "JAX_COMPILATION_CACHE_DIR=/c d"),
        ("dotenv", 'JAX_COMPILATION_CACHE_DIR="/c d"'),
    ],
)
def test_print_env(config: Path, shell: str, expected: str) -> None:
    code, out, _ = _invoke(
        "enable", "--dir", "/c d", "--xla-caches", "all", "--print-env", "--shell", shell
    )
    assert code == 0 and not config.exists()
    lines = out.splitlines()
    assert expected in lines
    assert any("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES" in line and "all" in line for line in lines)
    assert any("CACHEDOCTOR_HOOK" in line and "stable" in line for line in lines)


def test_preflight_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # as activation calls it
    monkeypatch.setattr(activation, "_cuda_dirs", lambda: [tmp_path / "no-cuda"])
    codes = {
        w.code
        for w in activation.preflight(
            {"cache_dir": str(tmp_path), "xla_caches": "all"}, check_jax=False
        )
    }
    assert "kernel-cache-without-nvlink" in codes
    cuda = tmp_path / "cuda" / "bin"
    cuda.mkdir(parents=True)
    (cuda / "nvlink").write_text("#!/bin/sh\n")
    (cuda / "nvlink").chmod(0o755)
    monkeypatch.setattr(activation, "_cuda_dirs", lambda: [tmp_path / "cuda"])
    assert not activation.preflight(
        {"cache_dir": str(tmp_path), "xla_caches": "kernel"}, check_jax=False
    )
    # gs:// and s3:// get local sub-caches (XLA_FLAGS); another URL scheme only a warning
    assert not activation.preflight(
        {"cache_dir": "gs://b/c", "xla_caches": "autotune"}, check_jax=False
    )
    codes = {
        w.code
        for w in activation.preflight(
            {"cache_dir": "hdfs://b/c", "xla_caches": "autotune"}, check_jax=False
        )
    }
    assert codes == {"url-cache-dir"}
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    codes = {
        w.code
        for w in activation.preflight(
            {"cache_dir": str(shared), "xla_caches": "none"}, check_jax=False
        )
    }
    assert codes == {"insecure-dir"}
    shared.chmod(0o1777)  # sticky, like /tmp
    assert not activation.preflight(
        {"cache_dir": str(shared), "xla_caches": "none"}, check_jax=False
    )


def test_preflight_names_options_jax_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activation, "_jax_has_option", lambda name: False)
    found = activation.preflight({"cache_dir": "gs://x", "xla_caches": "none"})
    assert {w.code for w in found} == {"jax-lacks-option"}


# -- real interpreters of this environment (needs the installed start-up .pth) ---------------


def _pth_installed() -> bool:
    return (Path(sysconfig.get_paths()["purelib"]) / "cachedoctor_startup.pth").exists()


needs_pth = pytest.mark.skipif(
    not _pth_installed(),
    reason="cachedoctor is not installed in this interpreter (pip install -e .)",
)

_ASK = (
    "import json, jax; from jax._src import config; from cachedoctor.stablekeys import hook; "
    "print(json.dumps([config.compilation_cache_dir.value, "
    "config.persistent_cache_enable_xla_caches.value, hook.installed_mode()]))"
)


def _fresh(code: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )


@needs_pth
@pytest.mark.slow
def test_enable_activates_fresh_interpreters_and_disable_restores(
    config: Path, tmp_path: Path
) -> None:
    before = json.loads(_fresh(_ASK).stdout)
    assert before[0] is None and before[2] is None
    cache = tmp_path / "cache"
    assert _invoke("enable", "--dir", str(cache), "--xla-caches", "all")[0] == 0
    assert json.loads(_fresh(_ASK).stdout) == [str(cache), "all", "stable"]
    # the environment still wins over the file
    assert json.loads(_fresh(_ASK, {"JAX_COMPILATION_CACHE_DIR": "/env/dir"}).stdout)[0] == (
        "/env/dir"
    )
    report = activation.status()
    assert report.probe["hook"] == "stable"
    assert {r.key: r.source for r in report.settings}["xla_caches"] == "config file"
    assert _invoke("disable")[0] == 0
    assert json.loads(_fresh(_ASK).stdout) == before
    # the hook alone, from the environment (what `enable --print-env` gives CI)
    assert json.loads(_fresh(_ASK, {"CACHEDOCTOR_HOOK": "observe"}).stdout)[2] == "observe"


@needs_pth
@pytest.mark.slow
def test_warm_cache_keeps_hitting_after_enable(config: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plain = str(program_path("plain"))
    env = {"JAX_EXPLAIN_CACHE_MISSES": "1"}
    _fresh(
        f"import runpy; runpy.run_path({plain!r})", {**env, "JAX_COMPILATION_CACHE_DIR": str(cache)}
    )
    jax_keys = entries(cache)
    assert jax_keys
    assert (
        _invoke(
            "enable", "--dir", str(cache), "--xla-caches", "autotune", "--min-compile-time", "0"
        )[0]
        == 0
    )
    run = _fresh(f"import runpy; runpy.run_path({plain!r})", env)
    assert MISS_RE.findall(run.stderr) == [], run.stderr[-2000:]
    now = entries(cache)
    assert set(jax_keys) < set(now) and len(now) == 2 * len(jax_keys)  # re-keyed, old kept


# -- a bucket as the cache dir: XLA's sub-caches stay local ------------------------------------

_LOCAL = "/tmp/cachedoctor-xla-subcaches/gs/team-bucket/jax/cache"
_AUTOTUNE = (
    f"--xla_gpu_per_fusion_autotune_cache_dir={_LOCAL}/xla_gpu_per_fusion_autotune_cache_dir"
)
_KERNEL = f"--xla_gpu_kernel_cache_file={_LOCAL}/xla_gpu_kernel_cache_file"


@pytest.mark.parametrize(
    ("which", "flags"),
    [("autotune", [_AUTOTUNE]), ("all", [_AUTOTUNE, _KERNEL]), ("kernel", [_KERNEL]), ("none", [])],
)
def test_print_env_for_a_bucket_keeps_subcaches_local(
    config: Path, monkeypatch: pytest.MonkeyPatch, which: str, flags: list[str]
) -> None:
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to=/tmp/d {_KERNEL}x")  # replaced, not doubled
    url = "gs://team-bucket/jax/cache"
    code, out, err = _invoke(
        "enable", "--dir", url, "--xla-caches", which, "--print-env", "--shell", "dotenv"
    )
    assert code == 0 and not config.exists()
    env = dict(line.split("=", 1) for line in out.splitlines())
    assert env["JAX_COMPILATION_CACHE_DIR"] == f'"{url}"'
    if not flags:
        assert "XLA_FLAGS" not in env and env["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == '"none"'
        assert "locally" not in err
        return
    assert env["JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"] == '"none"'
    assert env["XLA_FLAGS"].strip('"').split() == [
        "--xla_dump_to=/tmp/d",
        *([f"{_KERNEL}x"] if which == "autotune" else []),
        *flags,
    ]
    assert f"XLA sub-caches kept locally at {_LOCAL} (XLA cannot write gs://" in err


@pytest.mark.slow
@needs_pth
def test_enable_with_a_bucket_sets_local_subcaches_in_fresh_interpreters(config: Path) -> None:
    code, out, _ = _invoke("enable", "--dir", "gs://team-bucket/jax/cache", "--xla-caches", "all")
    assert code == 0, out
    assert f"XLA sub-caches kept locally at {_LOCAL}" in out
    assert f"XLA_FLAGS += {_AUTOTUNE}" in out and f"XLA_FLAGS += {_KERNEL}" in out
    ask = (
        "import json, os, jax; from jax._src import config; "
        "print(json.dumps([config.compilation_cache_dir.value, "
        "config.persistent_cache_enable_xla_caches.value, os.environ.get('XLA_FLAGS')]))"
    )
    cache_dir, xla_caches, xla_flags = json.loads(
        _fresh(ask, {"XLA_FLAGS": "--xla_dump_to=/x"}).stdout
    )
    assert (cache_dir, xla_caches) == ("gs://team-bucket/jax/cache", "none")
    assert xla_flags.split() == ["--xla_dump_to=/x", _AUTOTUNE, _KERNEL]
    # the user's own choice in the environment wins: no flags are added
    overridden = _fresh(ask, {"JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}).stdout
    assert json.loads(overridden)[2] is None
