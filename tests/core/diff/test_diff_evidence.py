"""``diff`` verdicts rest on evidence (issue 17, item 6).

Two entries written by one process cannot come from two JAX versions, whatever fields their
executables lack; and ``diff --module`` compares every pair it can decode.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from cachedoctor.core.check.runner import program_env, run_command
from cachedoctor.core.diff.compare import diff_details, diff_module
from cachedoctor.core.diff.load import load_detail
from cachedoctor.core.diff.report import VerdictKind
from cachedoctor.storage.location import Location

pytestmark = pytest.mark.slow  # every test here runs JAX or the CLI in a subprocess

ONE_PROCESS = """
import jax, jax.numpy as jnp
x = jnp.arange(6.0)
print("result:", jnp.reshape(x, (2, 3)).sum(), jax.jit(lambda v: jnp.sin(v) * 2)(x).sum())
"""


def test_same_process_entries_are_not_different_jax(tmp_path: Path) -> None:
    script = tmp_path / "one.py"
    script.write_text(ONE_PROCESS)
    cache = tmp_path / "cache"
    cache.mkdir()
    assert run_command([sys.executable, str(script)], program_env(str(cache))).returncode == 0
    paths = sorted(cache.glob("*-cache"))
    details = [load_detail(p) for p in paths]
    at = {id(d): Location.local(os.path.abspath(p)) for d, p in zip(details, paths, strict=True)}
    fields = [{f.number for f in d.executable_fields} for d in details]
    assert any(8 not in f for f in fields) and any(8 in f for f in fields), (
        "the premise: one entry without object files (a trivial module), one with"
    )
    for a in details:
        for b in details:
            verdict = diff_details(a, b, (at[id(a)], at[id(b)])).verdict
            assert verdict.kind is not VerdictKind.DIFFERENT_JAX, verdict
            assert not [s for s in verdict.because if "different JAX" in s], verdict


def test_diff_module_compares_every_pair_it_can(seed_cache: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(seed_cache, cache)
    good = sorted(cache.glob("jit_f-*-cache"))
    assert len(good) >= 2
    bad = cache / ("jit_f-" + "0" * 64 + "-cache")
    bad.write_bytes(b"\x28\xb5\x2f\xfd not really zstd")
    report = diff_module(Location.parse(str(cache)), "jit_f")
    assert len(report.reports) == len(good) - 1
    assert len(report.undecodable) == 1 and report.undecodable[0].startswith(bad.name[:-6])
    assert not report.equivalent  # an entry that cannot be compared is not "equivalent"
