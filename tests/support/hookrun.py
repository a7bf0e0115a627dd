"""Helpers for tests that run JAX programs in fresh interpreters, with or without the hook.

Also the compat helper: :func:`compat_pythons` lists extra interpreters (other JAX versions) from
``CACHEDOCTOR_COMPAT_PYTHONS`` (``os.pathsep``-separated paths); :data:`compat_params` turns them
into pytest parameters, skipping with a reason when the variable is not set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.sessioncache import SharedBuilds

from cachedoctor.programs import program_path

SRC = Path(__file__).resolve().parents[2] / "src"
MISS_RE = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '([^']+)'")
# the key of each hit JAX logs (JAX_LOG_COMPILES=1)
HIT_KEY_RE = re.compile(r"Persistent compilation cache hit for '[^']+' with key '([^']+)'")
STATS_PREFIX = "CACHEDOCTOR-STATS "

# Runs a bundled program with the hook installed explicitly (no .pth needed), then prints the
# hook's counters. argv: mode program
_RUNNER = r"""
import atexit, json, os, runpy, sys
mode, prog = sys.argv[1], sys.argv[2]
if mode != "none":
    from cachedoctor.stablekeys import hook
    ok = hook.install(mode, record_ir=os.environ.get("CACHEDOCTOR_RECORD_IR") == "1")
    if os.environ.get("CACHEDOCTOR_TEST_BREAK_HASHER"):
        import cachedoctor.stablekeys.keys as k
        def boom(*a, **kw):
            raise RuntimeError("simulated hasher failure")
        k.stable_key = boom
    def report():
        print("CACHEDOCTOR-STATS " + json.dumps({**hook.stats(), "installed": ok}))
    atexit.register(report)
sys.argv = [prog, *sys.argv[3:]]
runpy.run_path(prog, run_name="__main__")
"""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def misses(self) -> list[str]:
        """Modules that missed the persistent cache (needs JAX_EXPLAIN_CACHE_MISSES=1)."""
        return MISS_RE.findall(self.stderr + self.stdout)

    @property
    def result(self) -> str:
        return next(line for line in self.stdout.splitlines() if line.startswith("result:"))

    @property
    def stats(self) -> dict[str, Any]:
        """The hook's counters, as JSON (numbers and flags)."""
        for line in self.stdout.splitlines():
            if line.startswith(STATS_PREFIX):
                data: dict[str, Any] = json.loads(line[len(STATS_PREFIX) :])
                return data
        return {}


def base_env(cache_dir: Path | str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDOCTOR_", "JAX_"))}
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_EXPLAIN_CACHE_MISSES"] = "1"
    env["CACHEDOCTOR_CONFIG"] = str(Path(os.devnull).parent / "nonexistent-cachedoctor.toml")
    # as in every test (conftest): the index never goes into a cache, shared ones included
    env["CACHEDOCTOR_INDEX_IN_CACHE"] = os.environ.get("CACHEDOCTOR_INDEX_IN_CACHE", "0")
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    if cache_dir is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    env.update(extra)
    return env


def run_program(
    name: str | Path,
    cache_dir: Path | str | None,
    *,
    mode: str = "stable",
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
) -> Run:
    """Run a bundled program (or a script) in a fresh interpreter; mode: none|stable|observe."""
    prog = str(name) if isinstance(name, Path) else str(program_path(name))
    proc = subprocess.run(
        [python, "-c", _RUNNER, mode, prog],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or base_env(cache_dir),
    )
    run = Run(proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise AssertionError(f"program failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return run


def entries(cache_dir: Path | str, module: str | None = None) -> list[str]:
    """Entry keys (``<module>-<hex>``) in a cache dir or bucket URL, optionally of one module."""
    if isinstance(cache_dir, str):
        from cachedoctor.storage import stores

        try:
            names = [i.name for i in stores.open_store(cache_dir).list() if not i.is_dir]
        except FileNotFoundError:
            names = []
    else:
        names = [p.name for p in cache_dir.glob("*-cache")]
    keys = sorted(n[: -len("-cache")] for n in names if n.endswith("-cache"))
    if module is not None:
        keys = [k for k in keys if k.rsplit("-", 1)[0] == module]
    return keys


NO_COMPAT_PYTHONS = (
    "no compat interpreter: CACHEDOCTOR_COMPAT_PYTHONS is unset and CACHEDOCTOR_OTHER_JAX=0"
    " turned off the test setup's own (tests/support/otherjax.py)"
)


def compat_pythons() -> list[str]:
    """The interpreters named, a relative path made absolute: tests run them from elsewhere."""
    raw = os.environ.get("CACHEDOCTOR_COMPAT_PYTHONS", "")
    return [os.path.abspath(p) if os.sep in p else p for p in raw.split(os.pathsep) if p.strip()]


def compat_params() -> list[object]:
    """pytest params, one per compat interpreter; a single skipped param when none are set."""
    pythons = compat_pythons()
    if not pythons:
        return [
            pytest.param(
                None,
                marks=pytest.mark.skip(reason=NO_COMPAT_PYTHONS),
                id="no-compat-pythons",
            )
        ]
    return [pytest.param(p, id=Path(p).parent.parent.name or p) for p in pythons]


def jax_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import jax; print(jax.__version__)"],
        capture_output=True,
        text=True,
        env=base_env(None),
        check=True,
    )
    return out.stdout.strip()


def run_recorded(cache: Path | str, mode: str, program: str = "seed", **extra: str) -> str:
    """Run a bundled program with the start-up hook in ``mode``; its stderr (JAX's log)."""
    env = base_env(cache, CACHEDOCTOR_HOOK=mode, JAX_LOG_COMPILES="1", **extra)
    proc = subprocess.run(
        [sys.executable, str(program_path(program))],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr + proc.stdout


def recorded_seed_cache(shared_builds: SharedBuilds, name: str = "stats-recorded") -> Path:
    """The seed program run three times with stats recording, built once per test run under
    ``name`` (jit_f never hits: a custom_partitioning pointer in its key)."""

    def make(root: Path) -> None:
        (root / "cache").mkdir()
        for _ in range(3):
            run_recorded(root / "cache", "stats")

    root, _ = shared_builds(name, make)
    return root / "cache"
