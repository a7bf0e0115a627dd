"""Trust on first use (issue 18): no hang, no lock-out, no false green, one clear line per error.

Each test runs the installed console script on input built here (real JAX caches from the
session fixtures; hand-made bytes only for broken input) with a timeout, as a user would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cachedoctor.programs import program_path
from tests.conftest import cli_env
from tests.test_cli import SCRIPT

HASH = "a" * 64
TIMEOUT_S = 60  # a hang fails the test instead of stalling the suite


def cachedoctor(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The console script, with a timeout: a hang is a failure, not a stall."""
    assert SCRIPT, "the cachedoctor console script is not installed in this environment"
    return subprocess.run(
        [SCRIPT, *args],
        capture_output=True,
        text=True,
        env=env or cli_env(),
        cwd=cwd,
        timeout=TIMEOUT_S,
        check=False,
    )


def one_clear_line(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    """Exit 2 with one line that says ``needle``, no traceback, no internal-error."""
    assert proc.returncode == 2, proc
    assert needle in proc.stderr, proc.stderr
    assert "internal-error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# -- 2. special files never block ----------------------------------------------------------


def _plant_special_files(cache: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A FIFO named like an entry, one like an -atime file, and a socket named like an entry."""
    fifo = f"jit_fifo-{HASH}-cache"
    os.mkfifo(cache / fifo)
    os.mkfifo(cache / f"jit_fifo2-{HASH}-atime")
    with monkeypatch.context() as m, socket.socket(socket.AF_UNIX) as sock:
        m.chdir(cache)  # a relative name: an AF_UNIX path is limited to 108 bytes
        sock.bind(f"jit_sock-{'b' * 64}-cache")
    return [fifo]


def test_special_files_named_like_entries_never_block(
    seed_cache: Path, copy_of, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = copy_of(seed_cache)
    (fifo,) = _plant_special_files(cache, monkeypatch)
    scan = cachedoctor("scan", str(cache))
    assert scan.returncode == 0, scan.stderr  # not corrupt: not an entry at all
    assert "unknown-file" in scan.stdout
    assert cachedoctor("lint", str(cache)).returncode == 0
    one_clear_line(cachedoctor("show", str(cache / fifo)), "not a regular file")
    prune = cachedoctor("prune", str(cache), "--corrupt", "--orphans")
    assert prune.returncode == 0, prune.stderr
    assert fifo not in prune.stdout  # never planned for removal: cachedoctor does not own it


def test_check_with_a_fifo_in_its_cache_does_not_block(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.mkfifo(cache / f"jit_fifo-{HASH}-cache")
    proc = cachedoctor(
        "check", "--dir", str(cache), "--", sys.executable, str(program_path("plain"))
    )
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr


# -- 3. a broken config never locks the user out -------------------------------------------


@pytest.mark.parametrize("kind", ["junk", "binary", "directory"])
def test_broken_config_is_named_and_recoverable(tmp_path: Path, kind: str) -> None:
    config = tmp_path / "config.toml"
    if kind == "junk":
        config.write_text('[cachedoctor]\ncache_dir = "/x"\nthis is junk\n')
    elif kind == "binary":
        config.write_bytes(b"\x00\xff\xfe\x00binary")
    else:
        config.mkdir()
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(config)}
    status = cachedoctor("status", env=env)
    one_clear_line(status, str(config))
    if kind == "junk":
        assert "line 3" in status.stderr
        disable = cachedoctor("disable", env=env)
        assert disable.returncode == 0 and not config.exists(), disable.stderr
        config.write_text("junk\n")
    if kind == "directory":
        one_clear_line(cachedoctor("disable", env=env), "is a directory")
        return
    enable = cachedoctor("enable", "--dir", str(tmp_path / "cache"), env=env)
    assert enable.returncode == 0, enable.stderr
    assert "broken-config" in enable.stderr and str(config) in enable.stderr
    assert cachedoctor("status", env=env).returncode == 0
    assert cachedoctor("disable", env=env).returncode == 0 and not config.exists()


def test_jax_process_says_once_that_activation_failed(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("junk\n")
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(config), "JAX_PLATFORMS": "cpu"}
    code = "import jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(3)); print('ran')"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "activation failed" in line]
    assert len(said) == 1 and str(config) in said[0] and "line 1" in said[0], proc.stderr


def test_status_exits_nonzero_on_an_activation_error(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    # valid TOML, but a value JAX refuses: activation fails in the fresh interpreter
    config.write_text('[cachedoctor]\ncache_dir = "/tmp/x"\nmin_compile_time_secs = "soon"\n')
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(config)}
    proc = cachedoctor("status", env=env)
    assert "activation error" in proc.stdout, proc.stdout
    assert proc.returncode == 1


def test_status_under_disable_ignores_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(config)}
    cache = tmp_path / "cache"
    assert cachedoctor("enable", "--dir", str(cache), env=env).returncode == 0
    shown = cachedoctor("status", env=env).stdout
    assert str(cache) in shown and "autotune" in shown and "xla_gpu_per_fusion" not in shown
    off = cachedoctor("status", env={**env, "CACHEDOCTOR_DISABLE": "1"})
    assert off.returncode == 0, off.stderr
    assert str(cache) not in off.stdout.split("effective settings", 1)[1]
    assert "CACHEDOCTOR_DISABLE=1" in off.stdout
    assert " None " not in off.stdout


# -- 6. values that mean nothing are refused -----------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--min-compile-time", "-5"],
        ["--min-compile-time", "nan"],
        ["--max-size", "-5"],
        ["--max-size", "inf"],
        ["--shell", "fish"],
        ["--min-entry-size", "-1"],
    ],
)
def test_enable_refuses_meaningless_values(tmp_path: Path, args: list[str]) -> None:
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(tmp_path / "config.toml")}
    proc = cachedoctor("enable", "--dir", str(tmp_path / "cache"), *args, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc
    assert not (tmp_path / "config.toml").exists()


def test_enable_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(tmp_path / "config.toml")}
    regular = tmp_path / "file"
    regular.write_text("x")
    one_clear_line(cachedoctor("enable", "--dir", str(regular), env=env), "not a directory")
    one_clear_line(cachedoctor("enable", "--dir", str(regular / "sub"), env=env), str(regular))
    assert not (tmp_path / "config.toml").exists()


def test_enable_takes_sizes_as_prune_does_and_says_what_it_keeps(tmp_path: Path) -> None:
    env = {**cli_env(), "CACHEDOCTOR_CONFIG": str(tmp_path / "config.toml")}
    first = cachedoctor("enable", "--dir", str(tmp_path / "cache"), "--max-size", "10GB", env=env)
    assert first.returncode == 0, first.stderr
    assert "max_size = 10000000000" in first.stdout
    assert "1 s" in first.stdout  # JAX's min_compile_time_secs default is said
    second = cachedoctor("enable", "--min-compile-time", "0", env=env)
    assert second.returncode == 0, second.stderr
    assert "kept from the previous config: cache_dir, xla_caches, max_size" in second.stdout


def test_scan_refuses_negative_max_modules(seed_cache: Path) -> None:
    proc = cachedoctor("scan", str(seed_cache), "--max-modules", "-1")
    assert proc.returncode == 2 and "max-modules" in proc.stderr


# -- 7. unreadable is not corrupt ----------------------------------------------------------


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_entry_is_unreadable_for_scan_and_prune(seed_cache: Path, copy_of) -> None:
    cache = copy_of(seed_cache)
    entry = sorted(cache.glob("jit_g-*-cache"))[0]
    entry.chmod(0)
    scan = cachedoctor("scan", str(cache))
    assert "unreadable" in scan.stdout and "corrupt" not in scan.stdout, scan.stdout
    prune = cachedoctor("prune", str(cache), "--corrupt")
    assert "not checked" in prune.stdout and "would remove" not in prune.stdout


def test_an_entry_cachedoctor_cannot_read_whole_is_not_called_corrupt(
    seed_cache: Path,
) -> None:
    from cachedoctor.commands.scan import FindingKind, scan_directory

    report = scan_directory(seed_cache, max_decompressed=100, use_index=False)  # too-large
    kinds = {f.kind for f in report.findings}
    assert FindingKind.UNREADABLE in kinds and FindingKind.CORRUPT not in kinds, kinds
    for finding in report.findings:
        if finding.kind is FindingKind.UNREADABLE:
            assert "not checked" in finding.message and "prune" not in finding.advice
