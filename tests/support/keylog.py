"""Run a program with JAX's key module logging at DEBUG: JAX's own digest of each component of
each key it computes ("get_cache_key hash of serialized <component>: <digest>") and, with
``JAX_LOG_COMPILES=1``, which modules hit the persistent cache. The oracle of ``why`` and
``preflight``."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.support.caches import SUPPORT_DIR
from tests.support.hookrun import base_env
from tests.support.sessioncache import SharedBuilds

PROGRAM = SUPPORT_DIR / "why_program.py"
MODULE = "jit_step"
LOGGED = r"""
import logging, runpy, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(message)s")
logging.getLogger("jax._src.cache_key").setLevel(logging.DEBUG)
runpy.run_path(sys.argv[1], run_name="__main__")
"""
_COMPONENT = re.compile(
    r"^jax\._src\.cache_key get_cache_key hash of serialized (.+?): ([0-9a-f]{64})", re.M
)  # our handler's lines (0.8.3 also prints its own)
_HIT = re.compile(r"Persistent compilation cache hit for '([^']+)'")


def run_logged(
    cache: Path | str,
    hook: str | None = "stats",
    python: str = sys.executable,
    program: Path = PROGRAM,
    env: dict[str, str] | None = None,
) -> str:
    """Run ``program`` (``why_program.py``) against ``cache`` with ``env`` added; its stderr."""
    extra = {"JAX_LOG_COMPILES": "1", **(env or {})}
    if hook is not None:
        extra["CACHEDOCTOR_HOOK"] = hook
    proc = subprocess.run(
        [python, "-c", LOGGED, str(program)],
        capture_output=True,
        text=True,
        env=base_env(cache, **extra),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def run_history(
    cache: Path,
    runs: Sequence[dict[str, str]],
    hook: str | None = "stats",
    program: Path = PROGRAM,
    first_python: str = sys.executable,
) -> list[str]:
    """``program`` run into ``cache`` with each of ``runs``' settings in turn (the first by
    ``first_python``); each run's stderr."""
    return [
        run_logged(
            cache,
            hook,
            python=first_python if i == 0 else sys.executable,
            program=program,
            env=settings,
        )
        for i, settings in enumerate(runs)
    ]


def shared_history(
    shared_builds: SharedBuilds,
    runs: Sequence[dict[str, str]],
    *,
    hook: str | None = "stats",
    program: Path = PROGRAM,
    first_python: str = sys.executable,
) -> tuple[Path, list[str]]:
    """``(cache, each run's stderr)``: :func:`run_history` into one fresh cache, built once per
    session for the same runs.

    ``why``'s tests and docs/why.md's examples (preflight's among them) ask about the same
    histories; each test made its own (34 JAX processes for 17 histories). The cache is read,
    never written: a test that runs JAX in it again must make its own."""

    def make(folder: Path) -> list[str]:
        return run_history(folder / "jaxcache", runs, hook, program, first_python)

    parts = (list(runs), hook, str(program), program.read_text(), first_python)
    folder, logs = shared_builds("logged-history", make, *parts)
    return folder / "jaxcache", list(logs)


def logged_keys(stderr: str) -> list[dict[str, str]]:
    """JAX's DEBUG lines: each key it computed, its component digests (the first: jit_step)."""
    keys: list[dict[str, str]] = []
    for name, digest in _COMPONENT.findall(stderr):
        if name == "computation":
            keys.append({})
        keys[-1][name] = digest
    return keys


def hits(stderr: str) -> set[str]:
    """The modules JAX says it found in the persistent cache."""
    return set(_HIT.findall(stderr))


def differing(a: dict[str, str], b: dict[str, str]) -> set[str]:
    return {name for name in a if a[name] != b.get(name)}
