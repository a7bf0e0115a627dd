"""A 2-process ``jax.distributed`` job on CPU sharing one cache, with the hook."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.caches import SUPPORT_DIR
from tests.support.hookrun import _RUNNER, Run, base_env

pytestmark = pytest.mark.slow

PROGRAM = SUPPORT_DIR / "distributed_seed.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(cache: Path) -> list[Run]:
    """Both processes of one job; returns their runs (process 0 first)."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RUNNER, "stable", str(PROGRAM), str(i), port],
            env=base_env(cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]
    runs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        runs.append(Run(proc.returncode, out, err))
    return runs


def _lines(run: Run) -> dict[str, str]:
    return dict(line.split(":", 1) for line in run.stdout.splitlines() if ":" in line)


def test_two_process_job_hits_from_run_two(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _job(cache)
    assert all("jit_custom" in run.misses for run in first)
    for run_number in (2, 3):
        p0, p1 = _job(cache)
        assert _lines(p0)["custom"].strip() == "[1.0, 2.0, 3.0, 4.0]"
        assert _lines(p1)["custom"].strip() == "[5.0, 6.0, 7.0, 8.0]"
        # process 0 (the one JAX lets write) hits by replaying its recorded calls
        assert p0.misses == [], (run_number, p0.stderr[-2000:])
        assert p0.stats["replayed"] == 1
        # JAX hashes a per-process CPU topology into every key and only process 0 writes, so
        # process 1 misses its control module without custom_partitioning as well: the hook
        # does no worse than JAX there
        assert ("jit_custom" in p1.misses) == ("jit_plain" in p1.misses)
