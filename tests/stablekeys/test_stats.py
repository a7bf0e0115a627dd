"""The stats recorder is invisible to the program (issue 28, item 2).

JAX's own ``tests/compilation_cache_test.py::test_cache_misses_metric`` patches
``time.monotonic`` with ten values for two compiles and runs with warnings as errors. JAX is
the oracle: the calls its compiler makes to the program's clock are counted with the hook off,
and the hook in every mode must make exactly as many, and print no Python warning.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hookrun import base_env

# Two compiles under a mocked clock; prints how often JAX (and anything else) called it.
_PROGRAM = r"""
import sys, tempfile
from unittest import mock
import numpy as np
import jax
jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp())
jax.config.update("jax_persistent_cache_min_compile_time_secs", 2)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.jit(lambda x: x)(0)  # compiles what every program needs first, outside the mock
values = np.arange(0, 1000, 10) if sys.argv[1] == "count" else np.arange(0, 100, 10)
with mock.patch("time.monotonic", side_effect=values) as clock:
    jax.jit(lambda x: x + 1)(1)
    jax.jit(lambda x: x + 2)(1)
print("calls", clock.call_count)
"""

MODES = ["stable", "observe", "stats"]


def run(mode: str, how: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    extra = {"CACHEDOCTOR_DISABLE": "1"} if mode == "off" else {"CACHEDOCTOR_HOOK": mode}
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", _PROGRAM, how],
        capture_output=True,
        text=True,
        env=base_env(None, **extra),
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.slow
def test_the_recorder_takes_nothing_from_a_mocked_clock(tmp_path: Path) -> None:
    plain = run("off", "count", tmp_path)
    assert plain.returncode == 0, plain.stderr
    for mode in MODES:
        hooked = run(mode, "count", tmp_path)
        assert hooked.returncode == 0, (mode, hooked.stderr[-3000:])
        assert hooked.stdout.split()[-1] == plain.stdout.split()[-1], (mode, hooked.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_jax_own_test_in_miniature_passes_with_the_hook(tmp_path: Path, mode: str) -> None:
    """Ten clock values for two compiles, warnings as errors: as with the hook off."""
    assert run("off", "ten", tmp_path).returncode == 0
    proc = run(mode, "ten", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cachedoctor:" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_recording_problem_is_one_stderr_line_not_a_warning(tmp_path: Path) -> None:
    """Under ``-W error`` a Python warning is an exception; the recorder's note must not be."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "cachedoctor-stats").write_text("a file where the folder should be")
    code = "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2)(jnp.ones(2)); print('ran')"
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        env=base_env(tmp_path / "cache", CACHEDOCTOR_HOOK="stats"),
        timeout=300,
    )
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr[-3000:]
    said = [x for x in proc.stderr.splitlines() if x.startswith("cachedoctor: stats recording")]
    assert len(said) == 1 and "Warning" not in proc.stderr, proc.stderr


def test_the_record_is_written_whole_without_waiting_on_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's exit does not wait on an fsync for its record (JAX writes its own entries
    without one); the record still appears whole, under its final name only. Other writes
    through ``write_new`` keep their fsync."""
    import os

    from cachedoctor.stablekeys import stats_record
    from cachedoctor.storage.fsops import CacheDir

    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    written = stats_record._write_local(str(tmp_path), "cachedoctor-stats/r.json", b'{"a": 1}')
    assert synced == []
    assert Path(written).read_bytes() == b'{"a": 1}'
    assert os.listdir(tmp_path / "cachedoctor-stats") == ["r.json"]  # no temp file left
    with CacheDir.open(tmp_path) as folder:
        assert folder.write_new("other", b"x")
    assert len(synced) == 1
