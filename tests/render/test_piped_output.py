"""Piped output (issue 54, "Text"): with stdout a pipe, the real CLI wraps no sentence, path or
key mid-line and ends no line in spaces (rich wrapped every line at 120 columns and padded a
table's last column to the width: a ``grep`` of a path or a message found half of it).

The cache: a jitted function with a long name, written twice with the stats hook under a long
path, then copied to another long path (every entry ``relocated`` there: long findings). The
oracle for what a line must hold whole is the same command's ``--json``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hookrun import base_env

pytestmark = pytest.mark.slow  # JAX in subprocesses

LONG_NAME = "a_function_whose_name_says_at_length_what_it_computes" + "_and_more" * 8
PROGRAM = f"""
import jax, jax.numpy as jnp
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
def f(x):
    return jnp.sin(x) * 2.0
f.__name__ = {LONG_NAME!r}
print(float(jax.jit(f)(jnp.arange(8.0)).sum()))
"""


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the cache, a copy of it at another long path)."""
    deep = "/".join(f"a_folder_with_a_long_name_{n}" for n in range(4))
    root = tmp_path_factory.mktemp("piped")
    cache, copy = root / deep / "cache", root / "copy" / deep / "cache"
    script = root / "program.py"
    script.write_text(PROGRAM)
    for _ in range(2):
        subprocess.run(
            [sys.executable, str(script)],
            env=base_env(cache, CACHEDOCTOR_HOOK="stats"),
            check=True,
            capture_output=True,
            timeout=300,
        )
    shutil.copytree(cache, copy)
    return cache, copy


def piped(*args: str) -> str:
    """``cachedoctor ARGS`` with stdout a pipe, as a shell pipeline or a CI log has it (no
    COLUMNS: the width rich picks off a terminal)."""
    env = {k: v for k, v in base_env(None).items() if k != "COLUMNS"}
    proc = subprocess.run(
        [sys.executable, "-m", "cachedoctor", *args],
        capture_output=True,  # stdout a pipe
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert proc.stdout
    return proc.stdout


AGE = re.compile(r"\d+ (s|minutes|hours|days) ago")  # a plan's ages move between two runs


def assert_whole(text: str, *pieces: str) -> None:
    """No line ends in spaces, and each piece stands whole on one line."""
    lines = text.splitlines()
    padded = [line for line in lines if line != line.rstrip()]
    assert not padded, padded[:3]
    aged = [AGE.sub("<AGE>", line) for line in lines]
    for piece in pieces:
        whole = AGE.sub("<AGE>", piece)
        assert any(whole in line for line in aged), f"{piece!r} is not whole on a line:\n{text}"


def test_scan_findings_and_modules(caches: tuple[Path, Path]) -> None:
    _, copy = caches
    found = json.loads(piped("scan", str(copy), "--json"))
    relocated = [f for f in found["findings"] if f["kind"] == "relocated"]
    assert relocated  # the copy's entries name the first cache's path
    said = [piece for f in found["findings"] for piece in (f["message"], f["advice"])]
    assert_whole(piped("scan", str(copy)), *said, f"jit_{LONG_NAME}")
    assert_whole(piped("lint", str(copy)), *said)


def test_show_prune_and_stats(caches: tuple[Path, Path]) -> None:
    cache, _ = caches
    (entry,) = [p for p in cache.glob(f"jit_{LONG_NAME}-*-cache")]
    assert_whole(piped("show", str(entry)), str(entry))
    plan = json.loads(piped("prune", str(cache), "--max-size", "0", "--json"))
    reasons = [a["reason"] for a in plan["actions"]]
    assert reasons
    assert_whole(piped("prune", str(cache), "--max-size", "0"), str(cache), *reasons)
    assert_whole(piped("stats", str(cache)), f"jit_{LONG_NAME}", str(cache))
