"""Run JAX programs in fresh subprocesses against a given cache directory.

Shared by ``demo``, ``check`` and the tests: each run is a new interpreter, as a real job's
restart would be, so nothing is cached in memory between runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cachedoctor.programs import program_path


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def program_env(cache_dir: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a program run: this cache dir, 8 CPU devices, cache every compile."""
    env = dict(os.environ)
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def run_command(argv: Sequence[str], env: Mapping[str, str], timeout: float | None = 600) -> Run:
    start = time.monotonic()
    proc = subprocess.run(
        list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    return Run(tuple(argv), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def run_program(
    name: str,
    cache_dir: str,
    extra_env: Mapping[str, str] | None = None,
    python: str | None = None,
) -> Run:
    """Run a bundled program (``seed``, ``plain``) once in a fresh interpreter."""
    argv = [python or sys.executable, str(program_path(name))]
    return run_command(argv, program_env(cache_dir, extra_env))
